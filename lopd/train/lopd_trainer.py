"""One LOPD step, top to bottom (spec: "Pipeline" steps 2–4 and 6, and "Losses").

The equations, as the spec's "Losses" section states them (per action token t of trajectory τ):

- (E1) reverse KL on top-M + tail: ``KL(π_S ‖ π_T) = Σ_{M+1 bins} p_S (log p_S − log p_T)``
- (E2) privilege: ``δ_t = log π_T(a_t | s_t, c) − sg[log π_S(a_t | s_t)]``
- (E3) trajectory-weighted margin: ``Δ(φ) = mean_{τ,t} A(τ)·δ_t`` with ``A(τ) = 2·r(τ) − 1``
- (E4) composer Lagrangian: ``L_φ = KL + β·(m − Δ(φ)) + λ·‖c_φ − c_φ₀‖²``
- (E5) dual ascent: ``β ← max(0, β + η_β·(m − Δ))``

``lopd.train.losses`` holds each as a pure function. A step, as the public code alternates it:

0. rollouts: the loop (``lopd.train.loop``) samples one trajectory per task with the student alone,
   the environment gives r(τ) (spec step 6), every generation counted by the rollout budget;
1. retrieval: ``n_ret`` bank successes per task, never the task itself (spec step 2);
2. latents: the composer turns "task + one experience" into K latents each (spec step 3);
3. teacher scoring, no grad: the frozen base with the latents in its placeholder slots re-scores
   the student's prefix in one forward (spec step 4): top-M support, log π_T at a_t, Δ (E2, E3);
4. student update on the reverse KL, teacher detached (E1; spec: student objective);
5. composer update on L_φ with the same support, student detached (E4; skipped when
   ``composer.frozen``, and on all but every ``distill.composer_every``-th step);
6. dual update of β with the Δ of phase 3 (E5).

The student is a separate trainable copy of the base; the teacher is the base inside the composer's
backbone (LoRA off), never updated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from lopd.config import Params
from lopd.latent.teacher import teacher_logprobs
from lopd.policy.scoring import token_logprobs
from lopd.train.bank_distiller import BankDistiller
from lopd.train.episodes import TokenLoss, student_batch, teacher_batch, to_episodes
from lopd.train.losses import composer_lagrangian, dual_update, latent_anchor, masked_mean, privilege, topm_kl_per_token, trajectory_margin
from lopd.train.parallel import DataParallel
from lopd.train.updater import make_updater


class LOPDTrainer(BankDistiller):
    """Student + composer + β; ``step`` consumes one batch of student rollouts (one per task)."""

    name = "lopd"

    def __init__(self, p: Params, student, tokenizer, composer, anchor, retriever, tasks_by_id: dict, bank_dir: Path | None = None,
                 dp: DataParallel = DataParallel()):
        super().__init__(p, student, tokenizer, retriever, tasks_by_id, bank_dir, p.distill.student_lr, dp)
        self.composer, self.anchor = composer, anchor  # c_φ (trainable) and c_φ₀ (the cold start, frozen)
        self.phi = composer.trainable_parameters()  # encoder LoRA + resampler
        # φ is a few MB: ZeRO-3 would only shard the frozen teacher inside the composer, so ZeRO-2 at most.
        self.opt_composer = None if p.composer.frozen else make_updater(p, composer, self.phi, p.distill.composer_lr, dp, max_stage=2)
        self.beta = p.distill.beta0  # β₀ = 0

    @property
    def n_latents(self) -> int:
        return self.p.retrieval.n_ret * self.p.composer.num_latents  # 3 experiences × 32 = 96 slots

    def step(self, step: int, tasks: Sequence, trajs: Sequence) -> dict[str, float]:
        p, d = self.p, self.p.distill
        device = next(self.student.parameters()).device
        # 0. The student's rollouts (sampled by the loop) as token ids, action mask and reward r(τ).
        episodes = to_episodes(p, tasks, trajs)
        texts = [e.task.text for e in episodes]
        # 1. Retrieval: n_ret observation-lite successes per task, never the task itself (spec step 2).
        with self.timer("retrieval"):
            exps = self.experiences([e.task for e in episodes])
        ids_BT, attn_BT, mask_BT = (t.to(device) for t in student_batch(episodes, self.tokenizer.pad_token_id))
        reward_B = torch.tensor([e.reward for e in episodes], dtype=torch.float32, device=device)
        # Token and trajectory means over every rank's batch (lopd.train.parallel; 1.0 in one process).
        w_tok, w_traj = self.dp.weight(mask_BT.sum()), self.dp.weight(len(episodes))
        # The teacher's prompt: the student's conversation + framing + <|LATENT_PH|> slots (spec step 4).
        tb = teacher_batch(self.tokenizer, episodes, self.n_latents, p.composer.placeholder).to(device)

        # The student's forward, kept for its update; detached, it is sg[log π_S] in δ (E2) and the
        # student side of the composer's KL (all phases see the student that sampled the batch).
        with self.timer("student_update"):
            self.student.train()
            s_logp_BTV, s_tok_BT = token_logprobs(self.student, ids_BT, attn_BT, mask_BT)

        # 2–3. Latents c_φ (spec step 3) and teacher scoring, no grad (spec step 4). Without LoRA
        # dropout the composer's forward is the same in both phases: it runs once, with grad, and
        # phase 3 reads it detached (the encoder is most of a step's cost).
        update_phi = self.opt_composer is not None and step % d.composer_every == 0
        reuse = update_phi and p.composer.lora_dropout == 0.0
        with self.timer("teacher_scoring"):
            latents_phi_BLD = self.composer(texts, exps) if reuse else None
            with torch.no_grad():
                # KL support: the teacher's top-M (spec default) or the student's (distill.kl_support).
                student_ids = s_logp_BTV.detach().topk(d.top_m, dim=-1).indices if d.kl_support == "student" else None
                latents_BLD = latents_phi_BLD.detach() if reuse else self.composer(texts, exps)
                t = teacher_logprobs(self.composer.backbone, tb, latents_BLD, ids_BT, mask_BT, top_m=d.top_m, ids_BTM=student_ids)
            ids_BTM = t.topm_ids_BTM
            delta = self.dp.average(trajectory_margin(privilege(t.token_logp_BT, s_tok_BT, mask_BT), reward_B, mask_BT), w_tok)  # Δ (E2, E3)

        # 4. Student update: reverse KL(π_S ‖ π_T) on top-M + tail per action token, teacher detached (E1).
        with self.timer("student_update"):
            kl_BT = topm_kl_per_token(s_logp_BTV.gather(-1, ids_BTM), t.topm_logp_BTM)
            kl = masked_mean(kl_BT, mask_BT)
            self.token_loss = TokenLoss(episodes, kl_BT.detach(), mask_BT)  # where the loss falls (lopd.train.decisions)
            student_norm = self.opt_student.step(kl * w_tok)
            self.student.eval()
        kl_value = self.dp.average(kl.item(), w_tok)

        # 5. Composer update on the Lagrangian, same support ids, student detached (E4).
        out = {"kl": kl_value, "delta": delta, "margin_violation": d.margin - delta, "student_grad_norm": student_norm}
        if update_phi:
            with self.timer("composer_update"):
                anchor_BLD = self.anchor.latents(texts, exps)  # c_φ₀ on the same inputs (eval mode: no dropout)
                self.composer.train()  # encoder LoRA dropout, if composer.lora_dropout > 0
                latents_BLD = latents_phi_BLD if reuse else self.composer(texts, exps)
                t_phi = teacher_logprobs(self.composer.backbone, tb, latents_BLD, ids_BT, mask_BT, ids_BTM=ids_BTM)
                kl_phi = masked_mean(topm_kl_per_token(s_logp_BTV.detach().gather(-1, ids_BTM), t_phi.topm_logp_BTM), mask_BT)  # E1
                delta_phi = trajectory_margin(privilege(t_phi.token_logp_BT, s_tok_BT, mask_BT), reward_B, mask_BT)  # Δ(φ), E2–E3
                anchor = latent_anchor(latents_BLD, anchor_BLD)  # ‖c_φ − c_φ₀‖²
                loss_phi = composer_lagrangian(kl_phi * w_tok, delta_phi * w_tok, self.beta, d.margin, anchor * w_traj, d.anchor_lambda,
                                               d.composer_kl_weight)  # E4 (weight 1 = spec)
                out["composer_grad_norm"] = self.opt_composer.step(loss_phi)
                self.composer.eval()
                # the rank average of the weighted L_φ is the global L_φ (β·m is the same on every rank)
                out.update(anchor=self.dp.average(anchor.item(), w_traj), composer_loss=self.dp.average(loss_phi.item(), 1.0))
        elif self.opt_composer is None:
            out.update(anchor=0.0)  # φ = φ₀ by construction

        # 6. Dual ascent on β with this step's Δ (E5).
        self.beta = dual_update(self.beta, d.margin, delta, d.eta_beta)
        out["beta"] = self.beta

        out["new_successes"] = self.keep_successes(trajs)  # they join the bank at the round's end
        return out

    # -- checkpointing

    def save(self, path: Path) -> None:
        super().save(path)
        if self.opt_composer is not None:
            if self.dp.is_main:
                self.composer.save(path / "composer")
            self.opt_composer.save(path / "zero-composer")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "beta": self.beta,
                "opt_composer": self.opt_composer.state_dict() if self.opt_composer is not None else None}

    def load_state_dict(self, state: dict, path: Path | None = None) -> None:
        if self.opt_composer is not None:
            if path is not None:
                self.composer.load_weights(path / "composer")
            self.opt_composer.load(state["opt_composer"], path / "zero-composer" if path else None)
        self.beta = float(state["beta"])
        super().load_state_dict(state, path)
