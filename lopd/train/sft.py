"""The SFT baseline: rejection-sampling fine-tuning (RFT) at LOPD's rollout budget.

Per step the student samples ``batch_tasks`` train tasks once each (the same generations as one
LOPD step); its successes (reward ≥ ``env.success_threshold``) join a pool that starts as the
bank's successes (replayed in a fresh environment, ``lopd.train.episodes.replay_entry``). One Adam step
(lr ``distill.sft_lr``) then lowers the masked NLL (``lopd.train.lm_train.masked_nll``, action tokens
only) of ``batch_tasks`` pool episodes drawn at random. Online, so its dev curve is on the same
rollout axis as LOPD's and GRPO's.
"""

from __future__ import annotations

import random
from typing import Sequence

from lopd.config import Params
from lopd.train.episodes import Episode, Timer, TokenLoss, initial_messages, to_episodes
from lopd.train.lm_train import IGNORE, collate, masked_nll
from lopd.train.parallel import DataParallel
from lopd.train.updater import make_updater, save_hf


class SFTTrainer:
    """Online RFT on a trainable student; ``pool`` = bank successes + the student's new successes."""

    name = "sft"
    samples_per_task = 1

    def __init__(self, p: Params, student, tokenizer, bank_pool: list[Episode], tasks_by_id: dict, dp: DataParallel = DataParallel()):
        self.p, self.student, self.tokenizer, self.dp = p, student, tokenizer, dp
        self.tasks_per_step = p.distill.batch_tasks
        self.bank_pool, self.tasks_by_id = bank_pool, tasks_by_id
        self.new: list[Episode] = []
        self.opt_student = make_updater(p, student, list(student.parameters()), p.distill.sft_lr, dp)
        self.timer = Timer()

    @property
    def pool(self) -> list[Episode]:
        return self.bank_pool + self.new

    def step(self, step: int, tasks: Sequence, trajs: Sequence) -> dict[str, float]:
        # Every rank keeps every rank's successes (gathered in task order): one pool, as one process has.
        wins = self.dp.gather([e for e in to_episodes(self.p, tasks, trajs) if e.success])
        self.new += wins  # rejection sampling: only successes are kept
        pool, self.token_loss = self.pool, None
        if len(pool) < self.dp.world:  # every rank needs an episode (one process: an empty pool); same on all ranks
            return {"loss": float("nan"), "pool_size": 0.0, "new_successes": float(len(wins))}
        rng = random.Random(f"{self.p.seed}:sft:{step}")
        batch = [pool[i] for i in rng.sample(range(len(pool)), min(self.p.distill.batch_tasks, len(pool)))]
        batch = self.dp.split(batch)  # this rank's share of the step's batch
        device = next(self.student.parameters()).device
        with self.timer("policy_update"):
            self.student.train()
            ids_BT, attn_BT, labels_BT = (t.to(device) for t in collate([(e.token_ids, e.action_mask) for e in batch], self.tokenizer.pad_token_id))
            w = self.dp.weight((labels_BT[:, 1:] != IGNORE).sum())  # token mean over every rank's batch
            loss, nll_BT = masked_nll(self.student, ids_BT, attn_BT, labels_BT, per_token=True)
            self.token_loss = TokenLoss(batch, nll_BT, labels_BT != IGNORE)  # where the loss falls (lopd.train.decisions)
            norm = self.opt_student.step(loss * w)
            self.student.eval()
        return {"loss": self.dp.average(loss.item(), w), "grad_norm": norm, "pool_size": float(len(pool)), "new_successes": float(len(wins))}

    def end_round(self, round_: int) -> None:
        """The pool already grows every step: nothing to refresh."""

    def save(self, path) -> None:
        save_hf(self.student, self.tokenizer, path / "student", self.opt_student, self.dp)
        self.opt_student.save(path / "zero-student")

    def state_dict(self) -> dict:
        new = [{"task_id": e.task.task_id, "token_ids": e.token_ids, "action_mask": e.action_mask,
                "prompt_len": e.prompt_len, "reward": e.reward} for e in self.new]
        return {"opt": self.opt_student.state_dict(), "new": new}

    def load_state_dict(self, state: dict, path=None) -> None:
        self.opt_student.load(state["opt"], path / "zero-student" if path else None)
        self.new = []
        for r in state["new"]:
            task = self.tasks_by_id[r["task_id"]]
            self.new.append(Episode(task, initial_messages(self.p, task), list(r["token_ids"]), list(r["action_mask"]),
                                    int(r["prompt_len"]), float(r["reward"]), True))  # the pool holds successes only
