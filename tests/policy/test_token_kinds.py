"""Token kinds of an episode (copied / convention / other), used to split the privilege NLL."""

from __future__ import annotations

from helpers import tiny_tokenizer

from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, make_tasks, run_episode
from lopd.policy.rollout import tokenize_episode
from lopd.envs.toolworld.experts import convention_start
from lopd.policy.token_kinds import action_token_kinds, copy_spans


def test_copy_spans_are_argument_values_without_quotes_or_the_whole_answer():
    action = '<tool_call>{"name": "pay", "arguments": {"payee_id": "py_12", "amount": 3400}}</tool_call>'
    assert [action[a:b] for a, b in copy_spans(action)] == ["py_12", "3400"]
    assert copy_spans("Done.") == [(0, 5)]
    assert copy_spans("<tool_call>{oops</tool_call>") == []


def _episode(**conventions):
    task = next(t for t in make_tasks("dev", 300, families=["banking"])
                if all(t.conventions[k] == v for k, v in conventions.items()))
    env = ToolWorldEnv(task)
    messages = env.initial_observation()
    ep = run_episode(env, ScriptedExpert())
    return task, messages, ep


def test_convention_start_is_where_a_flipped_convention_would_write_something_else():
    task, _, ep = _episode(format="cents", prereq="required", commit="required")
    a, o = ep["actions"], ep["observations"]
    assert [x.split('"name": "')[1].split('"')[0] if "<tool_call>" in x else x for x in a] == [
        "find_payee", "verify_payee", "pay", "confirm", "Done."]
    starts = [convention_start(task, a, o, i) for i in range(len(a))]
    assert starts[0] is None  # the lookup is the same under every convention
    assert a[1][starts[1]:].startswith("verify_payee")  # an app without checks would pay here
    assert a[2][starts[2]:].startswith("00}}")  # a dollar app would stop after the dollars
    assert a[3][starts[3]:].startswith("<tool_call>") and starts[3] == 0  # an auto app would answer here
    assert convention_start(task, ["Done."], [None], 0) is None  # not the plan's action: not marked


def test_action_token_kinds_split_every_action_token():
    tok = tiny_tokenizer()
    task, messages, ep = _episode(format="cents", prereq="required", commit="auto")
    ids, mask = tokenize_episode(tok, messages, ep["actions"], ep["observations"])
    kinds = action_token_kinds(tok, task, ids, mask, ep["actions"], ep["observations"], convention_start)
    assert all((k is None) == (not m) for k, m in zip(kinds, mask))
    text = {kind: "".join(tok.decode([i]) for i, k in zip(ids, kinds) if k == kind) for kind in ("copied", "convention", "other")}
    name, dollars = task.goal["name"], str(task.goal["dollars"])
    assert name in text["copied"] and dollars in text["copied"]  # copied from the task
    assert "verify_payee" in text["convention"] and "00" in text["convention"] and "Done" in text["convention"]
    assert "find_payee" in text["other"] and "<tool_call>" in text["other"]
