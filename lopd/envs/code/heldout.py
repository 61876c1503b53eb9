"""Feedback tests and held-out tests: which expected values the feedback may show.

A multi-turn policy reads the feedback, so an expected value the feedback shows can be copied back
without solving anything: a table answering each call from the values shown in earlier turns
(:func:`.hostile.harvest_feedback`) reached success on 110 of 164 problems in 8 turns when every
failure showed its expected value. So each test is either a **feedback test**, whose expected
value the observation may show, or a **held-out test**, whose expected value never leaves the
parent (:func:`split_public`): a test is a feedback test when its call is one of the prompt's own
docstring examples, whose answer the policy reads in the task anyway. Two rules keep the held-out
tests a real check: when every test is a docstring example, every test is held out (HumanEval/34);
and when the held-out tests would all expect one value while the problem's tests expect several,
feedback tests with other values are held out too (HumanEval/35, 40, 54, 113), so no constant
answers the held-out tests. Problems without a docstring example among their tests (51 literal
ones) and the scripted ones hold out every test: their feedback is the count and the last error line only.
"""

from __future__ import annotations

import ast
import dataclasses

from .checks import ProblemTests, literal_args
from .harness import encode

__all__ = ["docstring_calls", "split_public"]


def docstring_calls(prompt: str, entry_point: str) -> set[str]:
    """The repr of the encoded ``(args, kwargs)`` of every call of ``entry_point`` with literal arguments
    in ``prompt`` (its docstring examples: ``>>> f(3)``, ``f(3) ➞ 4``, ``f(3) == 4``; the signature does
    not parse as one)."""
    out = set()
    start = prompt.find(entry_point + "(")
    while start >= 0:
        depth, end = 0, None
        for j in range(start + len(entry_point), len(prompt)):
            depth += prompt[j] in "([{"
            depth -= prompt[j] in ")]}"
            if depth == 0:
                end = j + 1
                break
        try:
            call = ast.parse(prompt[start:end], mode="eval").body if end else None
            if isinstance(call, ast.Call):
                args, kwargs = literal_args(call)
                out.add(repr((encode(args), encode(kwargs))))
        except (SyntaxError, ValueError, TypeError):
            pass  # the signature, or an example with names in it
        start = prompt.find(entry_point + "(", start + 1)
    return out


def split_public(tests: ProblemTests) -> ProblemTests:
    """``tests`` with ``public`` set: per test, whether it is a feedback test (the module docstring's rules)."""
    return dataclasses.replace(tests, public=_public(tests))


def _public(tests: ProblemTests) -> tuple[bool, ...]:
    if tests.kind == "scripted":
        return (False,) * tests.n_tests
    examples = docstring_calls(tests.prompt, tests.entry_point)
    public = [repr(tests.calls[c.call].encoded) in examples for c in tests.cases]
    if all(public):
        return (False,) * tests.n_tests
    values = [repr(c.expected) for c in tests.cases]
    for i, value in enumerate(values):  # hold out tests until no one constant answers every held-out test
        held = {v for v, pub in zip(values, public) if not pub}
        if len(held) >= min(2, len(set(values))):
            break
        if public[i] and value not in held:
            public[i] = False
    return tuple(public)
