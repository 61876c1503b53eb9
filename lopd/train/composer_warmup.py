"""Autoencoding warm-up of the latent composer, before its cold start (``cold_start.warmup_steps``).

The teacher is a frozen base that has only ever read token embeddings. Before the cold-start
objective asks the latents to *help* it, the warm-up teaches the composer to *write* what it can
read: for each (current task, retrieved experience) pair, its K latents are regressed onto the
input embeddings of the experience's last K tokens, in order (shorter experiences are padded on
the left with the pad token's embedding). The end of an observation-lite trajectory is where an
app's conventions show (the main call's value format, the commit); its start restates the task.
Compression systems for frozen decoders (ICAE, 500xCompressor) pre-train their encoders by
autoencoding in the same spirit.

Why the last K and not the whole text: K slots hold K token embeddings at most; on the demo
base, the teacher reading the true embeddings of the last 32 tokens of each of its three
experiences succeeds 0.615 on dev against 0.315 for the first 32 (docs/results.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from lopd.latent.composer import Composer, encoder_text
from lopd.policy.chat import encode
from lopd.train.losses import latent_reconstruction


@dataclass(frozen=True)
class WarmupResult:
    losses: list[float]
    token_accuracy: float  # held-out pairs: latents whose nearest embedding row is the target token


def target_ids(tokenizer, experiences: Sequence[str], k: int, end: str = "last") -> Tensor:
    """``(N, K)`` ids of each experience's last ``k`` tokens, left-padded with the pad id
    (``end="first"``: its first ``k``, right-padded; the ceiling benchmark's other row)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out = torch.full((len(experiences), k), pad, dtype=torch.long)
    for i, text in enumerate(experiences):
        ids = encode(tokenizer, text)
        if end == "last" and ids[-k:]:
            out[i, k - len(ids[-k:]):] = torch.tensor(ids[-k:], dtype=torch.long)
        elif end == "first" and ids:
            out[i, : len(ids[:k])] = torch.tensor(ids[:k], dtype=torch.long)
    return out


class TokenEmbeddingLatents:
    """A stand-in composer whose latents are the *true* embeddings of each experience's ``end`` K
    tokens: the best any K latents per experience that imitate tokens could do (a ceiling)."""

    def __init__(self, model, tokenizer, k: int, end: str = "last"):
        self.embed, self.tokenizer, self.k, self.end = model.get_input_embeddings(), tokenizer, k, end

    @torch.no_grad()
    def __call__(self, tasks: Sequence[str], experiences: Sequence[Sequence[str]]) -> Tensor:
        ids_BL = torch.stack([target_ids(self.tokenizer, exps, self.k, self.end).reshape(-1) for exps in experiences])
        return self.embed(ids_BL.to(self.embed.weight.device)).float()


def _embeddings(composer: Composer) -> Tensor:
    """The frozen backbone's input-embedding matrix ``(V, D)`` in the resampler's dtype (a constant)."""
    weight = composer.backbone.get_base_model().get_input_embeddings().weight
    return weight.detach().to(composer.resampler.queries.dtype)


def _latents(composer: Composer, pairs: Sequence[tuple[str, str]]) -> Tensor:
    """``(N, K, D)``: one row of latents per (task, experience) pair."""
    return composer.encode(*composer.tokenize([encoder_text(t, x) for t, x in pairs]))


@torch.no_grad()
def token_accuracy(composer: Composer, tokenizer, pairs: Sequence[tuple[str, str]], batch_size: int = 16) -> float:
    """Share of non-pad target slots whose latent's nearest embedding row (L2) is the target token."""
    emb_VD = _embeddings(composer)
    k = composer.resampler.queries.shape[0]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    hit = total = 0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        ids_NK = target_ids(tokenizer, [x for _, x in chunk], k).to(emb_VD.device)
        lat_NKD = _latents(composer, chunk)
        nearest_NK = torch.cdist(lat_NKD.reshape(-1, lat_NKD.shape[-1]), emb_VD).argmin(-1).reshape(ids_NK.shape)
        real_NK = ids_NK != pad
        hit += int((nearest_NK == ids_NK)[real_NK].sum())
        total += int(real_NK.sum())
    return hit / max(1, total)


def warmup(
    composer: Composer, tokenizer, pairs: Sequence[tuple[str, str]], eval_pairs: Sequence[tuple[str, str]],
    steps: int, lr: float, batch_size: int, grad_clip: float, seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> WarmupResult:
    """``steps`` AdamW steps of latent reconstruction on batches drawn from ``pairs``; 10 % linear warm-up, then cosine."""
    if not pairs:
        raise ValueError("composer warm-up: no (task, experience) pairs to train on")
    emb_VD = _embeddings(composer)
    scale = float(emb_VD.pow(2).sum(-1).mean())  # E‖e‖²: the loss is 1.0 for latents at 0, whatever the width
    k = composer.resampler.queries.shape[0]
    targets = {x: target_ids(tokenizer, [x], k)[0] for x in {x for _, x in pairs}}
    params = composer.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=max(1, steps // 10), num_training_steps=steps)
    rng, pairs = random.Random(seed), list(pairs)
    losses = []
    composer.train()
    for step in tqdm(range(steps), desc="composer warm-up (autoencoding)", unit="step", leave=False):
        batch = rng.sample(pairs, min(batch_size, len(pairs)))
        target_NKD = emb_VD[torch.stack([targets[x] for _, x in batch]).to(emb_VD.device)]
        loss = latent_reconstruction(_latents(composer, batch), target_NKD, scale)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if on_step:
            on_step(step, losses[-1])
    composer.eval()
    return WarmupResult(losses, token_accuracy(composer, tokenizer, eval_pairs) if eval_pairs else float("nan"))
