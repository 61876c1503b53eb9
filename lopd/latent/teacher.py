"""Teacher conditioning (spec: pipeline step 4): latent slots in the teacher's prompt, scored on the student's tokens.

The teacher prompt is the student's conversation with one framing sentence added to the
system message, ending in the ``<|LATENT_PH|>`` sentinel. The rendered text is split at the
sentinel and the pieces encoded separately, with ``n_ret × K`` slots between them, so a real
Qwen3 tokenizer that has no such token works the same as the embedded one.

Rollout ids are append-only (``lopd.policy.rollout``): a trajectory = student prompt ids + actions +
observation chunks. The teacher's ids are therefore the teacher prompt ids followed by the
student's ids after the student prompt; the action mask moves by the length difference, and
teacher and student score exactly the same action tokens.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Sequence

import torch
from peft import PeftModel
from torch import Tensor

from lopd.policy.chat import LATENT_PH, encode, render_prompt
from lopd.policy.scoring import base_model, scatter_targets, target_logprobs

LATENT_FRAMING = "Here are compressed past experiences on similar tasks: {placeholder}"


# ----------------------------------------------------------------------------- prompt


def add_latent_placeholder(messages: list[dict], placeholder: str = LATENT_PH, framing: str = LATENT_FRAMING) -> list[dict]:
    """The student's messages with the framing sentence (and its placeholder) closing the system message.

    Without a system message, one holding only the framing is put first.
    """
    line = framing.format(placeholder=placeholder)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{line}"
    else:
        out.insert(0, {"role": "system", "content": line})
    return out


@dataclass(frozen=True)
class TeacherPrompt:
    ids: list[int]
    latent_mask: list[int]  # 1 = a latent slot (its id is a filler; its embedding is replaced)


def split_at_placeholder(tokenizer, text: str, n_latents: int, placeholder: str = LATENT_PH) -> TeacherPrompt:
    """Encode ``text`` around its single ``placeholder`` with ``n_latents`` slots in its place."""
    found = text.count(placeholder)
    if found != 1:
        what = "is missing" if found == 0 else f"appears {found} times"
        raise ValueError(f"the teacher prompt needs the latent placeholder {placeholder!r} exactly once; it {what}")
    before, after = text.split(placeholder)
    # The slot id never reaches the model (its embedding is replaced); the placeholder's own id
    # where the tokenizer has one makes decoded teacher ids readable.
    filler = tokenizer.convert_tokens_to_ids(placeholder)
    if filler is None or filler == tokenizer.unk_token_id:
        filler = tokenizer.pad_token_id or 0
    head, tail = encode(tokenizer, before), encode(tokenizer, after)
    return TeacherPrompt(head + [filler] * n_latents + tail, [0] * len(head) + [1] * n_latents + [0] * len(tail))


def teacher_prompt(
    tokenizer, messages: list[dict], n_latents: int, placeholder: str = LATENT_PH, framing: str = LATENT_FRAMING
) -> TeacherPrompt:
    """The teacher's prompt ids for the student's initial ``messages`` with ``n_latents`` (= n_ret·K) slots."""
    return split_at_placeholder(tokenizer, render_prompt(tokenizer, add_latent_placeholder(messages, placeholder, framing)), n_latents, placeholder)


# ----------------------------------------------------------------------------- alignment


@dataclass(frozen=True)
class TeacherExample:
    ids: list[int]
    action_mask: list[int]
    latent_mask: list[int]
    shift: int  # teacher position = student position + shift, for every token after the prompt


def align_to_student(prompt: TeacherPrompt, student_ids: Sequence[int], student_action_mask: Sequence[int], student_prompt_len: int) -> TeacherExample:
    """Teacher ids = teacher prompt + the student's ids after its prompt; masks shifted to match."""
    if any(student_action_mask[:student_prompt_len]):
        raise ValueError("the student's action mask marks tokens inside its prompt; prompt_len is wrong")
    rest = list(student_ids[student_prompt_len:])
    pad = [0] * len(rest)
    return TeacherExample(
        ids=prompt.ids + rest,
        action_mask=[0] * len(prompt.ids) + list(student_action_mask[student_prompt_len:]),
        latent_mask=prompt.latent_mask + pad,
        shift=len(prompt.ids) - student_prompt_len,
    )


def teacher_example(tokenizer, messages: list[dict], trajectory, n_latents: int, placeholder: str = LATENT_PH) -> TeacherExample:
    """``align_to_student`` for a rollout ``Trajectory`` whose prompt was rendered from ``messages``."""
    student_prompt = trajectory.token_ids[: trajectory.prompt_len]
    if student_prompt != encode(tokenizer, render_prompt(tokenizer, messages)):
        raise ValueError(f"trajectory {trajectory.rollout_id}: its prompt ids are not the rendering of the given messages")
    return align_to_student(teacher_prompt(tokenizer, messages, n_latents, placeholder), trajectory.token_ids, trajectory.action_mask, trajectory.prompt_len)


@dataclass
class TeacherBatch:
    ids_BT: Tensor
    attn_BT: Tensor
    latent_mask_BT: Tensor  # bool
    action_mask_BT: Tensor  # bool, teacher positions

    def to(self, device) -> "TeacherBatch":
        return TeacherBatch(*(t.to(device) for t in (self.ids_BT, self.attn_BT, self.latent_mask_BT, self.action_mask_BT)))


def collate_teacher(examples: Sequence[TeacherExample], pad_id: int) -> TeacherBatch:
    """Right-padded tensors (real tokens keep positions 0..n-1, as in the student's forward)."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn, lat, act = (torch.zeros((len(examples), width), dtype=dt) for dt in (torch.long, torch.bool, torch.bool))
    for i, e in enumerate(examples):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids, dtype=torch.long)
        attn[i, :n] = 1
        lat[i, :n] = torch.tensor(e.latent_mask, dtype=torch.bool)
        act[i, :n] = torch.tensor(e.action_mask, dtype=torch.bool)
    return TeacherBatch(ids, attn, lat, act)


def text_teacher_batch(tokenizer, episodes: Sequence, texts: Sequence[str | None]) -> TeacherBatch:
    """Teacher rows with ``texts[i]`` *as text* in episode i's framing sentence (no latent slots).

    ``None`` keeps the student's own prompt (no framing at all). Episodes carry ``messages``,
    ``token_ids``, ``action_mask`` and ``prompt_len`` (``lopd.train.episodes.Episode``). The text-privilege
    teacher (the ``opsd`` baseline) and the ``privilege`` stage score with these rows.
    """
    examples = []
    for e, text in zip(episodes, texts, strict=True):
        messages = e.messages if text is None else add_latent_placeholder(e.messages, placeholder=text)
        prompt_ids = encode(tokenizer, render_prompt(tokenizer, messages))
        examples.append(align_to_student(TeacherPrompt(prompt_ids, [0] * len(prompt_ids)), e.token_ids, e.action_mask, e.prompt_len))
    return collate_teacher(examples, tokenizer.pad_token_id)


# ----------------------------------------------------------------------------- scoring


def inject_latents(backbone, ids_BT: Tensor, latent_mask_BT: Tensor, latents_BLD: Tensor) -> Tensor:
    """Token embeddings of ``ids_BT`` with the ``L`` latent slots of each row replaced by ``latents_BLD``, in order.

    ``masked_scatter`` is differentiable in the latents: the teacher's loss reaches the composer.
    """
    embeds_BTD = base_model(backbone).get_input_embeddings()(ids_BT)
    per_row = latent_mask_BT.sum(1)
    if latents_BLD.shape[0] != ids_BT.shape[0] or not bool((per_row == latents_BLD.shape[1]).all()):
        raise ValueError(f"latent slots per row {per_row.tolist()} != latents given {tuple(latents_BLD.shape[:2])} (B, n_ret·K)")
    return embeds_BTD.masked_scatter(latent_mask_BT.bool().unsqueeze(-1), latents_BLD.to(embeds_BTD.dtype))


@dataclass
class TeacherScores:
    """Teacher log-probs in the *student's* layout ``(B, T_student, ...)``; zeros off the student's action mask."""

    token_logp_BT: Tensor  # log π_T(a_t | s_t, c) at the sampled action tokens (for δ_t)
    logp_BTV: Tensor | None = None  # full vocabulary, when no top-M was asked for
    topm_logp_BTM: Tensor | None = None  # log-probs (full-vocabulary normalised) at topm_ids_BTM
    topm_ids_BTM: Tensor | None = None


def teacher_logprobs(
    backbone,
    batch: TeacherBatch,
    latents_BLD: Tensor,
    student_ids_BT: Tensor,
    student_mask_BT: Tensor,
    *,
    top_m: int | None = None,
    ids_BTM: Tensor | None = None,
) -> TeacherScores:
    """The teacher's log-probs at the student's action tokens, conditioned on the latents.

    ``backbone``: the shared model; a ``PeftModel`` is run with its adapter disabled (the teacher
    is the base weights). ``student_ids_BT`` / ``student_mask_BT``: the student's batch.
    ``top_m``: keep only the teacher's top-M (ids + log-probs) instead of the full vocabulary;
    ``ids_BTM``: gather at these ids instead (student-side KL support).
    Gradients reach ``latents_BLD`` unless called under ``torch.no_grad()``.
    """
    s_mask_BT, t_mask_BT = student_mask_BT.bool(), batch.action_mask_BT.bool()
    if not torch.equal(s_mask_BT.sum(1), t_mask_BT.sum(1).to(s_mask_BT.device)):
        raise ValueError(f"teacher rows score {t_mask_BT.sum(1).tolist()} action tokens, the student's {s_mask_BT.sum(1).tolist()}")
    if not torch.equal(batch.ids_BT[t_mask_BT], student_ids_BT[s_mask_BT].to(batch.ids_BT.device)):
        raise ValueError("teacher and student action tokens differ: the teacher ids were not built from this student batch")
    ctx = backbone.disable_adapter() if isinstance(backbone, PeftModel) else nullcontext()
    with ctx:
        embeds_BTD = inject_latents(backbone, batch.ids_BT, batch.latent_mask_BT, latents_BLD)
        logp_NV = target_logprobs(backbone, t_mask_BT, batch.attn_BT, inputs_embeds_BTD=embeds_BTD)
    # Row-major order is the same on both sides (same tokens, same order), so N lines up.
    tok_N = logp_NV.gather(-1, batch.ids_BT[t_mask_BT].unsqueeze(-1)).squeeze(-1)
    scores = TeacherScores(token_logp_BT=scatter_targets(tok_N, s_mask_BT))
    if ids_BTM is not None:
        scores.topm_ids_BTM = ids_BTM
        scores.topm_logp_BTM = scatter_targets(logp_NV.gather(-1, ids_BTM[s_mask_BT]), s_mask_BT)
    elif top_m is not None:
        top_NM = logp_NV.topk(top_m, dim=-1)
        scores.topm_logp_BTM = scatter_targets(top_NM.values, s_mask_BT)
        scores.topm_ids_BTM = scatter_targets(top_NM.indices, s_mask_BT)
    else:
        scores.logp_BTV = scatter_targets(logp_NV, s_mask_BT)
    return scores
