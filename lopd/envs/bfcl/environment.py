"""BFCL v4 multi-turn as a registered environment (``env.name = bfcl_multi_turn``).

BFCL is a test-only benchmark: the category ``bfcl.category`` is the test split, and there is no
train or dev split (asking for one is an error that says so). Use it to evaluate a checkpoint
(``model.path``) with ``lopd evaluate``; ``evaluate.benchmarks`` runs BFCL beside any environment.
"""

from __future__ import annotations

from lopd.envs.registry import Environment
from lopd.envs.toolworld.lite import lite_text

from .data import load_tasks
from .env import BFCLEnv


def make(p) -> Environment:
    category = p.bfcl.category

    def tasks(split: str, n: int) -> list:
        if split != "test":
            raise ValueError(f"env.name = bfcl_multi_turn has no {split} split (BFCL is a test-only benchmark): "
                             "evaluate a checkpoint with it (lopd evaluate --set model.path=...), or train on another env.name")
        return load_tasks(category, n)

    return Environment(name="bfcl_multi_turn", tasks=tasks, make_env=BFCLEnv, lite_text=lite_text,
                       success_threshold=p.env.success_threshold)
