"""A policy plus the environment: the rollout engine configured from params."""

from __future__ import annotations

from typing import Callable, Sequence

from lopd.config import Params
from lopd.envs.toolworld import ToolWorldEnv, make_tasks
from lopd.policy.backends import make_backend
from lopd.policy.rollout import RolloutEngine


def make_engine(p: Params, model, tokenizer, make_env: Callable[[object], object] | None = None) -> RolloutEngine:
    """The rollout engine of ``rollout.*``; episodes are ToolWorld's unless ``make_env`` builds another env (BFCL)."""
    vllm = {"gpu_memory_utilization": p.rollout.vllm_gpu_memory, "seed": p.seed} if p.rollout.backend == "vllm" else {}
    backend = make_backend(p.rollout.backend, model, tokenizer, p.rollout.temperature, p.rollout.top_p, **vllm)
    return RolloutEngine(
        backend,
        tokenizer,
        make_env=make_env or (lambda task: ToolWorldEnv(task, max_turns=p.env.max_turns, success_threshold=p.env.success_threshold)),
        max_new_tokens=p.rollout.max_new_tokens,
        batch_size=p.rollout.batch_size,
        max_seq_len=getattr(model.config, "max_position_embeddings", 1 << 15),
        per_trajectory_rng=p.rollout.rng == "trajectory",
    )


def split_tasks(p: Params, split: str, n: int | None = None) -> Sequence:
    """The first ``n`` tasks of a split (default: the split's configured size)."""
    size = {"train": p.env.n_train, "dev": p.env.n_dev, "test": p.env.n_test}[split]
    return make_tasks(split, min(n or size, size), seed=p.env.task_seed, families=p.env.families,
                      world_seed=p.env.world_seed, pretrain_apps=p.env.pretrain_apps)


def app_group(p: Params, task) -> str:
    """``pretrain`` when the embedded base was pre-trained on the task's app, else ``new``."""
    from lopd.envs.toolworld import app_group as group

    return group(task.family, task.app, p.env.pretrain_apps)


def train_tasks_by_id(p: Params) -> dict:
    """Every configured train task by id (bank entries and rollouts name their task by id)."""
    return {t.task_id: t for t in split_tasks(p, "train")}


def success_by_group(p: Params, tasks: Sequence, trajs: Sequence) -> dict[str, float | None]:
    """Success rate of ``trajs`` on pre-training apps and on new apps separately (None when a group is empty).

    ``tasks``: the tasks the trajectories were played on (looked up by ``task_id``).
    """
    by_id = {t.task_id: t for t in tasks}
    wins: dict[str, list[bool]] = {"pretrain": [], "new": []}
    for tr in trajs:
        wins[app_group(p, by_id[tr.task_id])].append(bool(tr.success))
    return {g: (sum(v) / len(v) if v else None) for g, v in wins.items()}
