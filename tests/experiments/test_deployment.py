"""The simulated deployment at toy scale on the committed base (it solves tasks, so traffic adds to the bank):
week 0 makes the first champion, each later week ingests the champion's traffic and retrains from it through
the gate; metrics/deployment.json, the plot and the MLflow parent run hold the weeks."""

import json

import pytest

from lopd import layout
from lopd.cli import main
from lopd.config import load_params
from lopd.memory.bank import round_numbers

pytestmark = pytest.mark.slow

TOY = ["collect.n_tasks=32", "bootstrap.eval_dev_tasks=8", "bootstrap.expert_check_tasks=8", "distill.methods=[grpo]", "distill.steps=2",
       "distill.batch_tasks=8", "distill.eval_every=2", "distill.eval_dev_tasks=4", "grpo.group_size=4", "registry.dev_tasks=24",
       "evaluate.n_tasks=4", "evaluate.samples_per_task=1", "rollout.max_new_tokens=48"]


def test_weeks_of_traffic_ingest_and_gated_retrains_from_the_champion(repo, tmp_path, capsys):
    import mlflow

    sets = [x for s in [f"paths.root={tmp_path}", f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db", *TOY] for x in ("--set", s)]
    args = ["deploy-sim", "--params", str(repo / "params.yaml"), "--profile", "demo", *sets]
    assert main([*args, "--weeks", "2", "--tasks-per-week", "5000"]) == 2  # too few fresh train tasks: fails before compute
    assert "raise env.n_train" in capsys.readouterr().err and not (tmp_path / "models").exists()
    assert main([*args, "--weeks", "2", "--tasks-per-week", "12"]) == 0
    p = load_params(repo / "params.yaml", "demo", [f"paths.root={tmp_path}", *TOY])
    out = json.loads(layout.metrics_path(p, "deployment").read_text())
    weeks = out["weeks"]
    assert [w["week"] for w in weeks] == [0, 1, 2]
    for w in weeks:
        assert {"champion_version", "promoted", "dev_success", "dev_success_pretrain", "dev_success_new", "bank_size", "generations",
                "wall_s", "verdict"} <= set(w)
    assert weeks[0]["verdict"] == "first_champion" and weeks[0]["champion_version"] == 1
    assert weeks[0]["generations"] == 32 + 2 * 8 and weeks[1]["generations"] == weeks[2]["generations"] == 12 + 2 * 8
    for w in weeks[1:]:
        assert w["verdict"] in ("promoted", "rejected") and w["gate"]["n"] == 24 and w["traffic_tasks"] == 12
        assert w["champion_version"] == (w["challenger_version"] if w["promoted"] else weeks[w["week"] - 1]["champion_version"])
    # the committed base solves some train tasks: its traffic's successes are banked, one round a week
    assert weeks[2]["bank_size"] >= weeks[1]["bank_size"] > weeks[0]["bank_size"]
    assert round_numbers(layout.bank_dir(p))[:2] == [0, 1]
    rows = [json.loads(x) for x in (tmp_path / "data" / "deployment" / "week-01.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and rows[0]["model"] == "lopd-toolworld/1"
    assert (tmp_path / "metrics" / "plots" / "deployment.png").stat().st_size > 0
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    parent = mlflow.get_run(out["parent_run_id"])
    assert parent.data.tags["pipeline"] == "deployment" and parent.data.metrics["deployment_bank_size"] == weeks[-1]["bank_size"]
    assert "week 2: champion v" in capsys.readouterr().out

    # a re-collect (here after DVC removed the bank, as `dvc repro` does) puts the ingested rounds back
    import shutil

    from lopd.stages import collect

    rounds = round_numbers(layout.bank_dir(p))
    shutil.rmtree(layout.bank_dir(p))
    collect.run(p)
    assert round_numbers(layout.bank_dir(p)) == rounds


def test_the_simulation_seed_reaches_every_stage_but_bootstrap(repo, tmp_path, monkeypatch):
    """``--seed K``: the base stays at params' seed (a committed base matches one seed), the stages after it take K."""
    from lopd.experiments import deployment
    from lopd.ops import registry

    seen = []

    class Stop(Exception):
        pass

    def recorder(name):
        def stage(p):
            seen.append((name, p.seed))
            if name == "collect":
                raise Stop
            return {}
        return stage

    monkeypatch.setattr(deployment, "STAGES", {n: recorder(n) for n in ("bootstrap", "collect")})
    monkeypatch.setattr(registry, "champion", lambda p: None)
    p = load_params(repo / "params.yaml", "demo", [f"paths.root={tmp_path}", f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db"])
    with pytest.raises(Stop):
        deployment.run(p, 1, 1, seed=3)
    assert seen == [("bootstrap", 0), ("collect", 3)]
