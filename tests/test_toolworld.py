"""ToolWorld: task splits, the environment protocol, checklist rewards and the experts."""

from __future__ import annotations

import json

import pytest

from lopd.envs.toolworld import (FAMILIES, NoisyExpert, ScriptedExpert, StepResult, ToolWorldEnv,
                                 format_tool_call, make_tasks, parse_action, run_episode)
from lopd.envs.toolworld.families import REGISTRY
from lopd.envs.toolworld.tasks import content_signature

SPLITS = ("train", "dev", "test")


def success_rate(tasks, agent) -> float:
    return sum(run_episode(ToolWorldEnv(t), agent)["success"] for t in tasks) / len(tasks)


def transfer_task():
    return next(t for t in make_tasks("dev", 40, families=["banking"]) if t.goal["kind"] == "transfer")


@pytest.mark.parametrize("split", SPLITS)
def test_expert_solves_every_split(split):
    assert success_rate(make_tasks(split, 200), ScriptedExpert()) >= 0.99


def test_splits_are_disjoint_by_id_and_content():
    tasks = {s: make_tasks(s, 400) for s in SPLITS}
    for a, b in [("train", "dev"), ("train", "test"), ("dev", "test")]:
        assert not {t.task_id for t in tasks[a]} & {t.task_id for t in tasks[b]}
        assert not ({content_signature(t.family, t.goal) for t in tasks[a]}
                    & {content_signature(t.family, t.goal) for t in tasks[b]})
    assert all(t.split == s for s, ts in tasks.items() for t in ts)


def test_make_tasks_is_deterministic_prefix_stable_and_round_robin():
    assert make_tasks("train", 50, seed=3) == make_tasks("train", 50, seed=3)
    assert make_tasks("train", 120, seed=3)[:50] == make_tasks("train", 50, seed=3)
    assert make_tasks("train", 50, seed=3) != make_tasks("train", 50, seed=4)
    assert [t.family for t in make_tasks("dev", 8)] == FAMILIES * 2
    assert {t.family for t in make_tasks("dev", 6, families=["shop"])} == {"shop"}
    assert make_tasks("dev", 1)[0].task_id == "bank-dev-00000"
    json.dumps([t.goal for t in make_tasks("test", 40)])
    with pytest.raises(ValueError):
        make_tasks("valid", 3)


def test_each_family_has_three_to_six_tools_and_a_short_prompt():
    assert len(FAMILIES) >= 4
    for task in make_tasks("dev", len(FAMILIES)):
        assert 3 <= len(REGISTRY[task.family].tools) <= 6
        env = ToolWorldEnv(task)
        messages = env.initial_observation()
        assert [m["role"] for m in messages] == ["system", "user"]
        assert messages[1]["content"] == task.text and len(task.text.split()) <= 30
        assert all(t.name in messages[0]["content"] for t in REGISTRY[task.family].tools)


def test_parse_and_format_round_trip():
    text = format_tool_call("get_balance", {"account_id": "acc_1234"})
    assert text == '<tool_call>{"name": "get_balance", "arguments": {"account_id": "acc_1234"}}</tool_call>'
    assert parse_action(text) == ({"name": "get_balance", "arguments": {"account_id": "acc_1234"}}, None)
    assert parse_action("All done.") == (None, None)
    for bad in ['<tool_call>{"name": "x", </tool_call>', "<tool_call>{}", text + text]:
        call, error = parse_action(bad)
        assert call is None and error


@pytest.mark.parametrize("action, message", [
    ('<tool_call>{"name": "find_account", "arguments": {"owner": </tool_call>', "malformed"),
    (format_tool_call("delete_everything", {}), "unknown tool"),
    (format_tool_call("get_balance", {"account_id": "acc_1"}), "unknown account id acc_1"),
    (format_tool_call("get_balance", {}), "missing argument"),
    (format_tool_call("transfer", {"from_id": "a", "to_id": "b", "amount_cents": 12.5}), "must be int"),
])
def test_bad_actions_give_error_observations_and_the_episode_goes_on(action, message):
    env = ToolWorldEnv(transfer_task())
    result = env.step(action)
    assert isinstance(result, StepResult) and not result.done and result.reward == 0.0
    assert message in json.loads(result.observation)["error"]
    assert result.info["error"] and result.info["short"].startswith("error:")
    ok = env.step(format_tool_call("find_account", {"owner": env.task.goal["src"]}))
    assert not ok.done and ok.info["error"] is None and "accounts" in json.loads(ok.observation)


def test_turn_limit_ends_the_episode():
    env = ToolWorldEnv(transfer_task(), max_turns=3)
    results = [env.step(format_tool_call("nope", {})) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["success"] is False and "checks" in results[-1].info
    with pytest.raises(RuntimeError):
        env.step("Done.")


def test_reward_is_the_checklist_fraction():
    task = transfer_task()
    env, expert, history = ToolWorldEnv(task), ScriptedExpert(), []
    while '"transfer"' not in (action := expert.act(task, history)):  # look the accounts up
        history.append((action, env.step(action).observation))
    call, _ = parse_action(action)
    dollars = {**call["arguments"], "amount_cents": task.goal["amount_cents"] // 100}
    transfer = env.step(format_tool_call("transfer", dollars))  # dollars instead of cents
    env.step(format_tool_call("confirm_transfer", {"transfer_id": json.loads(transfer.observation)["transfer_id"]}))
    final = env.step("Done.")
    assert final.done and final.observation is None
    assert final.info["checks"] == {"accounts": True, "amount_cents": False, "confirmed": True, "single_transfer": True}
    assert final.reward == 0.75 and final.info["success"] is False


def test_noisy_expert_degrades_smoothly_and_is_deterministic():
    tasks = make_tasks("dev", 200)
    rates = [success_rate(tasks, NoisyExpert(p, seed=0)) for p in (0.0, 0.1, 0.3, 0.6)]
    assert rates[0] >= 0.99 and rates[0] > rates[1] > rates[2] > rates[3]
    assert 0.6 <= rates[1] <= 0.92 and 0.3 <= rates[2] <= 0.65
    play = lambda seed: [run_episode(ToolWorldEnv(t), NoisyExpert(0.3, seed))["actions"] for t in tasks[:40]]
    assert play(7) == play(7) and play(7) != play(8)


def test_episode_logs_are_compact():
    for task in make_tasks("train", 200):
        episode = run_episode(ToolWorldEnv(task), NoisyExpert(0.4, seed=1))
        assert len(episode["shorts"]) == episode["n_turns"] == len(episode["actions"])
        assert all(len(s) <= 60 for s in episode["shorts"])
        assert all(o is None or len(o) <= 150 for o in episode["observations"])
        assert 0.0 <= episode["reward"] <= 1.0
