"""Deterministic ToolWorld task sets with content-disjoint train/dev/test splits.

Every task's content (family + goal) is hashed into one of ten buckets: 0-7 train,
8 dev, 9 test. A split only keeps goals from its own buckets, so no content is shared
between splits whatever the sizes or seeds. Task ``i`` depends only on
``(split, seed, i)``, so a larger ``n`` extends a smaller list as a prefix.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from itertools import count

from .families import REGISTRY

FAMILIES: list[str] = list(REGISTRY)
SPLIT_BUCKETS: dict[str, range] = {"train": range(0, 8), "dev": range(8, 9), "test": range(9, 10)}


@dataclass(frozen=True)
class Task:
    """One episode's task: the text the agent sees and the goal the checks use."""

    task_id: str
    family: str
    split: str
    text: str
    seed: int
    goal: dict


def content_signature(family: str, goal: dict) -> str:
    """What makes two tasks the same task, regardless of id, split or backend seed."""
    return f"{family}:{json.dumps(goal, sort_keys=True)}"


def split_of(family: str, goal: dict) -> str:
    """The split a task content belongs to."""
    bucket = int(hashlib.sha256(content_signature(family, goal).encode()).hexdigest(), 16) % 10
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def make_tasks(split: str, n: int, seed: int = 0, families: list[str] | None = None) -> list[Task]:
    """``n`` tasks of ``split``, families round-robin, deterministic in ``(split, n, seed)``."""
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLIT_BUCKETS)}")
    names = list(families or FAMILIES)
    unknown = [f for f in names if f not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown families {unknown}; expected some of {FAMILIES}")
    tasks = []
    for i in range(n):
        family = REGISTRY[names[i % len(names)]]
        for attempt in count():
            rng = random.Random(f"{split}/{seed}/{i}/{attempt}")
            text, goal = family.sample_goal(rng)
            if split_of(family.name, goal) == split:
                break
        tasks.append(Task(f"{family.prefix}-{split}-{i:05d}", family.name, split, text, rng.getrandbits(32), goal))
    return tasks
