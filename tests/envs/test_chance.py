"""The policies that learn nothing, and the chance row they give."""

from __future__ import annotations

import pytest

from lopd.envs.toolworld import FAMILIES, ToolWorldEnv, app_group, make_tasks, parse_action, run_episode
from lopd.envs.toolworld import chance
from lopd.envs.toolworld.families import REGISTRY


def _groups(tasks):
    return {t.task_id: app_group(t.family, t.app, 4) for t in tasks}


@pytest.mark.parametrize("world_seed", range(5))
def test_each_blind_policy_scores_exactly_a_quarter_in_each_group_under_the_conditional_balance(world_seed):
    # 4 families x 8 apps x 5: every app gets the same number of tasks, and each of the 16 rules
    # that read the check and set (format, commit) from it fits exactly one app in four of each
    # group; the policies never slip.
    tasks = make_tasks("test", 160, world_seed=world_seed)
    row = chance.chance_row(tasks, _groups(tasks), max_turns=8, success_threshold=0.8)
    choices = [f"{fmt}_{c}" for fmt in ("literal", "other") for c in ("commit", "nocommit")]
    assert set(row["policies"]) == {"every_tool_once"} | {f"ifcheck_{a}_else_{b}" for a in choices for b in choices}
    for name, r in row["policies"].items():
        assert r["success_rate"] == 0.25 and r["success_by_group"] == {"pretrain": 0.25, "new": 0.25}, name
    assert row["success_rate"] == 0.25 and row["n_tasks"] == 160


def test_a_check_conditioned_rule_switches_its_silent_guesses_once_the_check_is_known():
    fam = REGISTRY["shop"]
    tasks = make_tasks("dev", 64, families=["shop"])
    required = next(t for t in tasks if t.conventions["prereq"] == "required")
    none = next(t for t in tasks if t.conventions["prereq"] == "none")
    rule = chance.chance_policies()["ifcheck_other_nocommit_else_literal_commit"]
    other = next(f for f in fam.formats if f != fam.literal_format)
    assert rule.believed(none, []) == {"prereq": "none", "format": fam.literal_format, "commit": "required"}
    ep = run_episode(ToolWorldEnv(required), rule)
    assert fam.prereq_error in ep["observations"][1]  # its first act met the check's error
    assert rule.believed(required, list(zip(ep["actions"][:2], ep["observations"][:2]))) == {
        "prereq": "required", "format": other, "commit": "auto"}


def test_every_tool_once_calls_each_tool_once_and_the_error_readers_learn_the_check():
    fam = REGISTRY["banking"]
    required = next(t for t in make_tasks("dev", 64, families=["banking"]) if t.conventions["prereq"] == "required")
    none = next(t for t in make_tasks("dev", 64, families=["banking"]) if t.conventions["prereq"] == "none")
    policies = chance.chance_policies()
    for task in (required, none):
        ep = run_episode(ToolWorldEnv(task), policies["every_tool_once"])
        names = [parse_action(a)[0]["name"] for a in ep["actions"][:-1]]
        assert names == [t.name for t in fam.tools] and ep["actions"][-1] == "Done."
    ep = run_episode(ToolWorldEnv(required), policies["ifcheck_literal_nocommit_else_literal_nocommit"])  # guesses "no check" first
    names = [(parse_action(a)[0] or {}).get("name") for a in ep["actions"]]
    assert names[:4] == ["find_payee", "pay", "verify_payee", "pay"]  # the error said to check first
    assert fam.prereq_error in ep["observations"][1]
    ep = run_episode(ToolWorldEnv(none), chance.BlindPolicy("literal", "auto", prereq="required"))
    names = [(parse_action(a)[0] or {}).get("name") for a in ep["actions"]]
    assert names[:3] == ["find_payee", "verify_payee", "pay"] and "not available here" in ep["observations"][1]


def test_a_guess_that_fits_the_app_succeeds_and_one_that_does_not_fails():
    for family in FAMILIES:
        fam = REGISTRY[family]
        task = make_tasks("dev", 8, families=[family])[0]
        fmt = "literal" if task.conventions["format"] == fam.literal_format else "other"
        right = chance.BlindPolicy(fmt, task.conventions["commit"])
        wrong = chance.BlindPolicy("other" if fmt == "literal" else "literal", task.conventions["commit"])
        assert run_episode(ToolWorldEnv(task), right)["success"] is True
        ep = run_episode(ToolWorldEnv(task), wrong)
        assert ep["success"] is False and ep["reward"] == 0.75  # only the value is wrong


def test_the_chance_row_takes_the_best_policy_figure_by_figure(monkeypatch):
    tasks = make_tasks("test", 8, families=["shop"])
    groups = _groups(tasks)
    pre = [t.task_id for t in tasks if groups[t.task_id] == "pretrain"]
    wins = {"a": lambda t: t.task_id in pre, "b": lambda t: t.task_id not in pre, "c": lambda t: t.task_id == pre[0]}
    monkeypatch.setattr(chance, "play_blind", lambda tasks, *a: {
        n: [{"success": f(t), "reward": 0.5 + 0.1 * (n == "c")} for t in tasks] for n, f in wins.items()})
    row = chance.chance_row(tasks, groups, 8, 0.8)
    assert row["success_by_group"] == {"pretrain": 1.0, "new": 1.0}
    assert row["best"] == {"success_rate": "a", "mean_reward": "c", "success_by_group.pretrain": "a", "success_by_group.new": "b"}
    assert row["success_rate"] == pytest.approx(len(pre) / 8) and row["mean_reward"] == pytest.approx(0.6)
