"""Data parallelism for ``lopd distill``: which shard of a step a process plays, and how it reduces.

One process is rank 0 of 1 and every helper is the identity there, so the single-process
numbers do not move. Under ``lopd distill --nproc N`` (or ``torchrun`` / ``deepspeed``):

- each rank plays a contiguous block of the step's tasks (:meth:`DataParallel.split`); with
  ``rollout.rng: trajectory`` its rollouts are exactly those one process would sample for them;
- the rollout budget is charged with the step's *global* count, before anyone samples;
- every loss here is a mean over the whole batch (tokens, trajectories or latents). A rank scales
  its local mean by :meth:`DataParallel.weight` (``n_local · N / n_global``): DeepSpeed averages
  the gradients over ranks, so the update is the one-process update on the global batch.
  Reported numbers are global (:meth:`DataParallel.average`);
- successes and dev trajectories are gathered (:meth:`DataParallel.gather`, rank order = the
  one-process order), so every rank holds the same bank; rank 0 alone writes files and MLflow.

DeepSpeed owns the optimiser, the gradient reduction, clipping and ZeRO partitioning
(``lopd.train.updater``); this module only shards the work and reduces the reported numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def split(self, items: Sequence) -> list:
        """This rank's contiguous block of ``items`` (sizes differ by at most one; rank order = item order)."""
        n, w = len(items), self.world
        start = self.rank * (n // w) + min(self.rank, n % w)
        return list(items[start : start + n // w + (self.rank < n % w)])

    def gather(self, items: Sequence) -> list:
        """Every rank's ``items`` concatenated in rank order, on every rank (inverse of :meth:`split`)."""
        if not self.active:
            return list(items)
        parts: list = [None] * self.world
        torch.distributed.all_gather_object(parts, list(items))
        return [x for part in parts for x in part]

    def sum(self, x: float) -> float:
        if not self.active:
            return float(x)
        t = torch.tensor([float(x)], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return float(t)

    def weight(self, n_local: float | torch.Tensor) -> float:
        """``n_local · N / n_global``: scales a local mean over ``n_local`` items so that DeepSpeed's
        average over N ranks is the global mean (1.0 in one process). 0 when nothing is counted."""
        n_local = float(n_local)
        if not self.active:
            return 1.0 if n_local > 0 else 0.0
        n_global = self.sum(n_local)
        return n_local * self.world / n_global if n_global > 0 else 0.0

    def average(self, local_mean: float | torch.Tensor, weight: float) -> float:
        """The global mean from each rank's local mean and its :meth:`weight`."""
        x = float(local_mean) * weight
        return self.sum(x) / self.world if self.active else x

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()


def from_env() -> DataParallel:
    """Rank and world size as ``torchrun`` / ``deepspeed`` set them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``)."""
    return DataParallel(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))


def init_data_parallel(engine: str) -> DataParallel:
    """Join the process group of a multi-process launch (gloo on CPU, nccl on CUDA); one process needs none.

    ``lopd.stages.distill.check_parallel`` has refused ``engine = 'single'`` on several processes.
    """
    dp = from_env()
    if engine != "deepspeed":
        return dp
    if dp.world == 1:  # DeepSpeed needs a process group even for one rank
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("LOCAL_RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    if torch.cuda.is_available():
        torch.cuda.set_device(dp.local_rank)  # "cuda" below means this rank's GPU
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not torch.distributed.is_initialized():
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo", auto_mpi_discovery=False)
    return DataParallel(torch.distributed.get_rank(), torch.distributed.get_world_size(), dp.local_rank)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
