"""Every stage end to end at the smoke profile (bootstrap → … → evaluate), into a temporary project root."""

import json

import pandas as pd
import pytest

from lopd import layout
from lopd.cli import main
from lopd.config import load_params
from lopd.memory.bank import BANK_COLUMNS, EXPERT_MODEL
from lopd.ops.validation import DataValidationError
from lopd.stages import collect

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("smoke")
    repo = request.config.rootpath
    args = ["--params", str(repo / "params.yaml"), "--profile", "smoke", "--set", f"paths.root={root}"]
    assert main(["-q", "run", *args]) == 0
    return load_params(repo / "params.yaml", "smoke", [f"paths.root={root}"])


def test_bootstrap_outputs_a_loadable_hf_checkpoint_and_metrics(smoke):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = layout.base_model_dir(smoke)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert "<|LATENT_PH|>" in tok.get_vocab() and tok.chat_template
    assert len(tok("<tool_call>", add_special_tokens=False)["input_ids"]) == 1
    m = json.loads(layout.metrics_path(smoke, "bootstrap").read_text())
    assert {"params", "expert_success_rate", "dev_success_rate", "dev_success_by_group"} <= set(m)
    assert set(m["dev_success_by_group"]) == {"pretrain", "new"} and m["base_source"] == "train"
    assert m["model_path"] == "models/base"  # relative to paths.root: no machine path in metrics
    assert m["demos_same_app"] + m["demos_fresh_app"] > 0 and m["pretrain_steps"] > 0
    assert m["expert_success_rate"] >= 0.99
    acc = m["dev_action_accuracy"]  # every dev expert episode has a first action; all values are shares
    assert {"all", "a0"} <= set(acc) and all(0.0 <= v <= 1.0 for v in acc.values())
    assert m["params"]["distill.margin"] == smoke.distill.margin and m["n_params"] == sum(p.numel() for p in model.parameters())


def test_collect_writes_validated_rollouts_bank_and_metrics(smoke):
    df = pd.read_parquet(layout.rollouts_dir(smoke) / collect.ROLLOUTS_FILE)
    assert len(df) == smoke.collect.n_tasks * smoke.collect.samples_per_task
    assert df["rollout_id"].is_unique and set(df["split"]) == {"train"}
    row = df.iloc[0]
    assert len(row["token_ids"]) == len(row["action_mask"]) == len(row["logprobs"]) == row["n_tokens"]
    assert sum(row["action_mask"]) == row["n_gen_tokens"] > 0
    bank = pd.concat([pd.read_parquet(f) for f in layout.bank_dir(smoke).glob("*.parquet")])
    assert list(bank.columns) == list(BANK_COLUMNS)
    assert int((bank["model"] != EXPERT_MODEL).sum()) == int(df["success"].sum())
    assert len(bank) >= smoke.bank.expert_top_up  # smoke tops the bank up with scripted-expert successes
    m = json.loads(layout.metrics_path(smoke, "collect").read_text())
    assert {"n_rollouts", "success_rate", "mean_reward", "n_bank", "gen_tokens_per_s"} <= set(m)
    assert m["n_rollouts"] == len(df) and m["n_bank"] == len(bank) and m["gen_tokens_per_s"] > 0
    assert m["mean_reward"] == pytest.approx(df["reward"].mean())


def test_each_stage_is_an_mlflow_run_with_params_and_metrics(smoke):
    import mlflow

    from lopd.ops.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri(smoke))
    runs = mlflow.search_runs(experiment_names=["lopd"], output_format="list")
    by_stage = {r.data.tags["stage"]: r for r in runs}
    assert set(by_stage) >= {"bootstrap", "collect", "index", "privilege", "cold_start", "distill", "evaluate"}
    assert "success_retrieved_text" in by_stage["privilege"].data.metrics
    assert "cold_start_nll" in by_stage["cold_start"].data.metrics
    assert "family_precision_at_3" in by_stage["index"].data.metrics
    assert by_stage["collect"].data.params["distill.margin"] == str(smoke.distill.margin)
    assert "success_rate" in by_stage["collect"].data.metrics
    assert by_stage["bootstrap"].data.tags["params_hash"] == smoke.digest()
    assert str(tracking_uri(smoke)).startswith(f"sqlite:///{smoke.root()}")


def test_lopd_run_is_one_parent_run_with_every_stage_nested(smoke):
    import re

    import mlflow

    from lopd.ops.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, tracking_uri

    mlflow.set_tracking_uri(tracking_uri(smoke))
    runs = mlflow.search_runs(experiment_names=["lopd"], output_format="list")
    (parent,) = [r for r in runs if r.data.tags["stage"] == "pipeline"]
    assert re.fullmatch(r"run-smoke-seed0-\d{8}-\d{6}", parent.info.run_name) and parent.info.status == "FINISHED"
    assert parent.data.params["distill.margin"] == str(smoke.distill.margin)
    # the stage runs of that `lopd run` (later tests run single stages, outside any pipeline)
    stages = [r for r in runs if r is not parent and parent.info.start_time <= r.info.start_time <= parent.info.end_time]
    assert {r.data.tags["stage"] for r in stages} >= {"bootstrap", "collect", "index", "privilege", "cold_start", "distill", "evaluate"}
    assert all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id for r in stages)
    # the experiment opens on the model-training view, not the GenAI one
    assert mlflow.get_experiment_by_name("lopd").tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"


def test_failed_validation_writes_nothing_and_keeps_previous_data(smoke, monkeypatch):
    before = {p: p.read_bytes() for d in (layout.rollouts_dir(smoke), layout.bank_dir(smoke)) for p in d.iterdir()}

    def broken_frame(*a, **k):
        df = real_frame(*a, **k)
        df.loc[0, "reward"] = 1.5
        return df

    real_frame = collect.rollouts_frame
    monkeypatch.setattr(collect, "rollouts_frame", broken_frame)
    with pytest.raises(DataValidationError, match=r"expect_column_values_to_be_between\(reward\) failed on 1 of"):
        collect.run(smoke)
    after = {p: p.read_bytes() for d in (layout.rollouts_dir(smoke), layout.bank_dir(smoke)) for p in d.iterdir()}
    assert after == before
    assert not [p for p in layout.data_dir(smoke).iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_index_writes_a_loadable_index_and_metrics(smoke):
    from lopd.memory.retrieval import open_retriever

    m = json.loads(layout.metrics_path(smoke, "index").read_text())
    assert {"n_entries", "dim", "build_s", "query_ms_p50", "family_precision_at_3", "app_precision_at_3",
            "app_precision_at_3_unscoped"} <= set(m)
    assert m["app_precision_at_3"] >= m["app_precision_at_3_unscoped"]  # the scope only moves same-app entries up
    assert m["dim"] == 384 and m["n_dev_queries"] == smoke.env.n_dev
    r = open_retriever(smoke)
    assert r.index.ntotal == m["n_entries"]
    task = r.meta.iloc[0]
    hits = r.retrieve({"task_id": task["task_id"], "text": task["task_text"]})
    assert len(hits) == smoke.retrieval.n_ret and task["task_id"] not in {h["task_id"] for h in hits}


def test_privilege_measures_every_context_before_any_latent(smoke):
    from lopd.policy.token_kinds import KINDS
    from lopd.stages.privilege import CONTEXTS

    m = json.loads(layout.metrics_path(smoke, "privilege").read_text())
    assert list(m["success"]) == list(m["nll"]) == list(CONTEXTS)
    assert all(0.0 <= v <= 1.0 for v in m["success"].values()) and all(v > 0 for v in m["nll"].values())
    assert all(set(m["nll_by_kind"][c]) == set(KINDS) for c in CONTEXTS)
    assert m["nll_tokens"]["all"] == sum(m["nll_tokens"][k] for k in KINDS) > 0
    assert set(m["success_by_group"]["none"]) == {"pretrain", "new"}
    assert m["n_nll_trajectories"] == m["n_dev_tasks"] == smoke.privilege.dev_tasks  # the scripted expert solves every dev task


def test_cold_start_saves_the_composer_and_privilege_metrics(smoke):
    m = json.loads(layout.metrics_path(smoke, "cold_start").read_text())
    for key in ("nll_no_latents", "nll_random_latents", "nll_retrieved_latents", "delta_mean"):
        assert key in m
    assert m["n_latents"] == smoke.retrieval.n_ret * smoke.composer.num_latents
    assert set(m["step_ms"]) == {"encoder", "resampler", "teacher_forward", "backward"}
    composer = layout.composer_dir(smoke)
    assert (composer / "resampler.safetensors").exists() and (composer / "encoder" / "adapter_model.safetensors").exists()


def test_distill_and_evaluate_write_their_comparisons(smoke):
    from transformers import AutoModelForCausalLM

    d = json.loads(layout.metrics_path(smoke, "distill").read_text())
    assert set(smoke.distill.methods) <= set(d) and "rollouts_to_grpo_final" in d
    e = json.loads(layout.metrics_path(smoke, "evaluate").read_text())
    assert {"success_rate", "mean_reward", "tool_calls_per_turn", "turns", "first_response_tokens", "repeated_calls"} <= set(e["lopd"])
    assert set(e["lopd"]["success_by_group"]) == {"pretrain", "new"}
    assert {"final_dev_success_pretrain", "final_dev_success_new"} <= set(d["lopd"])
    student = AutoModelForCausalLM.from_pretrained(layout.models_dir(smoke) / "student")
    base = AutoModelForCausalLM.from_pretrained(layout.base_model_dir(smoke))
    assert student.config.to_dict() | {"_name_or_path": ""} == base.config.to_dict() | {"_name_or_path": ""}
    assert sum(p.numel() for p in student.parameters()) == sum(p.numel() for p in base.parameters())


def test_evaluate_ends_by_printing_the_test_table(smoke, capsys, request):
    args = ["--params", str(request.config.rootpath / "params.yaml"), "--profile", "smoke", "--set", f"paths.root={smoke.root()}"]
    assert main(["-q", "evaluate", *args]) == 0  # `lopd run` ends the same way, with its evaluate stage
    out = capsys.readouterr().out
    table = layout.metrics_path(smoke, "evaluate").with_suffix(".md").read_text()
    assert table.startswith("| method |") and table in out and out.rstrip().endswith("browse every run with `make ui`)")
