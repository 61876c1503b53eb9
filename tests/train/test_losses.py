"""LOPD / GRPO losses against closed forms computed by hand."""

import math

import pytest
import torch

from lopd.train.losses import (
    cold_start_loss,
    composer_kl_loss,
    composer_lagrangian,
    dual_update,
    grpo_advantages,
    grpo_policy_loss,
    latent_anchor,
    masked_mean,
    outcome_sign,
    privilege,
    student_kl_loss,
    tail_bucket,
    text_to_latent_kl,
    topm_kl_per_token,
    topm_reverse_kl,
    topm_reverse_kl_per_token,
    trajectory_margin,
)


def logp(*probs):
    """Log of a hand-written distribution, shaped (1, 1, V)."""
    return torch.tensor(probs, dtype=torch.float64).log().view(1, 1, -1)


def exact_kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


def test_topm_covering_all_mass_is_the_exact_kl():
    # Two tokens carry (numerically) no mass, so the top-3 holds everything and the tail bucket is ~0.
    p_s, p_t = [0.5, 0.3, 0.2, 0.0, 0.0], [0.2, 0.5, 0.3, 0.0, 0.0]
    s, t = logp(*[x or 1e-30 for x in p_s]), logp(*[x or 1e-30 for x in p_t])
    assert tail_bucket(s.gather(-1, torch.tensor([[[0, 1, 2]]])))[..., -1].exp().item() < 1e-6
    mask = torch.ones(1, 1)
    for support in ("teacher", "student"):
        kl = topm_reverse_kl(s, t, mask, top_m=3, support=support)
        assert kl.item() == pytest.approx(exact_kl(p_s, p_t), abs=1e-6)


def test_tail_bucket_with_real_mass_by_hand():
    s, t = logp(0.4, 0.3, 0.2, 0.1), logp(0.1, 0.2, 0.3, 0.4)
    mask = torch.ones(1, 1)
    # Teacher's top-2 = ids {3, 2}: student bins (0.1, 0.2 | tail 0.7), teacher bins (0.4, 0.3 | tail 0.3).
    by_hand_t = 0.1 * math.log(0.1 / 0.4) + 0.2 * math.log(0.2 / 0.3) + 0.7 * math.log(0.7 / 0.3)
    assert topm_reverse_kl(s, t, mask, 2, "teacher").item() == pytest.approx(by_hand_t, abs=1e-9)
    # Student's top-2 = ids {0, 1}: student (0.4, 0.3 | 0.3), teacher (0.1, 0.2 | 0.7).
    by_hand_s = 0.4 * math.log(0.4 / 0.1) + 0.3 * math.log(0.3 / 0.2) + 0.3 * math.log(0.3 / 0.7)
    assert topm_reverse_kl(s, t, mask, 2, "student").item() == pytest.approx(by_hand_s, abs=1e-9)
    with pytest.raises(ValueError, match="support"):
        topm_reverse_kl(s, t, mask, 2, "both")


def test_tail_bucket_stays_finite_when_the_sum_is_one():
    out = tail_bucket(torch.tensor([[0.5, 0.5]]).log())
    assert torch.isfinite(out).all() and out[0, -1].exp().item() < 1e-6


def test_kl_is_masked_and_normalised_by_action_tokens_in_the_batch():
    s = torch.stack([logp(0.4, 0.3, 0.2, 0.1), logp(0.25, 0.25, 0.25, 0.25), logp(0.7, 0.1, 0.1, 0.1)], dim=2)
    t = torch.stack([logp(0.1, 0.2, 0.3, 0.4), logp(0.97, 0.01, 0.01, 0.01), logp(0.1, 0.1, 0.1, 0.7)], dim=2)
    s_BTV, t_BTV = s.view(1, 3, 4).repeat(2, 1, 1), t.view(1, 3, 4).repeat(2, 1, 1)
    per_tok = topm_reverse_kl_per_token(s_BTV, t_BTV, 2)
    mask = torch.tensor([[1, 0, 1], [1, 0, 0]])
    expected = (per_tok[0, 0] + per_tok[0, 2] + per_tok[1, 0]) / 3  # 3 action tokens in the batch
    assert topm_reverse_kl(s_BTV, t_BTV, mask, 2).item() == pytest.approx(expected.item(), abs=1e-12)
    assert per_tok[0, 1] > 1.0  # the masked token would have dominated
    assert masked_mean(per_tok, torch.zeros(2, 3)).item() == 0.0


def test_precomputed_teacher_topm_matches_the_full_vocabulary_path():
    torch.manual_seed(0)
    s = torch.randn(2, 5, 50).log_softmax(-1)
    t = torch.randn(2, 5, 50).log_softmax(-1)
    top = t.topk(7, dim=-1)  # what the teacher would ship: ids + values
    assert torch.allclose(topm_kl_per_token(s.gather(-1, top.indices), top.values), topm_reverse_kl_per_token(s, t, 7))


def test_student_kl_grads_reach_only_the_student_and_composer_kl_only_the_teacher():
    torch.manual_seed(0)
    s_logits = torch.randn(2, 3, 10, requires_grad=True)
    t_logits = torch.randn(2, 3, 10, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    student_kl_loss(s_logits.log_softmax(-1), t_logits.log_softmax(-1), mask, 4).backward()
    assert t_logits.grad is None and s_logits.grad.abs().sum() > 0
    assert s_logits.grad[0, 2].abs().sum() == 0 and s_logits.grad[1, 0].abs().sum() == 0  # masked tokens get none
    s_logits.grad = None
    composer_kl_loss(s_logits.log_softmax(-1), t_logits.log_softmax(-1), mask, 4).backward()
    assert s_logits.grad is None and t_logits.grad.abs().sum() > 0


def test_privilege_sign_and_stop_gradient():
    t_tok = torch.tensor([[-0.5, -2.0, -1.0]], requires_grad=True)
    s_tok = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    delta = privilege(t_tok, s_tok, mask)
    assert delta.tolist() == [[0.5, -1.0, 0.0]]  # teacher more confident → δ > 0; masked → 0
    delta.sum().backward()
    assert s_tok.grad is None and t_tok.grad.tolist() == [[1.0, 1.0, 0.0]]


def test_trajectory_margin_weights_by_outcome():
    assert outcome_sign(torch.tensor([1.0, 0.0, 0.5])).tolist() == [1.0, -1.0, 0.0]
    delta = torch.tensor([[0.2, 0.4, 9.0], [0.1, 0.3, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    reward = torch.tensor([1.0, 0.0])
    by_hand = (0.2 + 0.4 - 0.1 - 0.3 - 0.5) / 5
    assert trajectory_margin(delta, reward, mask).item() == pytest.approx(by_hand, abs=1e-7)


def test_lagrangian_and_anchor_value():
    c = torch.ones(1, 2, 3, requires_grad=True)  # 2 latents of width 3
    c0 = torch.zeros(1, 2, 3)
    anchor = latent_anchor(c, c0)
    assert anchor.item() == 3.0  # each latent is at squared distance 3; mean over the 2 latents
    loss = composer_lagrangian(torch.tensor(0.3), torch.tensor(0.01), beta=2.0, margin=0.05, anchor=anchor, anchor_lambda=0.2)
    assert loss.item() == pytest.approx(0.3 + 2.0 * (0.05 - 0.01) + 0.2 * 3.0)
    loss.backward()
    assert torch.allclose(c.grad, torch.full_like(c, 0.2 * 2.0 / 2))  # λ · 2(c − c0) / (B·K)


def test_lagrangian_kl_weight_zero_drops_the_kl_term():
    kl = torch.tensor(0.3, requires_grad=True)
    loss = composer_lagrangian(kl, torch.tensor(0.01), beta=2.0, margin=0.05, anchor=torch.tensor(3.0), anchor_lambda=0.2, kl_weight=0.0)
    assert loss.item() == pytest.approx(2.0 * (0.05 - 0.01) + 0.2 * 3.0)
    loss.backward()
    assert kl.grad.item() == 0.0  # the teacher is no longer pulled towards the student
    half = composer_lagrangian(torch.tensor(0.3), torch.tensor(0.01), 2.0, 0.05, torch.tensor(3.0), 0.2, kl_weight=0.5)
    assert half.item() == pytest.approx(0.15 + 2.0 * 0.04 + 0.6)


def test_text_to_latent_kl_is_the_forward_kl_from_the_text_teacher():
    p_text, p_lat = [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]
    text, lat = logp(*p_text), logp(*p_lat).requires_grad_(True)
    ids = torch.tensor([[[0, 1, 2]]])
    kl = text_to_latent_kl(text.gather(-1, ids), lat.gather(-1, ids), torch.ones(1, 1))
    assert kl.item() == pytest.approx(exact_kl(p_text, p_lat), abs=1e-6)  # KL(text ‖ latent), not the reverse
    assert kl.item() != pytest.approx(exact_kl(p_lat, p_text), abs=1e-3)
    # on a top-2 support the rest is one tail bin: (0.6, 0.3, 0.1) against (0.2, 0.5, 0.3)
    top2 = text_to_latent_kl(text[..., :2], lat[..., :2], torch.ones(1, 1))
    assert top2.item() == pytest.approx(exact_kl(p_text, p_lat), abs=1e-6)  # the tail bin is token 2 exactly
    kl.backward()
    assert lat.grad.abs().sum() > 0  # the latent side learns; the text side is a fixed target


def test_cold_start_loss_objectives():
    nll, kl = torch.tensor(0.5), torch.tensor(0.2)
    assert cold_start_loss(nll, None, "nll", 2.0).item() == 0.5
    assert cold_start_loss(None, kl, "text_kl", 2.0).item() == pytest.approx(0.2)
    assert cold_start_loss(nll, kl, "mix", 2.0).item() == pytest.approx(0.5 + 2.0 * 0.2)  # xRAG's weight 2
    with pytest.raises(ValueError, match="cold_start.objective"):
        cold_start_loss(nll, kl, "autoencode", 1.0)


def test_dual_update_ascends_and_clips_at_zero():
    assert dual_update(0.1, margin=0.05, margin_delta=0.0, eta_beta=0.5) == pytest.approx(0.125)
    assert dual_update(0.1, margin=0.05, margin_delta=0.5, eta_beta=0.5) == 0.0  # 0.1 − 0.225 < 0
    assert dual_update(0.0, margin=0.05, margin_delta=torch.tensor(0.2), eta_beta=0.5) == 0.0


def test_grpo_advantages_by_hand():
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5]]), eps=1e-12)
    std = math.sqrt(4 * 0.25 / 3)  # unbiased std of (1, 0, 1, 0)
    assert torch.allclose(adv[0], torch.tensor([0.5, -0.5, 0.5, -0.5]) / std)
    assert adv[1].abs().max().item() == 0.0  # equal rewards → no signal
    assert torch.isfinite(grpo_advantages(torch.ones(1, 3))).all()
    # Dr. GRPO: centred only, so a 1-of-4 group and a 2-of-4 group keep their reward scale
    dr = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]]), scale="none")
    assert torch.allclose(dr, torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.5, -0.5, 0.5, -0.5]]))


def test_grpo_policy_loss_clips_the_ratio():
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.5, 0.0], [0.5, 0.0]], requires_grad=True)  # ratio e^0.5 ≈ 1.65 at t=0
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss = grpo_policy_loss(logp, old, adv, mask, clip_eps=0.2)
    # A=+1: min(1.65, 1.2) = 1.2 and 1 ; A=−1: min(−1.65, −1.2) = −1.65 ; masked token excluded.
    by_hand = -(1.2 + 1.0 - math.exp(0.5)) / 3
    assert loss.item() == pytest.approx(by_hand, abs=1e-6)
    loss.backward()
    assert logp.grad[0, 0] == 0.0  # clipped: no gradient
    assert logp.grad[1, 0].item() == pytest.approx(math.exp(0.5) / 3, abs=1e-6)
    assert logp.grad[1, 1] == 0.0
