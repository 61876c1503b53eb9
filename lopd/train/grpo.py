"""The GRPO baseline: group-normalised advantages and the clipped ratio, at LOPD's rollout budget.

Per step: ``batch_tasks / G`` train tasks × ``G`` samples (the same ``batch_tasks`` generations
as one LOPD step, see ``lopd.train.onpolicy``), rewards from the environment, advantages
``(r − mean_group) / (std_group + ε)`` per task, then ``grpo.updates_per_batch`` Adam steps on
the token-level clipped surrogate (``lopd.train.losses.grpo_policy_loss``). No KL-to-reference term
(as DAPO / Dr. GRPO; the spec's baseline does not name one).

Old log-probs (the ratio's denominator). The engine records each token's log-prob under the
*sampling* distribution (after temperature and top-p), which is not the policy π(·|s) whose
ratio PPO clips, and top-p renormalisation cannot be undone exactly. So π_old is recomputed by
the current model at temperature 1, without grad, right before the first update: the ratio is
then exactly 1 on the first update (a plain policy gradient with group advantages, as TRL with
one iteration) and the clip acts from the second update on. Temperature 1 is used on both sides
of the ratio, as in the student's KL of LOPD; the samples still come from the tempered policy,
the usual approximation.
"""

from __future__ import annotations

from typing import Sequence

import torch

from lopd.config import Params
from lopd.policy.scoring import token_logprobs
from lopd.train.episodes import Episode, Timer, TokenLoss, student_batch, to_episodes
from lopd.train.losses import grpo_advantages, grpo_token_loss, masked_mean
from lopd.train.onpolicy import tasks_per_step
from lopd.train.parallel import DataParallel
from lopd.train.updater import make_updater, save_hf


def grpo_update(
    model,
    updater,
    episodes: Sequence[Episode],
    reward_NG: torch.Tensor,
    *,
    clip_eps: float,
    updates: int,
    pad_id: int,
    dp: DataParallel = DataParallel(),
    scale_rewards: str = "group",
    record: dict | None = None,
) -> dict[str, float]:
    """``updates`` clipped-ratio steps on one group batch; ``episodes`` are task-major (row n·G + g).

    ``updater`` is the optimiser step (``lopd.train.updater``). Returns the first update's loss
    and the mean clip fraction over the updates (the share of action tokens whose ratio left
    ``[1 − ε, 1 + ε]``), both over every rank's tokens (``dp``: this rank's groups are its shard).
    ``record``, when given, receives the first update's per-token loss as ``token_loss`` (a ``TokenLoss``).
    """
    n, g = reward_NG.shape
    if len(episodes) != n * g:
        raise ValueError(f"{len(episodes)} episodes for a {n}×{g} reward grid")
    device = next(model.parameters()).device
    adv_B = grpo_advantages(reward_NG.float(), scale=scale_rewards).reshape(-1).to(device)
    ids_BT, attn_BT, mask_BT = (t.to(device) for t in student_batch(episodes, pad_id))
    with torch.no_grad():  # π_old at temperature 1 (module docstring)
        _, old_logp_BT = token_logprobs(model, ids_BT, attn_BT, mask_BT)
    w_tok, w_traj, w_group = dp.weight(mask_BT.sum()), dp.weight(n * g), dp.weight(n)  # local means → global (lopd.train.parallel)
    losses, clip_fracs, norms = [], [], []
    model.train()
    for _ in range(updates):
        _, logp_BT = token_logprobs(model, ids_BT, attn_BT, mask_BT)
        loss_BT = grpo_token_loss(logp_BT, old_logp_BT, adv_B, clip_eps)
        loss = masked_mean(loss_BT, mask_BT)  # lopd.train.losses.grpo_policy_loss
        if record is not None and not losses:
            record["token_loss"] = TokenLoss(episodes, loss_BT.detach(), mask_BT)
        with torch.no_grad():
            ratio_BT = torch.exp(logp_BT - old_logp_BT)
            clip_fracs.append(dp.average(masked_mean(((ratio_BT - 1.0).abs() > clip_eps).float(), mask_BT), w_tok))
        norms.append(updater.step(loss * w_tok))
        losses.append(dp.average(loss.item(), w_tok))
    model.eval()
    return {
        "loss": losses[0],
        "clip_frac": sum(clip_fracs) / len(clip_fracs),
        "grad_norm": norms[0],
        "adv_abs_mean": dp.average(adv_B.abs().mean(), w_traj),
        "zero_adv_groups": dp.average((reward_NG.float().std(dim=1) == 0).float().mean(), w_group),
    }


class GRPOTrainer:
    """GRPO on a trainable student; ``step`` consumes one batch of ``G`` rollouts per task."""

    name = "grpo"

    def __init__(self, p: Params, student, tokenizer, dp: DataParallel = DataParallel()):
        self.p, self.student, self.tokenizer, self.dp = p, student, tokenizer, dp
        self.samples_per_task = p.grpo.group_size
        self.tasks_per_step = tasks_per_step(p, "grpo")
        self.opt_student = make_updater(p, student, list(student.parameters()), p.grpo.lr, dp)
        self.timer = Timer()

    def step(self, step: int, tasks: Sequence, trajs: Sequence) -> dict[str, float]:
        g = self.samples_per_task
        episodes = to_episodes(self.p, tasks, trajs)
        reward_NG = torch.tensor([tr.reward for tr in trajs], dtype=torch.float32).reshape(len(trajs) // g, g)
        record: dict = {}
        with self.timer("policy_update"):
            out = grpo_update(
                self.student, self.opt_student, episodes, reward_NG, clip_eps=self.p.grpo.clip_eps,
                updates=self.p.grpo.updates_per_batch, pad_id=self.tokenizer.pad_token_id, dp=self.dp,
                scale_rewards=self.p.grpo.scale_rewards, record=record,
            )
        self.token_loss = record["token_loss"]  # where the loss falls (lopd.train.decisions)
        return out

    def end_round(self, round_: int) -> None:
        """GRPO keeps no bank: nothing to refresh."""

    def save(self, path) -> None:
        save_hf(self.student, self.tokenizer, path / "student", self.opt_student, self.dp)
        self.opt_student.save(path / "zero-student")

    def state_dict(self) -> dict:
        return {"opt": self.opt_student.state_dict()}

    def load_state_dict(self, state: dict, path=None) -> None:
        self.opt_student.load(state["opt"], path / "zero-student" if path else None)
