"""Deterministic ToolWorld task sets with content-disjoint train/dev/test splits.

Every task's content (family + goal, the app included) is hashed into one of ten buckets: 0-7
train, 8 dev, 9 test. A split only keeps goals from its own buckets, so no content is shared
between splits whatever the sizes or seeds. Within a split every task is unique: a content
already drawn is drawn again. Task ``i`` depends only on ``(split, seed)``, the app filter and
the tasks before it, so a larger ``n`` extends a smaller list as a prefix. Within a family the
apps take turns, pre-training and new apps alternately, so every prefix gives each app the same
number of tasks, give or take one: a figure per app group then weighs every app alike.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from itertools import count, zip_longest

from .apps import conventions as app_conventions
from .families import REGISTRY

FAMILIES: list[str] = list(REGISTRY)
SPLIT_BUCKETS: dict[str, range] = {"train": range(0, 8), "dev": range(8, 9), "test": range(9, 10)}
MAX_DRAWS = 2000  # draws for one task before its family's content space counts as exhausted


@dataclass(frozen=True)
class Task:
    """One episode's task: the text the agent sees, the goal the checks use, and the app's
    hidden conventions (which the agent never sees)."""

    task_id: str
    family: str
    split: str
    text: str
    seed: int
    goal: dict
    conventions: dict = field(default_factory=dict)

    @property
    def app(self) -> str:
        return self.goal["app"]


def content_signature(family: str, goal: dict) -> str:
    """What makes two tasks the same task, regardless of id, split or backend seed."""
    return f"{family}:{json.dumps(goal, sort_keys=True)}"


def split_of(family: str, goal: dict) -> str:
    """The split a task content belongs to."""
    bucket = int(hashlib.sha256(content_signature(family, goal).encode()).hexdigest(), 16) % 10
    return next(split for split, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def app_turns(family: str, allowed: tuple[str, ...], pretrain_apps: int) -> list[str]:
    """The order the apps take turns in: pre-training and new apps alternately, so that even a
    short prefix of a split holds both groups."""
    first = set(REGISTRY[family].apps[:pretrain_apps])
    pre, new = [a for a in allowed if a in first], [a for a in allowed if a not in first]
    return [a for pair in zip_longest(pre, new) for a in pair if a is not None]


def make_tasks(split: str, n: int, seed: int = 0, families: list[str] | None = None,
               apps: dict[str, tuple[str, ...]] | None = None, world_seed: int = 0, tag: str = "",
               pretrain_apps: int = 4) -> list[Task]:
    """``n`` unique tasks of ``split``, families round-robin, deterministic in ``(split, n, seed)``.

    ``apps``: the apps each family may draw from (default all); ``tag`` marks the task ids of
    such a filtered set so they never collide with the unfiltered set's. ``world_seed`` and
    ``pretrain_apps`` fix the apps' hidden conventions (``apps.conventions``).
    """
    if split not in SPLIT_BUCKETS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLIT_BUCKETS)}")
    names = list(families or FAMILIES)
    unknown = [f for f in names if f not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown families {unknown}; expected some of {FAMILIES}")
    tasks, seen = [], set()
    for i in range(n):
        family = REGISTRY[names[i % len(names)]]
        allowed = app_turns(family.name, (apps or {}).get(family.name) or family.apps, pretrain_apps)
        app = allowed[(i // len(names)) % len(allowed)]
        for attempt in count():
            if attempt == MAX_DRAWS:
                raise ValueError(
                    f"{split}: no new {family.name} task after {MAX_DRAWS} draws at task {i} of {n}; "
                    f"the family's {split} content is nearly exhausted: ask for fewer tasks "
                    f"(env.n_{split}, or the stage's n_tasks)")
            rng = random.Random(f"{split}/{seed}/{i}/{attempt}")
            text, goal = family.sample_goal(rng, app)
            signature = content_signature(family.name, goal)
            if signature not in seen and split_of(family.name, goal) == split:
                break
        seen.add(signature)
        task_id = f"{family.prefix}-{split}{'-' + tag if tag else ''}-{i:05d}"
        tasks.append(Task(task_id, family.name, split, text, rng.getrandbits(32), goal,
                          app_conventions(family.name, goal["app"], world_seed, pretrain_apps)))
    return tasks
