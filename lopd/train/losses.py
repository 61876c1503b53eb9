"""LOPD and GRPO losses as pure functions on tensors (docs/method.md, "Losses": Eq. 1–5).

Shapes are suffixes: B = trajectories, T = token positions, V = vocabulary, M = top-M support,
G = rollouts per GRPO group, K/D = latents and their width. Every per-token tensor is indexed
by *target* position: ``logp_BTV[b, t]`` is the distribution over token ``t`` of row ``b``
given tokens ``< t`` (``lopd.latent.teacher.score_targets`` produces this layout), and ``mask_BT``
marks the action tokens — the only ones any loss is taken on.

Nothing here detaches unless its name says so: the student objective (``student_kl_loss``)
detaches the teacher, the composer objective (``composer_kl_loss``) detaches the student.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Support = Literal["teacher", "student"]

# log(1 − Σp) needs Σp < 1; clamping log Σp at −1e-7 keeps the tail bucket finite (≈ −16 nats)
# when the top-M holds all the mass, as the SDPO reference does.
TAIL_LOG_MAX = -1e-7


def masked_mean(x_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """Σ x·mask / Σ mask over the whole batch (token-level mean; 0 when the mask is empty)."""
    mask_BT = mask_BT.to(x_BT.dtype)
    return (x_BT * mask_BT).sum() / mask_BT.sum().clamp(min=1.0)


# ----------------------------------------------------------------------------- reverse KL


def tail_bucket(logp_BTM: Tensor, log_max: float = TAIL_LOG_MAX) -> Tensor:
    """``logp_BTM`` with one more bin, ``log(1 − Σ_M exp(logp))``: shape (..., M+1).

    The sum is clamped below 1 (``log Σ ≤ log_max``) so the tail stays finite when the top-M
    covers all the mass; ``log(−expm1(·))`` is the stable ``log(1 − exp(·))``.
    """
    log_sum = torch.logsumexp(logp_BTM, dim=-1, keepdim=True).clamp(max=log_max)
    return torch.cat([logp_BTM, torch.log(-torch.expm1(log_sum))], dim=-1)


def topm_support(student_logp_BTV: Tensor, teacher_logp_BTV: Tensor, top_m: int, support: Support = "teacher") -> Tensor:
    """Token ids of the KL support, ``(B, T, M)``: the top-M of the teacher (public code) or the student (SDPO/TRL)."""
    if support not in ("teacher", "student"):
        raise ValueError(f"support = {support!r}: allowed 'teacher' or 'student'")
    source = teacher_logp_BTV if support == "teacher" else student_logp_BTV
    with torch.no_grad():  # ids are a selection, not a function to differentiate
        return source.topk(top_m, dim=-1).indices


def topm_kl_per_token(p_logp_BTM: Tensor, q_logp_BTM: Tensor) -> Tensor:
    """``KL(p ‖ q) = Σ p (log p − log q)`` over the M gathered bins + one tail bin each: ``(B, T)``.

    ``p_logp_BTM`` / ``q_logp_BTM`` are full-vocabulary log-probs gathered at the same M ids.
    """
    p_BTM1, q_BTM1 = tail_bucket(p_logp_BTM), tail_bucket(q_logp_BTM)
    return (p_BTM1.exp() * (p_BTM1 - q_BTM1)).sum(-1)


def topm_reverse_kl_per_token(
    student_logp_BTV: Tensor, teacher_logp_BTV: Tensor, top_m: int, support: Support = "teacher"
) -> Tensor:
    """Reverse ``KL(π_S ‖ π_T)`` on top-M + tail at every position, ``(B, T)`` (spec: reverse KL).

    Both inputs are full-vocabulary log-softmaxes ``(B, T, V)``; the support ids come from
    ``support``'s top-M and both sides are gathered there.
    """
    ids_BTM = topm_support(student_logp_BTV, teacher_logp_BTV, top_m, support)
    return topm_kl_per_token(student_logp_BTV.gather(-1, ids_BTM), teacher_logp_BTV.gather(-1, ids_BTM))


def topm_reverse_kl(
    student_logp_BTV: Tensor, teacher_logp_BTV: Tensor, mask_BT: Tensor, top_m: int, support: Support = "teacher"
) -> Tensor:
    """Scalar reverse KL: per-token KL summed over action tokens / number of action tokens in the batch.

    Gradients flow into whichever side is not detached by the caller; see ``student_kl_loss``
    and ``composer_kl_loss`` for the two objectives.
    """
    return masked_mean(topm_reverse_kl_per_token(student_logp_BTV, teacher_logp_BTV, top_m, support), mask_BT)


def student_kl_loss(
    student_logp_BTV: Tensor, teacher_logp_BTV: Tensor, mask_BT: Tensor, top_m: int, support: Support = "teacher"
) -> Tensor:
    """Student objective: the reverse KL with the teacher side detached (spec: gradients only through p_S)."""
    return topm_reverse_kl(student_logp_BTV, teacher_logp_BTV.detach(), mask_BT, top_m, support)


def composer_kl_loss(
    student_logp_BTV: Tensor, teacher_logp_BTV: Tensor, mask_BT: Tensor, top_m: int, support: Support = "teacher"
) -> Tensor:
    """The KL term of L_φ: the same reverse KL with the student detached, so it moves only the teacher's latents."""
    return topm_reverse_kl(student_logp_BTV.detach(), teacher_logp_BTV, mask_BT, top_m, support)


# ----------------------------------------------------------------------------- privilege and margin


def privilege(teacher_token_logp_BT: Tensor, student_token_logp_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """δ_t = log π_T(a_t | s_t, c) − sg[log π_S(a_t | s_t)] at the sampled tokens; 0 off the mask. ``(B, T)``."""
    return (teacher_token_logp_BT - student_token_logp_BT.detach()) * mask_BT.to(teacher_token_logp_BT.dtype)


def outcome_sign(reward_B: Tensor) -> Tensor:
    """A(τ) = 2·r(τ) − 1: +1 for a success (r = 1), −1 for a failure (r = 0). ``(B,)``."""
    return 2.0 * reward_B - 1.0


def trajectory_margin(delta_BT: Tensor, reward_B: Tensor, mask_BT: Tensor) -> Tensor:
    """Δ(φ) = mean over (τ, t) of A(τ)·δ_t — a token-level masked mean over every action token in the batch.

    Long trajectories weigh more than short ones (each action token counts once), matching the
    KL's normalisation by the number of action tokens.
    """
    return masked_mean(outcome_sign(reward_B).to(delta_BT.dtype)[:, None] * delta_BT, mask_BT)


# ----------------------------------------------------------------------------- composer objective


def latent_anchor(latents_BKD: Tensor, anchor_latents_BKD: Tensor) -> Tensor:
    """‖c_φ − c_φ₀‖²: squared L2 distance per latent vector (summed over D), averaged over the B·K latents.

    Summing over D keeps the literal ‖·‖² of each latent token; averaging over B·K makes the
    term independent of batch size, n_ret and K. ``anchor_latents_BKD`` is treated as a constant.
    """
    return (latents_BKD - anchor_latents_BKD.detach()).pow(2).sum(-1).mean()


def composer_lagrangian(
    kl: Tensor, margin_delta: Tensor, beta: float, margin: float, anchor: Tensor, anchor_lambda: float, kl_weight: float = 1.0
) -> Tensor:
    """L_φ = w·KL + β·(m − Δ(φ)) + λ·‖c_φ − c_φ₀‖² (spec: composer objective, w = 1). All inputs scalars.

    ``kl_weight`` w = 0 drops the KL term: minimised over φ it pulls the teacher towards the
    student, which is the opposite of keeping a margin (``distill.composer_kl_weight``).
    """
    return kl_weight * kl + beta * (margin - margin_delta) + anchor_lambda * anchor


# ----------------------------------------------------------------------------- cold start


def text_to_latent_kl(text_logp_BTM: Tensor, latent_logp_BTM: Tensor, mask_BT: Tensor) -> Tensor:
    """Scalar KL(T_text ‖ T_latent) per action token, on the text teacher's top-M + tail.

    ``text_logp_BTM``: the frozen base with the experiences written as text (the target, detached
    here); ``latent_logp_BTM``: the same base with the composer's latents, gathered at the same ids.
    Forward KL, so the latents must cover every action the text teacher finds likely.
    """
    return masked_mean(topm_kl_per_token(text_logp_BTM.detach(), latent_logp_BTM), mask_BT)


def cold_start_loss(
    nll: Tensor | None, text_kl: Tensor | None, objective: Literal["nll", "text_kl", "mix"], kl_weight: float
) -> Tensor:
    """The cold-start objective: the paper's NLL, the text KL, or ``nll + kl_weight·text_kl``. Scalars."""
    if objective == "nll":
        return nll
    if objective == "text_kl":
        return text_kl
    if objective == "mix":
        return nll + kl_weight * text_kl
    raise ValueError(f"cold_start.objective = {objective!r}: allowed nll, text_kl, mix")


def latent_reconstruction(latents_NKD: Tensor, target_NKD: Tensor, scale: float) -> Tensor:
    """Scalar ‖c_φ − e‖² per latent slot (summed over D, averaged over N·K), divided by ``scale``.

    ``target_NKD``: the token embeddings the latents should reproduce (a constant); ``scale``: the
    mean squared norm of an embedding row, so latents at the origin score 1.0 on any backbone.
    The composer's autoencoding warm-up (``lopd.train.composer_warmup``).
    """
    return (latents_NKD - target_NKD.detach()).pow(2).sum(-1).mean() / scale


def dual_update(beta: float, margin: float, margin_delta: float | Tensor, eta_beta: float) -> float:
    """Dual ascent on β: β ← max(0, β + η_β·(m − Δ)). Grows while the teacher's margin is short of m."""
    return max(0.0, float(beta) + eta_beta * (margin - float(margin_delta)))


# ----------------------------------------------------------------------------- GRPO baseline


def grpo_advantages(reward_NG: Tensor, eps: float = 1e-4, scale: Literal["group", "none"] = "group") -> Tensor:
    """Group-normalised advantages (r − mean_group) / (std_group + eps), ``(N, G)`` → ``(N, G)``.

    One row per task, one column per rollout. The std is the unbiased sample std, as in TRL's
    GRPOTrainer; a group whose rewards are all equal gets advantage 0. ``scale="none"`` keeps
    r − mean_group unscaled (Dr. GRPO: the std division over-weights near-unanimous groups).
    """
    if scale not in ("group", "none"):
        raise ValueError(f"grpo.scale_rewards = {scale!r}: allowed group, none")
    centred_NG = reward_NG - reward_NG.mean(dim=1, keepdim=True)
    return centred_NG / (reward_NG.std(dim=1, keepdim=True) + eps) if scale == "group" else centred_NG


def grpo_token_loss(logp_BT: Tensor, old_logp_BT: Tensor, advantage_B: Tensor, clip_eps: float) -> Tensor:
    """The clipped surrogate's loss per token, −min(ρA, clip(ρ, 1±ε)A): ``(B, T)`` (unmasked)."""
    ratio_BT = torch.exp(logp_BT - old_logp_BT.detach())
    adv_B1 = advantage_B.to(logp_BT.dtype)[:, None]
    return -torch.minimum(ratio_BT * adv_B1, ratio_BT.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv_B1)


def grpo_policy_loss(
    logp_BT: Tensor, old_logp_BT: Tensor, advantage_B: Tensor, mask_BT: Tensor, clip_eps: float
) -> Tensor:
    """PPO clipped-ratio loss, token level: −Σ min(ρA, clip(ρ, 1±ε)A)·mask / Σ mask.

    ``logp_BT`` are the current policy's log-probs of the sampled tokens (with grad),
    ``old_logp_BT`` those the rollout was sampled with, ``advantage_B`` one value per trajectory.
    Normalising by all action tokens in the batch (not per sequence) is the token-level
    aggregation of DAPO / TRL's ``loss_type="dapo"``.
    """
    return masked_mean(grpo_token_loss(logp_BT, old_logp_BT, advantage_B, clip_eps), mask_BT)
