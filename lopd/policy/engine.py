"""A policy plus the environment: the rollout engine configured from params (``env.name`` picks the environment)."""

from __future__ import annotations

from typing import Callable, Sequence

from lopd.config import Params
from lopd.envs.registry import Environment, get_environment
from lopd.policy.backends import make_backend
from lopd.policy.rollout import RolloutEngine


def environment(p: Params) -> Environment:
    """The environment ``env.name`` names (``lopd.envs.registry``)."""
    return get_environment(p)


def make_engine(p: Params, model, tokenizer, make_env: Callable[[object], object] | None = None) -> RolloutEngine:
    """The rollout engine of ``rollout.*``; episodes are ``env.name``'s unless ``make_env`` builds another env (a benchmark)."""
    vllm = {"gpu_memory_utilization": p.rollout.vllm_gpu_memory, "seed": p.seed} if p.rollout.backend == "vllm" else {}
    backend = make_backend(p.rollout.backend, model, tokenizer, p.rollout.temperature, p.rollout.top_p, **vllm)
    return RolloutEngine(
        backend,
        tokenizer,
        make_env=make_env or environment(p).make_env,
        max_new_tokens=p.rollout.max_new_tokens,
        batch_size=p.rollout.batch_size,
        max_seq_len=getattr(model.config, "max_position_embeddings", 1 << 15),
        per_trajectory_rng=p.rollout.rng == "trajectory",
    )


def split_tasks(p: Params, split: str, n: int | None = None) -> Sequence:
    """The first ``n`` tasks of a split (default: the split's configured size)."""
    size = {"train": p.env.n_train, "dev": p.env.n_dev, "test": p.env.n_test}[split]
    return environment(p).tasks(split, min(n or size, size))


def app_group(p: Params, task) -> str | None:
    """The task's report group (ToolWorld: ``pretrain`` when the embedded base was pre-trained on its app, else ``new``);
    None when the environment has no grouping."""
    env = environment(p)
    return env.group(task) if env.group else None


def train_tasks_by_id(p: Params) -> dict:
    """Every configured train task by id (bank entries and rollouts name their task by id)."""
    return {t.task_id: t for t in split_tasks(p, "train")}


def success_by_group(p: Params, tasks: Sequence, trajs: Sequence) -> dict[str, float | None]:
    """Success rate of ``trajs`` per report group (ToolWorld: pre-training apps and new apps; None when a group is
    empty; ``{}`` when the environment has no grouping).

    ``tasks``: the tasks the trajectories were played on (looked up by ``task_id``).
    """
    env = environment(p)
    if not env.group:
        return {}
    by_id = {t.task_id: t for t in tasks}
    wins: dict[str, list[bool]] = {g: [] for g in env.groups}
    for tr in trajs:
        wins[env.group(by_id[tr.task_id])].append(bool(tr.success))
    return {g: (sum(v) / len(v) if v else None) for g, v in wins.items()}
