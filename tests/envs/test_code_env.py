"""The code environment: HumanEval tasks, their parsed checks, grading through the sandbox, the
multi-turn episode, the bank's text, the split and pass@k.

The two whole-dataset tests run every problem once (all its calls in one sandbox run, two runs at
a time): the canonical solutions must pass all 164, and the ``return None`` set must solve none.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from lopd.envs.code import (SPLIT_SIZES, CanonicalExpert, CodeEnv, SandboxLimits, SandboxUnavailable, bank_entry,
                            extract_code, grade, humaneval_pass_at_k, load_tasks, null_solution, observation_lite,
                            run_episode, run_python, sandbox_available, sandbox_unavailable_reason)
from lopd.envs.code import sandbox
from lopd.envs.code.checks import same
from lopd.envs.code.experts import as_block
from lopd.envs.code.tasks import split_ids

needs_sandbox = pytest.mark.skipif(not sandbox_available(),
                                   reason=f"code sandbox unavailable here: {sandbox_unavailable_reason()}")
SCRIPTED = {"HumanEval/32", "HumanEval/38", "HumanEval/44", "HumanEval/50", "HumanEval/53", "HumanEval/151"}


@pytest.fixture(scope="module")
def tasks():
    return {t.task_id: t for t in load_tasks()}


def grade_all(tasks, solution) -> dict:
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(tasks, pool.map(lambda t: grade(t.tests, solution(t)), tasks.values())))


@needs_sandbox
def test_canonical_solutions_pass_every_problem(tasks):
    verdicts = grade_all(tasks, lambda t: t.canonical_solution)
    failed = {tid: v.feedback() for tid, v in verdicts.items() if not v.success}
    assert not failed, failed
    assert len(verdicts) == 164


@needs_sandbox
def test_return_none_solutions_solve_nothing(tasks):
    verdicts = grade_all(tasks, null_solution)
    assert not [tid for tid, v in verdicts.items() if v.success]
    for tid, v in verdicts.items():  # partial credit only where a test expects None
        tests = tasks[tid].tests
        passing = [name for name, ok in v.checks.items() if ok]
        assert all(tests.cases[tests.names.index(n)].expected is None for n in passing), (tid, passing)


def test_checks_parse_into_literal_cases_and_a_few_scripted(tasks):
    kinds = {tid: t.tests.kind for tid, t in tasks.items()}
    assert {tid for tid, k in kinds.items() if k == "scripted"} == SCRIPTED
    assert all(t.tests.n_tests >= 1 and len(set(t.tests.names)) == t.tests.n_tests for t in tasks.values())
    assert len(tasks["HumanEval/33"].tests.dropped) == 3  # sort_third compared with itself: tautologies
    assert tasks["HumanEval/32"].tests.n_tests == 100 and tasks["HumanEval/53"].tests.n_tests == 105
    modes = {c.mode for c in tasks["HumanEval/2"].tests.cases}
    assert modes == {"eq", "close"} and tasks["HumanEval/2"].tests.cases[1].tol == 1e-6
    assert [c.expected for c in tasks["HumanEval/52"].tests.cases[:2]] == [True, False]  # `assert` / `assert not`
    assert tasks["HumanEval/33"].tests.cases[0].mode == "seq"
    assert [3, 3, 19, 19] in [c.expected for c in tasks["HumanEval/25"].tests.cases]  # candidate(3 * 19 * 3 * 19)


def test_expected_values_never_reach_the_child(tasks):
    tests = tasks["HumanEval/27"].tests
    shipped = repr([c.encoded for c in tests.calls]) + tests.prompt
    assert not any(str(c.expected) in shipped for c in tests.cases if c.expected not in ("",))


def test_same_is_stricter_than_eq():
    assert same(1.0, 1) and same(2, 2.0) and same(None, None) and same([1, (2, "a")], [1, (2, "a")])
    assert not same(1, True) and not same(True, 1) and not same(0, False)
    assert not same((1,), [1]) and not same([1], (1,)) and not same("1", 1)
    assert not same({True: "a"}, {1: "a"}) and same({"a": [1]}, {"a": [1]})


@needs_sandbox
def test_feedback_names_failures_inputs_and_errors(tasks):
    """strlen('') == 0 is the docstring's example (a feedback test); strlen('x') == 1 and
    strlen('asdasnakj') == 9 are held out: counted, and named only by a failure without a value."""
    tests = tasks["HumanEval/23"].tests
    assert tests.feedback_names == {"strlen('')"}
    off_by_one = grade(tests, "def strlen(string):\n    return len(string) - 1\n")
    assert off_by_one.feedback() == "0/2 tests passed; examples 0/1 passed; strlen('') returned -1, expected 0"
    assert off_by_one.short() == "0/2 passed" and off_by_one.reward == 0.0
    crash = grade(tests, "def strlen(string):\n    return 1 // len(string)\n")
    assert crash.feedback() == ("1/2 tests passed; examples 0/1 passed; "
                                "strlen('') raised ZeroDivisionError: integer division or modulo by zero")
    assert crash.checks == {"strlen('')": False, "strlen('x')": True, "strlen('asdasnakj')": False}
    assert crash.reward == 0.5 and not crash.success
    broken = grade(tests, "def strlen(string)\n    return 0\n")
    assert broken.feedback().startswith("0/2 tests passed; examples 0/1 passed; the code failed to load: SyntaxError")
    missing = grade(tests, "def length(string):\n    return len(string)\n")
    assert "does not define strlen()" in missing.feedback()
    scripted = grade(tasks["HumanEval/53"].tests, "def add(x, y):\n    return x + y + 1\n")
    assert scripted.feedback() == "0/105 tests passed"  # a scripted check holds out every test
    slow = grade(tests, "def strlen(string):\n    while True:\n        pass\n", SandboxLimits(timeout_s=0.5))
    assert slow.timed_out and slow.feedback() == ("0/2 tests passed; examples 0/1 passed; strlen('') timed out; "
                                                  "strlen('x') not run")
    assert all(len(part) <= 80 for v in (off_by_one, crash, scripted) for part in v.feedback().split("; "))


@needs_sandbox
def test_episode_ends_when_all_tests_pass(tasks):
    task = tasks["HumanEval/23"]
    env = CodeEnv(task, max_turns=4)
    messages = env.initial_observation()
    assert [m["role"] for m in messages] == ["system", "user"] and "def strlen" in messages[1]["content"]
    first = env.step("I think this works:\n```python\ndef strlen(string):\n    return len(string) - 1\n```")
    assert not first.done and first.reward == 0.0 and first.info["short"] == "0/2 passed"
    assert "success" not in first.info
    assert first.observation.startswith("0/2 tests passed; examples 0/1 passed; strlen('')")
    empty = env.step("Let me think about it.")
    assert not empty.done and empty.reward == 0.0 and "no ```python block" in empty.observation
    assert empty.info["short"] == "no code block" and not any(empty.info["checks"].values())
    last = env.step(CanonicalExpert().act(task, []))
    assert last.done and last.reward == 1.0 and last.info["success"] and not last.info["truncated"]
    assert all(last.info["checks"].values()) and last.observation == "2/2 tests passed; examples 1/1 passed"
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("```python\npass\n```")


@needs_sandbox
def test_episode_is_cut_at_the_turn_limit(tasks):
    env = CodeEnv(tasks["HumanEval/23"], max_turns=2)
    wrong = as_block("def strlen(string):\n    return 3\n")
    assert not env.step(wrong).done
    final = env.step(wrong)
    assert final.done and not final.info["success"] and final.info["truncated"]
    assert final.reward == pytest.approx(0.0)


@needs_sandbox
def test_bank_keeps_only_passing_code(tasks):
    task = tasks["HumanEval/23"]

    class Repairer:
        def act(self, task, history):
            return as_block("def strlen(string):\n    return 0\n") if not history else CanonicalExpert().act(task, history)

    traj = run_episode(CodeEnv(task), Repairer())
    assert traj["success"] and traj["shorts"] == ["0/2 passed", "2/2 passed"]
    entry = bank_entry(traj)
    assert entry.startswith(f"Task: {task.text}") and entry.endswith("``` -> 2/2 passed")
    assert "return 0" not in entry and "return len(string)" in entry
    assert bank_entry(run_episode(CodeEnv(task, max_turns=1), type("Bad", (), {"act": lambda s, t, h: "no"})())) is None
    lite = observation_lite(task.text, traj["actions"], traj["shorts"])
    assert lite.count("```python") == 2 + task.text.count("```python") and "-> 0/2 passed" in lite


def test_extract_code_takes_the_last_python_block():
    text = "```python\nx = 1\n```\nthen\n```py\ny = 2\n```\n```\nz = 3\n```"
    assert extract_code(text) == "y = 2\n"
    assert extract_code("```Python3\nok\n```") == "ok\n"
    assert extract_code("no code here") is None and extract_code("```python\nunclosed") is None


def test_split_is_fixed_and_disjoint(tasks):
    by_split = {s: {t.task_id for t in load_tasks(s)} for s in SPLIT_SIZES}
    assert {s: len(ids) for s, ids in by_split.items()} == {"train": 100, "dev": 32, "test": 32}
    assert set().union(*by_split.values()) == set(tasks) and sum(map(len, by_split.values())) == 164
    ids = list(tasks)
    assert split_ids(ids) == split_ids(ids[::-1])  # order-free
    assert [t.task_id for t in load_tasks("test")][:3] == ["HumanEval/1", "HumanEval/11", "HumanEval/13"]
    with pytest.raises(ValueError, match="split must be one of"):
        load_tasks("validation")


def test_task_fields(tasks):
    task = tasks["HumanEval/10"]  # make_palindrome relies on the prompt's helper is_palindrome
    assert task.text.startswith("Complete the Python function") and task.prompt.strip() in task.text
    assert task.canonical_solution.startswith(task.prompt) and task.entry_point == "make_palindrome"
    assert "```python" in CanonicalExpert().act(task, [])


def test_pass_at_k_matches_closed_forms():
    assert humaneval_pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert humaneval_pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert humaneval_pass_at_k(5, 0, 3) == 0.0 and humaneval_pass_at_k(5, 3, 3) == 1.0  # n - c < k
    assert humaneval_pass_at_k(1, 1, 1) == 1.0
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert humaneval_pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    exact = 1 - math.comb(200 - 13, 100) / math.comb(200, 100)
    assert humaneval_pass_at_k(200, 13, 100) == pytest.approx(exact, rel=1e-9)
    with pytest.raises(ValueError, match="k must be in 1..n=5"):
        humaneval_pass_at_k(5, 1, 6)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        humaneval_pass_at_k(5, 6, 1)
    with pytest.raises(TypeError, match="k must be an int"):
        humaneval_pass_at_k(5, 1, True)


def test_sandbox_limits_reject_bad_values():
    with pytest.raises(ValueError, match="SandboxLimits.timeout_s must be > 0"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="SandboxLimits.uid_base"):
        SandboxLimits(uid_base=0)
    with pytest.raises(ValueError, match="CodeEnv max_turns"):
        CodeEnv(load_tasks("dev")[0], max_turns=0)


def test_without_namespaces_it_refuses_unless_unsafe_is_asked(monkeypatch, caplog):
    """Runs anywhere: the probe is replaced by a refusal."""
    monkeypatch.setattr(sandbox, "sandbox_unavailable_reason", lambda: "unshare: Operation not permitted")
    with pytest.raises(SandboxUnavailable, match=r"docker run --privileged.*allow_unsafe=True"):
        run_python("print(1)")
    with caplog.at_level(logging.WARNING, logger="lopd.envs.code.sandbox"):
        result = run_python("print(6 * 7)", allow_unsafe=True)
    assert result.stdout == "42\n" and not result.isolated
    assert "WITHOUT a sandbox" in caplog.text and "Operation not permitted" in caplog.text
    limits = dataclasses.replace(SandboxLimits(), allow_unsafe=True, timeout_s=0.5)
    assert run_python("while True: pass", limits=limits).timed_out
