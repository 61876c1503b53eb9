"""BFCL v4 multi-turn as an environment (issue #19): replaying the ground truth scores every entry, a wrong
agent loses exactly the turns it breaks, hostile calls never get past the sandbox, and the rollout engine
plays BFCL's user turns as user messages."""

from __future__ import annotations

import copy
import os
from statistics import mean

import pytest

from lopd.config import BENCHMARKS
from lopd.envs.bfcl import CATEGORIES, BFCLEnv, load_tasks
from lopd.envs.bfcl.agents import play, replay_actions
from lopd.envs.bfcl.sandbox import Rejected, parse_python_call
from lopd.envs.protocol import format_tool_call
from lopd.policy.chat import encode, render_prompt
from lopd.policy.rollout import RolloutEngine
from tests.helpers import ReplayBackend, tiny_tokenizer


def test_params_name_the_same_categories_as_the_environment():
    assert set(BENCHMARKS) - {"toolworld", "humaneval"} == set(CATEGORIES)


def test_replaying_the_ground_truth_scores_200_of_200_on_multi_turn_base():
    tasks = load_tasks("bfcl_multi_turn_base")
    results = [play(t) for t in tasks]
    assert len(tasks) == 200
    assert sum(r.info["success"] for r in results) == 200 and all(r.reward == 1.0 for r in results)
    assert sum(r.info["rejected"] for r in results) == 0


def test_replay_on_the_other_categories_and_the_one_entry_bfcl_itself_contradicts():
    for name in ("bfcl_multi_turn_long_context", "bfcl_multi_turn_miss_param"):
        assert all(play(t).info["success"] for t in load_tasks(name)), name
    failed = {t.task_id: r for t in load_tasks("bfcl_multi_turn_miss_func") if not (r := play(t)).info["success"]}
    # Its ground truth calls `tail` at turn 1, but the entry holds `tail` back until turn 3: the
    # sandbox dispatches only functions the task lists at that moment, so that call is rejected.
    assert list(failed) == ["multi_turn_miss_func_49"]
    r = failed["multi_turn_miss_func_49"]
    assert r.info["rejected"] == 1 and [k for k, ok in r.info["checks"].items() if not ok] == ["turn1"]


def test_dropping_the_last_call_of_each_turn_passes_only_the_turns_with_nothing_to_check():
    tasks = load_tasks("bfcl_multi_turn_base")
    results = [play(t, drop_last=True) for t in tasks]
    assert sum(r.info["success"] for r in results) == 0
    # Closed form: a turn passes only when its ground truth is empty (BFCL checks nothing there); once a
    # turn loses its last call the state differs from the ground truth's for the rest of the entry.
    expected = mean(sum(not gt for gt in t.ground_truth) / len(t.ground_truth) for t in tasks)
    assert mean(r.reward for r in results) == pytest.approx(expected)
    assert 0 < expected < 0.01


def _state(env: BFCLEnv) -> dict:
    return {c: copy.deepcopy({k: v for k, v in vars(i).items() if not k.startswith("_")}) for c, i in env.sandbox.instances.items()}


HOSTILE = [
    '<tool_call>{"name": "__import__", "arguments": {"name": "os"}}</tool_call>',
    '<tool_call>{"name": "system", "arguments": {"command": "touch {canary}"}}</tool_call>',
    '<tool_call>{"name": "open", "arguments": {"file": "/etc/passwd"}}</tool_call>',
    '<tool_call>{"name": "eval", "arguments": {"source": "__import__(\'os\').system(\'touch {canary}\')"}}</tool_call>',
    '<tool_call>{"name": "getattr", "arguments": {"o": "cd", "name": "__globals__"}}</tool_call>',
    '<tool_call>{"name": "cd.__globals__", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "_load_scenario", "arguments": {"scenario": {}}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"__class__": 1}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": "rm -rf /"}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": "document"</tool_call>',  # malformed JSON
    '<tool_call>{"name": "cd", "arguments": {"folder": "' + "A" * 30_000 + '"}}</tool_call>',  # a huge argument
    '<tool_call>{"name": "get_stock_info", "arguments": {"symbol": "AAPL"}}</tool_call>',  # TradingBot: not involved
    '<tool_call>{"name": "cd", "arguments": {"folder": "document", "shell": true}}</tool_call>',  # not in the signature
    '<tool_call>{"name": "cd"',  # unterminated
]
PYTHON_HOSTILE = [
    "__import__('os').system('touch {canary}')",
    "open('/etc/passwd')",
    "cd(folder=lambda: 0)",
    "cd(folder=__import__('os').getcwd())",
    "cd(**{'folder': 'document'})",
    "cd.__globals__['os'].system('touch {canary}')",
    "cd(folder=[x for x in ()])",
    "cd(folder='a'); mv(source='a', destination='b')",
]


def test_hostile_calls_get_an_error_observation_and_leave_no_trace(tmp_path):
    canary = tmp_path / "pwned"
    task = load_tasks("bfcl_multi_turn_base")[0]  # GorillaFileSystem + TwitterAPI
    env = BFCLEnv(task)
    before, environ, cwd = _state(env), dict(os.environ), os.getcwd()
    for action in HOSTILE:
        r = env.step(action.replace("{canary}", str(canary)))
        assert not r.done and r.observation.startswith("Error:"), (action[:60], r.observation[:120])
    assert env.rejected == len(HOSTILE) and env.calls_in_turn == 0 and env.results == []
    for source in PYTHON_HOSTILE:  # BFCL's python-style path (ground truth): parsed with ast, then dispatched
        with pytest.raises(Rejected):
            env.sandbox.call(*parse_python_call(source.replace("{canary}", str(canary))), allowed=env.allowed)
    assert _state(env) == before and dict(os.environ) == environ and os.getcwd() == cwd and not canary.exists()
    # the episode goes on: a legitimate call still works afterwards
    r = env.step(format_tool_call("cd", {"folder": "document"}))
    assert not r.observation.startswith("Error") and env.calls_in_turn == 1


def test_the_engine_plays_bfcl_user_turns_as_user_messages():
    tok = tiny_tokenizer()
    tasks = load_tasks("bfcl_multi_turn_base", 3)
    episodes = {}
    for t in tasks:
        env = BFCLEnv(t)
        actions = [a for turn in range(len(t.turns)) for a in replay_actions(env, turn)]
        if any(tok.decode(encode(tok, a)) != a for a in actions):
            pytest.skip("the tiny test tokenizer does not round-trip BFCL's text")
        episodes[tuple(encode(tok, render_prompt(tok, env.initial_observation())))] = actions
    engine = RolloutEngine(ReplayBackend(tok, episodes), tok, BFCLEnv, max_new_tokens=512, batch_size=2, max_seq_len=1 << 20)
    trajs = engine.run(tasks, 1, seed=0, progress=False)
    assert [tr.success for tr in trajs] == [True, True, True]
    text = tok.decode(trajs[0].token_ids)
    second_turn = tasks[0].turns[1][0]["content"]
    assert f"<|im_start|>user\n{second_turn}<|im_end|>" in text  # a user turn, not a tool response
    assert "<tool_response>" in text


def test_evaluate_says_in_one_line_when_a_model_is_too_short_for_bfcl(repo, caplog):
    from lopd.config import load_params
    from lopd.stages.evaluate import bfcl_table, evaluate_bfcl
    from tests.helpers import tiny_model

    p = load_params(repo / "params.yaml", "smoke", ["evaluate.benchmarks=[toolworld,bfcl_multi_turn_base]", "evaluate.bfcl_n_tasks=5"])
    model, tok = tiny_model(), tiny_tokenizer()
    r = evaluate_bfcl(p, "bfcl_multi_turn_base", model, tok, seed=0)
    context = model.config.max_position_embeddings
    assert r["status"] == "skipped_context" and r["context"] == context and r["n_tasks"] == 5
    assert r["prompt_tokens_max"] + p.rollout.max_new_tokens > context
    assert f"up to {r['prompt_tokens_max']} tokens" in r["reason"] and f"context of {context} tokens" in r["reason"]
    assert "success_rate" not in r  # not a silent zero
    assert r["reason"] in bfcl_table({"bfcl_multi_turn_base": {"lopd": r}})
    # one line per benchmark within a run (five students share it), again in the next run (a served flow)
    caplog.clear()
    warned: set[str] = set()
    for _ in range(2):
        evaluate_bfcl(p, "bfcl_multi_turn_base", model, tok, seed=0, warned=warned)
    evaluate_bfcl(p, "bfcl_multi_turn_base", model, tok, seed=0, warned=set())
    assert [rec.getMessage() for rec in caplog.records if "not evaluated" in rec.getMessage()] == [r["reason"]] * 2
