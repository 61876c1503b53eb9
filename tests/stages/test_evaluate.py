"""`lopd evaluate` (issue #5): intervals and behaviour statistics against hand-computed values, and the
distill → evaluate stages end to end with a real MLflow store (tiny models, CPU)."""

from __future__ import annotations

import json

import pytest

from lopd import layout
from lopd.policy.rollout import Trajectory
from lopd.stages import distill, evaluate
from lopd.stages.evaluate import behaviour, call_key, first_response_tokens, paired_diff, summarize, t_interval, wilson_interval

CALL = '<tool_call>{{"name": "{n}", "arguments": {a}}}</tool_call>'


def traj(task_id: str, actions: list[str], mask: list[int], reward: float, family: str = "shop") -> Trajectory:
    return Trajectory(f"r-{task_id}", task_id, family, 0, list(range(len(mask))), mask, [0.0] * len(mask), 2, actions,
                      [], [], reward, reward >= 0.8)


# ----------------------------------------------------------------------------- intervals


def test_wilson_interval_matches_the_textbook_values():
    lo, hi = wilson_interval(8, 10, 0.95)  # z = 1.959964: centre 0.71673, half-width 0.22658
    assert (lo, hi) == pytest.approx((0.49016, 0.94331), abs=1e-5)
    assert wilson_interval(0, 10, 0.95)[0] == 0.0 and wilson_interval(10, 10, 0.95)[1] == 1.0
    assert wilson_interval(0, 0, 0.95) == (0.0, 1.0)
    narrow, wide = wilson_interval(8, 10, 0.5), wilson_interval(8, 10, 0.99)
    assert wide[0] < lo < narrow[0] and narrow[1] < hi < wide[1]


def test_t_interval_by_hand():
    mean, lo, hi = t_interval([0.0, 0.5, 1.0], 0.95)  # sd 0.5, t(0.975, df=2) = 4.302653
    half = 4.302653 * 0.5 / 3**0.5
    assert mean == 0.5 and (lo, hi) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-6)
    assert t_interval([0.3], 0.95) == (0.3, None, None)
    assert t_interval([0.0, 0.5, 1.0], 0.95, bounds=(0.0, 1.0)) == (0.5, 0.0, 1.0)  # cut to the reward range


# ----------------------------------------------------------------------------- behaviour


def test_behaviour_statistics_by_hand():
    find = CALL.format(n="find", a='{"q": 1, "r": 2}')
    find_respaced = '<tool_call>{"name":"find","arguments":{"r":2,"q":1}}</tool_call>'  # same call, other spelling
    other = CALL.format(n="get", a="{}")
    two_calls = find + other  # two calls in one turn (an error in ToolWorld, counted as 2 calls)
    a = traj("t1", [find, find_respaced, other, "done"], [0, 0, 1, 1, 1, 0, 1, 1, 0, 1, 0, 1], 1.0)
    b = traj("t2", [two_calls, "<tool_call>oops", "<tool_call>oops"], [0, 1, 1, 1, 1, 1, 0, 1, 0, 1], 0.0)
    assert call_key(find) == call_key(find_respaced) != call_key(other) and call_key("done") is None
    assert first_response_tokens(a.action_mask) == 3 and first_response_tokens(b.action_mask) == 5
    stats = behaviour([a, b])
    # calls: a 3 (+ a final answer), b 2 + 1 + 1 = 4; turns 4 + 3
    assert stats["tool_calls_per_turn"] == pytest.approx(7 / 7)
    assert stats["turns"] == pytest.approx(3.5)
    assert stats["first_response_tokens"] == pytest.approx(4.0)
    # a: find repeated once (other spelling); b: the identical malformed "<tool_call>oops" once
    assert stats["repeated_calls"] == pytest.approx(1.0)


def test_summary_uses_wilson_for_success_and_per_task_means_for_reward():
    eps = [traj("t1", ["x"], [0, 1], 1.0), traj("t1", ["x"], [0, 1], 0.5), traj("t2", ["x"], [0, 1], 0.0),
           traj("t2", ["x"], [0, 1], 0.0, family="bank"), traj("t3", ["x"], [0, 1], 1.0)]
    s = summarize(eps, 0.9)
    assert s["success_rate"] == pytest.approx(2 / 5) and s["success_ci"] == pytest.approx(list(wilson_interval(2, 5, 0.9)))
    # per-task means 0.75, 0.0, 1.0 (not the episode mean 0.5)
    assert s["mean_reward"] == pytest.approx(1.75 / 3)
    lo, hi = t_interval([0.75, 0.0, 1.0], 0.9)[1:]
    assert s["reward_ci"] == pytest.approx([max(0.0, lo), min(1.0, hi)])  # cut to the reward range
    assert (s["n_episodes"], s["n_tasks"]) == (5, 3) and s["success_by_family"] == {"bank": 0.0, "shop": 0.5}
    ref = [traj("t1", ["x"], [0, 1], 0.25), traj("t2", ["x"], [0, 1], 0.0), traj("t3", ["x"], [0, 1], 0.0)]
    d = paired_diff(eps, ref, 0.9)
    lo, hi = t_interval([0.5, 0.0, 1.0], 0.9)[1:]
    assert d["mean"] == pytest.approx((0.5 + 0.0 + 1.0) / 3) and d["ci"] == pytest.approx([max(-1.0, lo), min(1.0, hi)])
    table = evaluate.markdown_table({"vanilla": s, "lopd": {**s, "reward_diff_vs_vanilla": d}})
    assert table.count("\n") == 4 and "| lopd | 0.400 |" in table and "90% CI" in table


def test_failed_checks_say_which_checklist_item_failed_per_app_group():
    def ep(task_id, reward, checks):
        t = traj(task_id, ["x"], [0, 1], reward)
        t.checks = checks
        return t

    ok = {"entity": True, "value": True, "committed": True, "single": True}
    eps = [ep("a", 1.0, ok),                                   # pretrain, success: not counted
           ep("a", 0.75, {**ok, "value": False}),              # pretrain: the format
           ep("b", 0.5, {**ok, "value": False, "committed": False}),  # new: format and commit
           ep("b", 0.75, {**ok, "committed": False}),          # new: commit
           ep("c", 0.0, dict.fromkeys(ok, False))]             # new: nothing recorded
    s = summarize(eps, 0.95, {"a": "pretrain", "b": "new", "c": "new"})
    fc = s["failed_checks_by_group"]
    assert fc["pretrain"] == {"n_failed": 1.0, "committed": 0.0, "entity": 0.0, "single": 0.0, "value": 1.0}
    assert fc["new"] == {"n_failed": 3.0, "committed": 1.0, "entity": pytest.approx(1 / 3), "single": pytest.approx(1 / 3),
                         "value": pytest.approx(2 / 3)}
    table = evaluate.markdown_table({"lopd": s})
    assert "| lopd | new | 3 | 1.000 | 0.333 | 0.333 | 0.667 |" in table


# ----------------------------------------------------------------------------- the stages, end to end


def test_missing_students_are_named_before_any_rollout(repo, tmp_path):
    from lopd.config import load_params

    p = load_params(repo / "params.yaml", "smoke", [f"paths.root={tmp_path}", "distill.methods=[lopd,grpo]"])
    with pytest.raises(FileNotFoundError, match=r"no student for vanilla .*models/base.*, lopd .*models/student.*, grpo .*students/grpo"):
        evaluate.run(p)


@pytest.mark.slow
def test_distill_then_evaluate_with_mlflow(tmp_path, monkeypatch):
    import mlflow

    import lopd.memory.embed
    import lopd.policy.engine
    from lopd.ops.tracking import tracking_uri
    from tests.train.test_distill import FakeEmbedder, build_project

    monkeypatch.setattr(lopd.memory.embed, "make_embedder", lambda p, device=None: FakeEmbedder())
    p = build_project(tmp_path, "distill.methods=[lopd,grpo,sft]")
    out = distill.run(p)
    assert out["lopd"]["rollouts"] == out["grpo"]["rollouts"] == out["sft"]["rollouts"] == 8

    splits = []
    real_split = lopd.policy.engine.split_tasks
    monkeypatch.setattr(lopd.policy.engine, "split_tasks", lambda p, split, n=None: splits.append(split) or real_split(p, split, n))
    res = evaluate.run(p)
    assert splits == ["test"]  # the test split, and only it
    assert list(res) == ["vanilla", "lopd", "grpo", "sft", "chance"]
    chance = res.pop("chance")  # the policies that learn nothing, on the same test tasks
    assert chance["n_tasks"] == p.evaluate.n_tasks and set(chance["policies"]) >= {"every_tool_once", "ifcheck_literal_nocommit_else_literal_nocommit"}
    assert chance["success_rate"] == max(r["success_rate"] for r in chance["policies"].values())
    n = p.evaluate.n_tasks * p.evaluate.samples_per_task
    for m, r in res.items():
        assert r["n_episodes"] == n and 0 <= r["success_ci"][0] <= r["success_rate"] <= r["success_ci"][1] <= 1
        assert {"mean_reward", "reward_ci", "tool_calls_per_turn", "turns", "first_response_tokens", "repeated_calls"} <= set(r)
        assert ("reward_diff_vs_vanilla" in r) == (m != "vanilla")
    assert json.loads(layout.metrics_path(p, "evaluate").read_text()) == json.loads(json.dumps({**res, "chance": chance}))
    md = layout.metrics_path(p, "evaluate").with_suffix(".md").read_text()
    results_table, errors = md.split("\n\n", 1)
    assert results_table.count("\n") == 2 + 1 + 4 - 1  # header, rule, the chance row, one row per method
    assert results_table.splitlines()[2].startswith(f"| chance | {chance['success_rate']:.3f} | — |")
    assert "chance: for each figure, the best of the policies that learn nothing" in errors
    rows = [line for line in errors.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert len(rows) == 4 * 2  # where the errors are: each method × {pre-training, new} apps
    for m, r in res.items():
        assert {"n_failed", "entity", "value", "committed", "single"} <= set(r["failed_checks_by_group"]["new"]) or \
            r["failed_checks_by_group"]["new"] == {"n_failed": 0.0}

    mlflow.set_tracking_uri(tracking_uri(p))
    runs = {r.info.run_name: r for r in mlflow.search_runs(experiment_names=["lopd"], output_format="list")}
    assert {"distill-lopd-seed0", "distill-grpo-seed0", "distill-sft-seed0", "distill-summary-seed0", "evaluate-seed0"} <= set(runs)
    lopd_run = runs["distill-lopd-seed0"]
    assert {"kl", "delta", "beta", "margin_violation", "anchor", "reward_mean", "success_rate", "rollouts_cum",
            "tokens_per_s", "dev_reward"} <= set(lopd_run.data.metrics)
    assert {"loss", "clip_frac", "reward_mean", "success_rate", "rollouts_cum"} <= set(runs["distill-grpo-seed0"].data.metrics)
    client = mlflow.MlflowClient()
    dev = client.get_metric_history(lopd_run.info.run_id, "dev_reward")
    assert [m.step for m in dev] == [0, 4, 8]  # dev reward against generations spent
    arts = [a.path for a in client.list_artifacts(runs["distill-summary-seed0"].info.run_id, "plots")]
    assert {"plots/dev_reward_vs_rollouts.png", "plots/lopd_beta_delta.png"} <= set(arts)
    assert "vanilla_success_rate" in runs["evaluate-seed0"].data.metrics
