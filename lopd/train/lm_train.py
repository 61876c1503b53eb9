"""Masked next-token training: pre-training the base on demonstrations, SFT baselines.

Only action tokens carry loss (prompt and tool observations are context), batches are
length-bucketed so padding stays small, and the schedule is linear warm-up + cosine decay.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

import torch
from tqdm.auto import tqdm

IGNORE = -100


def make_batches(lengths: Sequence[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffle, bucket by length within windows of 16 batches, then shuffle the batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * 16
    batches = []
    for i in range(0, len(order), window):
        chunk = sorted(order[i : i + window], key=lambda j: lengths[j])
        batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids_BT``, ``attention_BT`` and ``labels_BT`` (IGNORE off the action mask)."""
    width = max(len(ids) for ids, _ in examples)
    ids_BT = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn_BT = torch.zeros_like(ids_BT)
    labels_BT = torch.full_like(ids_BT, IGNORE)
    for i, (ids, mask) in enumerate(examples):
        t = torch.tensor(ids)
        ids_BT[i, : len(ids)] = t
        attn_BT[i, : len(ids)] = 1
        labels_BT[i, : len(ids)] = torch.where(torch.tensor(mask, dtype=torch.bool), t, IGNORE)
    return ids_BT, attn_BT, labels_BT


def collate_weights(examples: Sequence[tuple], width: int) -> torch.Tensor:
    """Right-padded per-token loss weights ``weights_BT`` (an example's third element; 1.0 when absent)."""
    w_BT = torch.zeros((len(examples), width))
    for i, ex in enumerate(examples):
        w = ex[2] if len(ex) > 2 else ex[1]
        w_BT[i, : len(w)] = torch.tensor(w, dtype=torch.float)
    return w_BT


def masked_nll(model, ids_BT: torch.Tensor, attn_BT: torch.Tensor, labels_BT: torch.Tensor, weights_BT: torch.Tensor | None = None,
               *, per_token: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mean NLL of the labelled (action) tokens; with ``weights_BT``, the weighted mean.

    Projects only the positions that carry a label through the LM head: with actions a quarter
    of the tokens, this skips most of the vocabulary matmul a full ``model(labels=...)`` does.
    ``per_token``: also the detached NLL of each token, ``(B, T)`` with ``[b, t]`` = −log π(ids[b, t] | ids[b, <t])
    (0 off the labels), the mean itself computed exactly as without it.
    """
    h_BTD = model.get_decoder()(input_ids=ids_BT, attention_mask=attn_BT).last_hidden_state
    tgt_BT = labels_BT[:, 1:]
    sel_BT = tgt_BT != IGNORE
    logits_ND = model.get_output_embeddings()(h_BTD[:, :-1][sel_BT])
    if weights_BT is None:
        loss = torch.nn.functional.cross_entropy(logits_ND.float(), tgt_BT[sel_BT])
    else:
        w_N = weights_BT[:, 1:][sel_BT]
        nll_N = torch.nn.functional.cross_entropy(logits_ND.float(), tgt_BT[sel_BT], reduction="none")
        loss = (nll_N * w_N).sum() / w_N.sum()
    if not per_token:
        return loss
    with torch.no_grad():
        nll_BT = torch.zeros(labels_BT.shape, dtype=torch.float32, device=labels_BT.device)
        nll_BT[:, 1:][sel_BT] = torch.nn.functional.cross_entropy(logits_ND.detach().float(), tgt_BT[sel_BT], reduction="none")
    return loss, nll_BT


def lr_at(step: int, total: int, peak: float, warmup: int, decay_start: int | None = None) -> float:
    """Linear warm-up over ``warmup`` steps, ``peak`` until ``decay_start`` (default: right after
    the warm-up), then cosine decay to 0 at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    start = warmup if decay_start is None else max(warmup, decay_start)
    if step < start:
        return peak
    progress = (step - start) / max(1, total - start)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_causal_lm(
    model: torch.nn.Module,
    examples: Sequence[tuple],
    *,
    pad_id: int,
    epochs: int,
    lr: float,
    batch_size: int,
    warmup_frac: float = 0.05,
    decay_frac: float = 1.0,
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
    seed: int = 0,
    on_step: Callable[[int, float, float], None] | None = None,
    desc: str = "train",
) -> list[float]:
    """AdamW on the masked NLL; returns the per-step losses. ``on_step(step, loss, lr)`` logs.

    The rate warms up over ``warmup_frac`` of the steps, holds, and decays (cosine) over the
    last ``decay_frac`` of them (1 = decay right after the warm-up; 0 = constant).

    ``examples``: ``(ids, action_mask)`` or ``(ids, action_mask, weights)`` (per-token loss weights).
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    lengths = [len(ex[0]) for ex in examples]
    weighted = any(len(ex) > 2 for ex in examples)
    plan = [make_batches(lengths, batch_size, rng) for _ in range(epochs)]
    total = sum(len(p) for p in plan)
    warmup = int(warmup_frac * total)
    decay_start = total - int(round(decay_frac * total))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
    device = next(model.parameters()).device
    model.train()
    losses: list[float] = []
    with tqdm(total=total, desc=desc, unit="step", leave=False) as bar:
        for epoch_batches in plan:
            for batch in epoch_batches:
                step = len(losses)
                for group in opt.param_groups:
                    group["lr"] = lr_at(step, total, lr, warmup, decay_start)
                chunk = [examples[i] for i in batch]
                ids_BT, attn_BT, labels_BT = (x.to(device) for x in collate([ex[:2] for ex in chunk], pad_id))
                w_BT = collate_weights(chunk, ids_BT.shape[1]).to(device) if weighted else None
                loss = masked_nll(model, ids_BT, attn_BT, labels_BT, w_BT)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                opt.step()
                losses.append(loss.item())
                if on_step:
                    on_step(step, losses[-1], opt.param_groups[0]["lr"])
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
                bar.update(1)
    model.eval()
    return losses
