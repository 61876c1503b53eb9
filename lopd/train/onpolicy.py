"""What every method of ``lopd distill`` shares: the rollout budget, each step's tasks, seeds, the optimiser step.

Budget accounting (spec weakness 3: count every generation exactly). A *generation* is one
complete trajectory sampled by the policy being trained. Every method spends exactly
``distill.batch_tasks`` generations per step for ``distill.steps`` steps:

- LOPD and SFT: ``batch_tasks`` tasks × 1 sample;
- GRPO: ``batch_tasks / grpo.group_size`` tasks × ``group_size`` samples (it needs a group per
  task, so it sees fewer tasks per step);

so the budget is ``rollout_budget(p) = distill.steps × distill.batch_tasks`` generations for
each method, charged through one :class:`lopd.policy.rollout.RolloutBudget` per method (the engine
charges before it samples, so an over-spend is an error, never a silent extra). Dev
evaluations are measurement, not training: they are counted separately (``eval_rollouts``).
"""

from __future__ import annotations

import hashlib
import random
from typing import Iterable, Sequence

import torch

from lopd.config import Params, ParamsError

METHODS = ("lopd", "opsd", "grpo", "sft", "vanilla")


def rollout_budget(p: Params) -> int:
    """Generations each trained method may spend: ``distill.steps × distill.batch_tasks``."""
    return p.distill.steps * p.distill.batch_tasks


def tasks_per_step(p: Params, method: str) -> int:
    """Train tasks a step of ``method`` rolls out: ``batch_tasks``, GRPO ``batch_tasks / G`` (G samples each)."""
    return p.distill.batch_tasks // p.grpo.group_size if method == "grpo" else p.distill.batch_tasks


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (``hash()`` of a str is salted per process; this is not)."""
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def step_tasks(p: Params, train_tasks: Sequence, step: int, n: int) -> list:
    """The first ``n`` of step ``step``'s ``batch_tasks`` train tasks.

    A function of (seed, step) only: every method sees the same tasks at the same step (GRPO
    the first ``batch_tasks / G`` of them), and a resumed run needs no sampler state.
    """
    rng = random.Random(f"{p.seed}:tasks:{step}")
    return rng.sample(list(train_tasks), p.distill.batch_tasks)[:n]


def round_of(p: Params, step: int) -> int:
    """Round (0-based) that step ``step`` belongs to; rounds split the steps as evenly as possible."""
    return step * p.distill.rounds // p.distill.steps


def ends_round(p: Params, step: int) -> bool:
    return step + 1 == p.distill.steps or round_of(p, step + 1) != round_of(p, step)


def make_adam(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Adam:
    """Plain Adam, no weight decay (the spec's optimiser for student and composer)."""
    return torch.optim.Adam(list(params), lr=lr)


def optimizer_step(opt: torch.optim.Optimizer, loss: torch.Tensor, params: Sequence[torch.nn.Parameter], grad_clip: float) -> float:
    """zero_grad → backward → clip to ``grad_clip`` → step; returns the pre-clip gradient norm."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(norm)


def check_methods(p: Params, methods: Sequence[str]) -> None:
    """Cross-field checks of the distill params, before anything loads (one line per mistake)."""
    d, errors = p.distill, []
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        errors.append(f"params: distill.methods has {unknown}: allowed methods are {list(METHODS)}")
    if not methods:
        errors.append("params: distill.methods is empty: name at least one of " + ", ".join(METHODS))
    if "grpo" in methods and d.batch_tasks % p.grpo.group_size:
        errors.append(
            f"params: distill.batch_tasks = {d.batch_tasks} must be a multiple of grpo.group_size = {p.grpo.group_size} "
            "(GRPO spends the same generations per step as LOPD: batch_tasks / group_size tasks × group_size samples)"
        )
    if d.rounds > d.steps:
        errors.append(f"params: distill.rounds = {d.rounds} exceeds distill.steps = {d.steps} (a round needs at least one step)")
    if d.batch_tasks > p.env.n_train:
        errors.append(f"params: distill.batch_tasks = {d.batch_tasks} exceeds env.n_train = {p.env.n_train} (tasks are drawn without replacement per step)")
    if errors:
        raise ParamsError("\n".join(errors))
