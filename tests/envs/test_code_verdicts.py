"""The parent's side of grading, without a sandbox: a verdict for every value the child can send,
and held-out tests that no amount of feedback gives away.

Property-based (hypothesis): for every one of HumanEval's 164 problems, whatever strict JSON the
child prints for each call (huge ints, NaN and infinities, deep nesting, long strings, wrong
types, garbage lines), :func:`~lopd.envs.code.grading.judge` returns pass or fail for every test
and a feedback line, and never raises. Then the lookup attacker at its strongest: it knows every
expected value the feedback may ever show (the feedback tests') and answers every other call
with one constant; it must solve no problem, while the canonical values solve all 164.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lopd.envs.code import load_tasks
from lopd.envs.code.checks import judge_literal, LiteralCase
from lopd.envs.code.grading import CallResult, _fill_missing, judge, parse_results
from lopd.envs.code.harness import encode

TASKS = load_tasks()
NONCE = "n0nce"
BAD_INDEX = '{"i": [0], "value": 1}'

scalars = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(), st.integers(min_value=2**1024, max_value=10**4000), st.integers(max_value=-(2**1024)),
    st.sampled_from([10**400, -(10**400), 2**1024, float("nan"), float("inf"), -float("inf")]),
    st.builds(pow, st.just(10), st.just(5000)),  # beyond the 4,300 digits Python converts to text
    st.text(max_size=50), st.just("x" * 100_000))
edges = st.sampled_from([10**400, -(10**400), 2**1024, float("nan"), float("inf"), -float("inf"), -0.0, 2**63,
                         True, "", [], {}, ()])
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.tuples(inner, inner), st.dictionaries(st.one_of(st.integers(), st.text(max_size=5)),
                                                                          inner, max_size=3)), max_leaves=12)
garbage = st.sampled_from(["[" * 100_000, '{"i": 0}', '{"i": "0", "value": 1}', '{"i": 0, "value": {"tuple": 1}}',
                           '{"i": 0, "value": {"dict": [[[], 1]]}}', "1e999999", "NaN", "-Infinity", '{"i": 99999, '
                           '"value": 1}', '{"load_error": {"x": 1}}', '{"i": 0, "error": 3}', "1" * 5000])


def child_stdout(n_calls: int, draws: list) -> str:
    """What a child may print: per call a value line (strict JSON of an encoded value), an error line
    or nothing, plus garbage lines and lines without the nonce."""
    lines = []
    for i, (kind, value) in enumerate(draws[:n_calls]):
        if kind == "value":
            try:
                lines.append(f"{NONCE} {json.dumps({'i': i, 'value': encode(value)})}")
            except (ValueError, TypeError):  # an int beyond str conversion: the child reports an error
                lines.append(f"{NONCE} {json.dumps({'i': i, 'error': 'ValueError: too many digits'})}")
        elif kind == "error":
            lines.append(f"{NONCE} {json.dumps({'i': i, 'error': type(value).__name__})}")
        elif kind == "garbage":
            lines.append(f"{NONCE} {value if isinstance(value, str) else BAD_INDEX}")
    return "\n".join(lines + ["unrelated 1", f"{NONCE}"])


draw_lines = st.lists(st.tuples(st.sampled_from(["value", "value", "value", "error", "none", "garbage"]),
                                st.one_of(edges, values, garbage)), min_size=1, max_size=12)


@pytest.mark.parametrize("task", TASKS, ids=[t.task_id for t in TASKS])
@settings(max_examples=12, deadline=None, derandomize=True,  # the same examples on every run
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(draws=draw_lines, timed_out=st.booleans())
def test_every_value_gets_a_verdict(task, draws, timed_out):
    tests = task.tests
    draws = (draws * (len(tests.calls) // len(draws) + 1))[: len(tests.calls)]
    raw, load_error = parse_results(child_stdout(len(tests.calls), draws), NONCE, len(tests.calls))
    verdict = judge(tests, _fill_missing(raw, timed_out, -9), load_error)
    assert list(verdict.checks) == list(tests.names) and all(type(v) is bool for v in verdict.checks.values())
    assert not (verdict.last_error or "").startswith("grader error"), verdict.last_error
    assert isinstance(verdict.feedback(), str) and 0.0 <= verdict.reward <= 1.0


@given(value=st.one_of(edges, values), expected=st.one_of(st.integers(-10, 10), st.floats(-1e6, 1e6)),
       tol=st.sampled_from([1e-6, 1e-3, 0.5]), inclusive=st.booleans())
@settings(max_examples=300, deadline=None, derandomize=True)
def test_a_tolerance_check_judges_any_value(value, expected, tol, inclusive):
    """``abs(candidate(x) - y) < tol``: a closed form for any value the child can send."""
    case = LiteralCase(0, expected, "close", tol, inclusive)
    number = type(value) in (int, float)
    want = number and math.isfinite(float(value) if abs(value) < 1e308 else math.inf) and (
        abs(value - expected) <= tol if inclusive else abs(value - expected) < tol)
    assert judge_literal(case, value) is bool(want)


def test_a_huge_int_fails_a_tolerance_check_instead_of_raising():
    case = LiteralCase(0, 0.33, "close", 1e-6)
    assert judge_literal(case, 10**400) is False and judge_literal(case, float("nan")) is False
    assert judge_literal(case, 0.33) is True and judge_literal(case, -(10**309)) is False


def lookup_results(tests, default) -> list[CallResult]:
    """The strongest feedback harvester: every feedback test's call answered with its expected value (all
    the feedback can ever show), every other call with ``default``."""
    shown = {}
    for case, name, public in zip(tests.cases, tests.names, tests.public):
        if public:
            shown[case.call] = case.expected
    return [CallResult(True, shown.get(i, default)) for i in range(len(tests.calls))]


def test_no_constant_plus_everything_the_feedback_shows_solves_a_problem():
    solved = Counter()
    for task in TASKS:
        tests = task.tests
        shown = [c.expected for c, pub in zip(tests.cases, tests.public) if pub]
        defaults = [None, True, False, 0, 1, -1, "", [], (), 0.0, *Counter(map(repr, shown)).keys()]
        for default in defaults:
            default = eval(default) if isinstance(default, str) and default not in ("",) else default  # noqa: S307
            if judge(tests, lookup_results(tests, default)).success:
                solved[task.task_id] += 1
    assert not solved, solved
    # and the split leaves something to check: every problem holds out at least one test
    assert all(t.tests.n_tests > sum(t.tests.public) for t in TASKS)


def test_held_out_tests_do_not_share_one_answer_where_the_problem_has_several():
    for task in TASKS:
        tests = task.tests
        if tests.kind != "literal":
            continue
        every = {repr(c.expected) for c in tests.cases}
        held = {repr(c.expected) for c, pub in zip(tests.cases, tests.public) if not pub}
        assert len(held) >= min(2, len(every)), task.task_id


def test_feedback_tests_are_the_docstring_examples():
    by_id = {t.task_id: t.tests for t in TASKS}
    assert by_id["HumanEval/23"].feedback_names == {"strlen('')"}  # `>>> strlen('')` in its docstring
    assert by_id["HumanEval/34"].feedback_names == frozenset()  # its only test is its example: held out
    assert all(not any(by_id[t].public) for t in ("HumanEval/32", "HumanEval/53"))  # scripted
    counts = Counter(any(t.tests.public) for t in TASKS)
    assert counts[True] == 107 and counts[False] == 57
