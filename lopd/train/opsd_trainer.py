"""The text-privilege baseline (OPSD / SDPO / Skill-SD family): LOPD with the experiences as text.

One step: the loop's rollouts → retrieval of ``n_ret`` experiences (spec step 2) → the frozen base
with them written as text in its prompt scores the student's tokens (no grad) → the student's
reverse KL on the teacher's top-M + tail (spec: reverse KL). No composer, no margin, no β.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from lopd.config import Params
from lopd.latent.teacher import teacher_logprobs, text_teacher_batch
from lopd.policy.scoring import token_logprobs
from lopd.train.bank_distiller import BankDistiller
from lopd.train.episodes import TokenLoss, student_batch, to_episodes
from lopd.train.losses import masked_mean, privilege, topm_kl_per_token, trajectory_margin
from lopd.train.parallel import DataParallel


class OPSDTrainer(BankDistiller):
    """The text-privilege baseline (OPSD / SDPO / Skill-SD family): LOPD with the experiences as text.

    Everything is LOPD's (retrieval of ``n_ret`` experiences, the growing bank, the student's
    reverse KL on the teacher's top-M + tail, the student rate ``distill.opsd_lr``) except the
    teacher: the frozen base with the retrieved observation-lite experiences written *as text*
    into the same framing sentence, as the ``privilege`` stage's ``retrieved_text``. No composer,
    no margin, no β; Δ is still computed (on the text teacher) so the curves compare.
    """

    name = "opsd"

    def __init__(self, p: Params, student, tokenizer, teacher, retriever, tasks_by_id: dict, bank_dir: Path | None = None,
                 dp: DataParallel = DataParallel()):
        super().__init__(p, student, tokenizer, retriever, tasks_by_id, bank_dir, p.distill.opsd_lr, dp)
        self.teacher = teacher  # the frozen base

    def step(self, step: int, tasks: Sequence, trajs: Sequence) -> dict[str, float]:
        p, d = self.p, self.p.distill
        device = next(self.student.parameters()).device
        episodes = to_episodes(p, tasks, trajs)
        with self.timer("retrieval"):
            texts = ["\n\n".join(exp) for exp in self.experiences([e.task for e in episodes])]
        ids_BT, attn_BT, mask_BT = (t.to(device) for t in student_batch(episodes, self.tokenizer.pad_token_id))
        reward_B = torch.tensor([e.reward for e in episodes], dtype=torch.float32, device=device)
        w_tok = self.dp.weight(mask_BT.sum())  # token means over every rank's batch (lopd.train.parallel)

        with self.timer("student_update"):
            self.student.train()
            s_logp_BTV, s_tok_BT = token_logprobs(self.student, ids_BT, attn_BT, mask_BT)
        # 1. Teacher scoring, no grad: the base with the experiences as text in its framing.
        with self.timer("teacher_scoring"), torch.no_grad():
            tb = text_teacher_batch(self.tokenizer, episodes, texts).to(device)
            student_ids = s_logp_BTV.detach().topk(d.top_m, dim=-1).indices if d.kl_support == "student" else None
            no_latents = torch.zeros(len(episodes), 0, self.teacher.config.hidden_size, device=device)
            t = teacher_logprobs(self.teacher, tb, no_latents, ids_BT, mask_BT, top_m=d.top_m, ids_BTM=student_ids)
            delta = self.dp.average(trajectory_margin(privilege(t.token_logp_BT, s_tok_BT, mask_BT), reward_B, mask_BT), w_tok)
        # 2. Student update: the same reverse KL(π_S ‖ π_T) on top-M + tail as LOPD's.
        with self.timer("student_update"):
            kl_BT = topm_kl_per_token(s_logp_BTV.gather(-1, t.topm_ids_BTM), t.topm_logp_BTM)
            kl = masked_mean(kl_BT, mask_BT)
            self.token_loss = TokenLoss(episodes, kl_BT.detach(), mask_BT)  # where the loss falls (lopd.train.decisions)
            norm = self.opt_student.step(kl * w_tok)
            self.student.eval()
        return {"kl": self.dp.average(kl.item(), w_tok), "delta": delta, "student_grad_norm": norm, "new_successes": self.keep_successes(trajs)}
