"""What LOPD and its text-privilege baseline share: a student, retrieved experiences, a bank that grows.

Rounds (``distill.rounds``, spec: iterative bank): at the end of each round the round's successful
student trajectories join the method's own bank (``data/distill/bank`` for LOPD, a copy of
``data/bank`` that distill owns, so the collect stage's output is never touched) as a new round
file, and the retrieval index over it is rebuilt (``data/distill/index``). Under data parallelism
every rank keeps every rank's successes; rank 0 writes the round file and the index, the others
then read that index, so all ranks retrieve from the same bank.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import pandas as pd

from lopd import layout
from lopd.config import Params
from lopd.envs.registry import get_environment
from lopd.memory.bank import BANK_COLUMNS, append_round, bank_frame, round_numbers
from lopd.memory.retrieval import held_out_task_ids, open_retriever, refresh_retriever
from lopd.train.episodes import Timer
from lopd.train.parallel import DataParallel
from lopd.train.updater import make_updater, save_hf

log = logging.getLogger(__name__)


class BankDistiller:
    """What LOPD and its text-privilege baseline share: a trainable student, retrieval of ``n_ret``
    experiences per task, and a bank of their own that grows by the student's successes each round.

    Subclasses set ``name`` and implement ``step``; one student rollout per task.
    """

    name = ""
    samples_per_task = 1

    def __init__(self, p: Params, student, tokenizer, retriever, tasks_by_id: dict, bank_dir: Path | None, lr: float,
                 dp: DataParallel = DataParallel()):
        self.p, self.student, self.tokenizer, self.dp = p, student, tokenizer, dp
        self.retriever, self.tasks_by_id, self.bank_dir = retriever, tasks_by_id, bank_dir
        self.tasks_per_step = p.distill.batch_tasks
        self.opt_student = make_updater(p, student, list(student.parameters()), lr, dp)
        self.pending: list[dict] = []  # this round's successes (bank rows), appended at the round's end
        self.bank_version = max(round_numbers(bank_dir)) if bank_dir is not None and bank_dir.is_dir() else 0
        self.added_rounds: list[int] = []
        self.timer = Timer()

    def experiences(self, tasks: Sequence) -> list[list[str]]:
        """``n_ret`` retrieved observation-lite texts per task (never the task itself, never dev/test)."""
        n_ret = self.p.retrieval.n_ret
        hits = self.retriever.retrieve_batch(list(tasks), n_ret)
        short = [t.task_id for t, h in zip(tasks, hits) if len(h) < n_ret]
        if short:
            raise ValueError(f"retrieval found fewer than retrieval.n_ret = {n_ret} bank entries for {short[:3]}: "
                             "the bank is too small (collect more successes, or lower retrieval.n_ret)")
        return [[h["lite_text"] for h in row] for row in hits]

    def keep_successes(self, trajs: Sequence) -> float:
        """Successes wait for the end of the round to join the bank (spec: iterative bank); returns their count."""
        trajs = self.dp.gather(trajs)  # every rank's, in task order
        if self.bank_dir is not None:
            rows = bank_frame(list(trajs), self.tasks_by_id, f"distill-{self.name}", self.bank_version + 1,
                              get_environment(self.p).lite_text)
            self.pending += rows.to_dict("records")
        return float(sum(tr.success for tr in trajs))

    def end_round(self, round_: int) -> None:
        """The round's successes become bank round file ``bank_version + 1``; the index is rebuilt over it."""
        rows, self.pending = pd.DataFrame(self.pending, columns=list(BANK_COLUMNS)), []
        if self.bank_dir is None or rows.empty:
            return
        n_added = 0.0
        if self.dp.is_main:
            added = append_round(self.bank_dir, rows, self.bank_version + 1, self.p.env.success_threshold,
                                 forbidden_task_ids=held_out_task_ids(self.p))
            n_added = float(len(added))
            if n_added:
                self.retriever = refresh_retriever(self.p, self.bank_dir, layout.distill_index_dir(self.p, self.name), self.retriever.embedder)
        n_added = self.dp.sum(n_added)  # rank 0's count, on every rank (also the barrier: the index is written)
        if n_added:
            self.bank_version += 1
            self.added_rounds.append(self.bank_version)
            if not self.dp.is_main:
                self.retriever = self._reopen()
            log.info("distill round %d: %d new successes joined the bank (round file %d)", round_, int(n_added), self.bank_version)

    def _reopen(self):
        """The retriever over the index rank 0 wrote for this method's bank."""
        return open_retriever(self.p, self.retriever.embedder, layout.distill_index_dir(self.p, self.name))

    # -- checkpointing

    def save(self, path: Path) -> None:
        save_hf(self.student, self.tokenizer, path / "student", self.opt_student, self.dp)
        self.opt_student.save(path / "zero-student")

    def state_dict(self) -> dict:
        return {
            "opt_student": self.opt_student.state_dict(),
            "pending": self.pending,
            "bank_version": self.bank_version,
            "added_rounds": self.added_rounds,
        }

    def load_state_dict(self, state: dict, path: Path | None = None) -> None:
        """Restore from a checkpoint; round files written after it are dropped (they will be written again)."""
        self.opt_student.load(state["opt_student"], path / "zero-student" if path else None)
        self.pending = list(state["pending"])
        self.bank_version, self.added_rounds = int(state["bank_version"]), list(state["added_rounds"])
        if self.bank_dir is not None:
            if self.dp.is_main:
                for n in round_numbers(self.bank_dir):
                    if n > self.bank_version:
                        (self.bank_dir / f"round-{n:03d}.parquet").unlink()
                if self.added_rounds:
                    self.retriever = refresh_retriever(self.p, self.bank_dir, layout.distill_index_dir(self.p, self.name), self.retriever.embedder)
            self.dp.barrier()
            if self.added_rounds and not self.dp.is_main:
                self.retriever = self._reopen()
