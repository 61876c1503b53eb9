"""`lopd promote` end to end on the committed base (it solves about half the dev tasks, so a broken student
is measurably worse): the first student becomes the champion; one trained with a learning rate that
breaks it is rejected with its figures while the champion keeps serving; a rollback moves the alias by
hand; a version loaded by ``models:/<name>@champion`` plays the same seeded rollouts as its directory."""

import json
import shutil

import pytest

from lopd import layout
from lopd.cli import main
from lopd.config import load_params
from lopd.ops import registry
from lopd.policy import base_asset
from lopd.stages import distill, promote

pytestmark = pytest.mark.slow

# The demo profile (the committed base's recipe) at toy scale: 2 GRPO steps of 8 tasks in groups of 4 (smaller groups all tie
# on the conditionally balanced world and GRPO would not move), the gate on 48 dev tasks.
SMALL = ["distill.methods=[grpo]", "distill.steps=2", "distill.batch_tasks=8", "distill.eval_every=2", "distill.eval_dev_tasks=16",
         "grpo.group_size=4", "registry.dev_tasks=48", "rollout.max_new_tokens=48", "evaluate.n_tasks=4"]


def _params(repo, root, *extra):
    return load_params(repo / "params.yaml", "demo", [f"paths.root={root}", f"tracking.tracking_uri=sqlite:///{root}/mlflow.db", *SMALL, *extra])


@pytest.fixture(scope="module")
def gated(tmp_path_factory, request):
    """A first champion (GRPO at a sane rate), then a challenger trained at lr 10 (broken), both through the gate."""
    repo, root = request.config.rootpath, tmp_path_factory.mktemp("promote")
    good = _params(repo, root)
    base_asset.install(good, layout.base_model_dir(good))
    distill.run(good)
    # the committed metrics/promotion.json is in every clone, with make run's history of another registry: a fresh
    # registry's first decision starts its own history (test_a_broken_challenger... reads exactly two entries)
    stale = layout.metrics_path(good, "promotion")
    stale.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(repo / "metrics" / "promotion.json", stale)
    assert json.loads(stale.read_text())["history"] and json.loads(stale.read_text())["model"] == registry.model_name(good)
    first = promote.run(good)
    shutil.copytree(layout.student_dir(good, "grpo"), root / "first-student")
    broken = _params(repo, root, "grpo.lr=10.0")
    distill.run(broken)
    second = promote.run(broken)
    return good, first, second, root


def test_the_first_student_becomes_the_champion_with_its_lineage(gated):
    p, first, _, _ = gated
    assert first["verdict"] == "first_champion" and first["promoted"] and first["champion_after"] == 1
    mv = registry.champion(p)
    assert int(mv.version) == 1 and mv.aliases == ["champion"]
    tags = mv.tags
    for key in ("training_run_id", "promote_run_id", "git_commit", "params_hash", "bank_dvc_hash", "bank_rounds", "env", "world_seed",
                "base_checkpoint_sha", "method", "seed", "dev_success", "dev_success_ci", "dev_success_pretrain", "dev_success_new",
                "checkpoint_sha", "gate.verdict"):
        assert key in tags, key
    assert tags["method"] == "grpo" and tags["env"] == "toolworld" and tags["init"] == "base"
    assert tags["dev_tasks"] == "16" and tags["dev_source"] == "distill"  # distill's last dev evaluation
    assert tags["base_checkpoint_sha"] == registry.checkpoint_sha(layout.base_model_dir(p))
    assert tags["training_run_id"] != "unknown" and tags["gate.verdict"] == "first_champion"
    assert first["challenger"]["dev_tasks"] == 48 and first["challenger"]["dev_success"] > 0.2  # the gate's tasks: a regression can show
    assert "first" in mv.description


def test_a_broken_challenger_is_rejected_with_its_figures_and_the_champion_keeps_serving(gated, capsys):
    p, first, second, root = gated
    assert second["verdict"] == "rejected" and not second["promoted"]
    assert second["challenger"]["version"] == 2 and second["champion_before"] == second["champion_after"] == 1
    o = second["figures"]["overall"]
    assert o["n"] == 48 and o["diff"] < 0 and o["ci_high"] < 0 and o["challenger"] < o["champion"]
    assert o["champion"] == pytest.approx(first["challenger"]["dev_success"])  # the same tasks, the same seed
    assert second["reason"].startswith("rejected: dev success")
    assert int(registry.champion(p).version) == 1
    assert registry.checkpoint_sha(layout.champion_dir(p)) == registry.checkpoint_sha(root / "first-student")  # still serving v1
    v2 = registry.get_version(p, 2)
    assert v2.tags["gate.verdict"] == "rejected" and float(v2.tags["gate.diff"]) == pytest.approx(o["diff"], abs=1e-4)
    assert "rejected" in v2.description
    rec = json.loads(layout.metrics_path(p, "promotion").read_text())
    assert rec["champion_version"] == 1 and [h["verdict"] for h in rec["history"]] == ["first_champion", "rejected"]
    assert rec["decision"]["figures"]["overall"]["b"] == o["b"]


def test_rollback_by_hand_moves_the_alias_and_is_recorded(gated, repo, capsys):
    p, _, _, root = gated
    args = ["promote", "--params", str(repo / "params.yaml"), "--profile", "demo", "--set", f"paths.root={root}",
            "--set", f"tracking.tracking_uri=sqlite:///{root}/mlflow.db"]
    assert main([*args, "--version", "2"]) == 2  # a reason is required
    assert main([*args, "--version", "7", "--reason", "typo"]) == 1
    assert "has no version 7 (versions: [1, 2])" in capsys.readouterr().err
    assert main([*args, "--version", "2", "--reason", "try the new one"]) == 0
    assert int(registry.champion(p).version) == 2
    assert main([*args, "--version", "1", "--reason", "v2 fails in production"]) == 0
    out = capsys.readouterr().out
    assert "moved by hand: v2 fails in production -> champion v1" in out
    assert int(registry.champion(p).version) == 1
    assert registry.checkpoint_sha(layout.champion_dir(p)) == registry.get_version(p, 1).tags["checkpoint_sha"]
    rec = json.loads(layout.metrics_path(p, "promotion").read_text())
    assert [h["verdict"] for h in rec["history"]][-2:] == ["manual", "manual"]
    assert rec["decision"]["champion_before"] == 2 and rec["champion_version"] == 1
    assert registry.get_version(p, 1).tags["gate.reason"] == "moved by hand: v2 fails in production"


def test_a_version_loaded_by_alias_plays_as_its_directory(gated):
    import mlflow

    from lopd.policy.engine import make_engine, split_tasks
    from lopd.policy.modeling import load_policy

    p, _, _, root = gated
    registry.set_champion(p, 1)
    loaded = mlflow.pyfunc.load_model(f"models:/{registry.model_name(p)}@champion").unwrap_python_model()
    tasks = split_tasks(p, "dev", 6)

    def play(model, tok):
        trajs = make_engine(p, model, tok).run(tasks, 2, seed=123, progress=False)
        return [(t.token_ids, t.reward, t.success) for t in trajs]

    assert play(*loaded.policy()) == play(*load_policy(root / "first-student"))


def test_distill_from_the_champion_starts_from_its_weights(gated, repo):
    """distill.init=champion: the student starts from the champion's weights (here the broken v2, made champion by
    hand): its weights, and the dev curve that starts at the champion's success (0: it is broken)."""
    import torch

    from lopd.policy.modeling import load_policy

    p, first, _, root = gated
    registry.set_champion(p, 2)
    from_champion = _params(repo, root, "distill.init=champion", "grpo.lr=1e-12", "distill.steps=1", "distill.eval_every=1")
    out = distill.run(from_champion)
    start = out["details"]["grpo"]["curve"][0]
    assert start["rollouts_cum"] == 0 and start["dev_success"] == 0.0  # the broken champion, not the base (which solves some)
    student, _ = load_policy(layout.student_dir(p, "grpo"))
    champion, _ = load_policy(layout.champion_dir(p))
    base, _ = load_policy(layout.base_model_dir(p))
    s, c, b = (torch.cat([w.flatten() for w in m.parameters()]) for m in (student, champion, base))
    assert (s - c).abs().max() < 1e-6 < (s - b).abs().max()
    assert json.loads((layout.champion_dir(p) / registry.MARKER).read_text())["version"] == 2
    registry.set_champion(p, 1)
    assert first["challenger"]["dev_success"] > 0  # the base-trained champion does solve dev tasks


def test_a_challenger_method_not_trained_fails_before_any_rollout(gated, repo):
    from lopd.config import ParamsError

    _, _, _, root = gated
    with pytest.raises(ParamsError, match="registry.challenger = lopd is not trained in this run"):
        promote.run(_params(repo, root, "registry.challenger=lopd"))
