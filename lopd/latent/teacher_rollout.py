"""Rolling out the teacher itself: the frozen base with each task's latents in its prompt.

LOPD's teacher is only ever *scored* during training. To see how much privilege its latents
carry, this plays the teacher as a policy: every episode's first prompt is the student's prompt
with the framing sentence and ``n_ret × K`` placeholder slots (as in ``lopd.latent.teacher``), and
:class:`LatentBackend` samples with ``inputs_embeds`` in which those slots hold the latents the
composer made for that task and its retrieved experiences. Its success rate set beside the base's
with the experiences as *text* (the ``privilege`` stage's ``retrieved_text``) says whether the
latents hold what the text holds (:func:`teacher_success`: ``metrics/cold_start.json`` and
``benchmarks/teacher_success.py``).

Every turn re-prefills the conversation (``model.generate`` with ``inputs_embeds``; no cache
across turns): a diagnostic, not a training path.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from lopd.latent.teacher import add_latent_placeholder, inject_latents
from lopd.policy.backends import HFBackend
from lopd.policy.chat import LATENT_PH, encode, render_prompt
from lopd.policy.engine import make_engine, success_by_group
from lopd.policy.generation import Generation
from lopd.policy.rollout import RolloutEngine


class LatentBackend(HFBackend):
    """``HFBackend`` over ``inputs_embeds``: the placeholder slots of each prompt carry its episode's latents.

    Register each episode's first prompt with :meth:`register`; every later prompt of that
    episode extends it (the engine's ids are append-only), which is how a prompt finds its latents.
    """

    def __init__(self, model, tokenizer, temperature: float, top_p: float):
        super().__init__(model, tokenizer, temperature, top_p)
        self.slot_id = tokenizer.convert_tokens_to_ids(LATENT_PH)
        self._latents: dict[tuple[int, ...], torch.Tensor] = {}
        self._lengths: set[int] = set()

    def register(self, first_prompt: Sequence[int], latents_LD: torch.Tensor) -> None:
        slots = sum(1 for t in first_prompt if t == self.slot_id)
        if slots != latents_LD.shape[0]:
            raise ValueError(f"the prompt has {slots} latent slots, the composer gave {latents_LD.shape[0]} latents")
        self._latents[tuple(first_prompt)] = latents_LD.detach()
        self._lengths.add(len(first_prompt))

    def _find(self, prompt: Sequence[int]) -> tuple[int, torch.Tensor]:
        for n in sorted(self._lengths, reverse=True):
            hit = self._latents.get(tuple(prompt[:n]))
            if hit is not None:
                return n, hit
        raise KeyError("a prompt that extends no registered first prompt: register every episode before the rollout")

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, rngs=None) -> list[Generation]:  # global RNG (as HFBackend)
        width = max(len(p) for p in prompts)
        ids_BT = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask_BT = torch.zeros_like(ids_BT)
        slots_BT = torch.zeros_like(ids_BT)
        latents = []
        for i, p in enumerate(prompts):
            off = width - len(p)
            ids_BT[i, off:] = torch.tensor(p)
            mask_BT[i, off:] = 1
            n, lat_LD = self._find(p)
            slots_BT[i, off : off + n] = ids_BT[i, off : off + n] == self.slot_id  # only the first prompt's slots
            latents.append(lat_LD)
        device = self.model.device
        embeds_BTD = inject_latents(self.model, ids_BT.to(device), slots_BT.to(device), torch.stack(latents).to(device))
        out = self.model.generate(
            inputs_embeds=embeds_BTD,
            attention_mask=mask_BT.to(device),
            do_sample=True,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=0,
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
        # With inputs_embeds alone, ``sequences`` holds only the new tokens.
        return self._generations(out.sequences, out)


class ContextEnv:
    """An env whose first observation carries ``text`` in the teacher's framing sentence
    (``text=None``: the student's prompt unchanged)."""

    def __init__(self, env, text: str | None):
        self.env, self.text, self.task = env, text, getattr(env, "task", None)

    def initial_observation(self) -> list[dict]:
        messages = self.env.initial_observation()
        return messages if self.text is None else add_latent_placeholder(messages, placeholder=self.text)

    def step(self, action: str):
        return self.env.step(action)


class LatentContextEnv:
    """A ToolWorld env whose first observation carries ``n_latents`` placeholder slots in the teacher's framing."""

    def __init__(self, env, n_latents: int):
        self.env, self.task, self.n_latents = env, env.task, n_latents

    def initial_observation(self) -> list[dict]:
        return add_latent_placeholder(self.env.initial_observation(), placeholder=LATENT_PH * self.n_latents)

    def step(self, action: str):
        return self.env.step(action)


def first_prompt(tokenizer, env) -> list[int]:
    """The ids the rollout engine starts ``env``'s episode with (``RolloutEngine._start``)."""
    return encode(tokenizer, render_prompt(tokenizer, env.initial_observation()))


def teacher_success(p, base, tokenizer, tasks: Sequence, experiences: Mapping[str, Sequence[str]],
                    composers: Mapping[str, object], seed: int) -> dict[str, dict]:
    """The frozen ``base`` played as a policy on ``tasks``, one sample each, the same sampling seed.

    Rows: ``none`` (its own prompt), ``retrieved_text`` (``experiences[task_id]`` as text in the
    framing sentence: OPSD's teacher), and one row per entry of ``composers`` (name → a
    ``Composer``: its latents of the same experiences in the slots). Each row holds ``success``,
    ``reward`` and ``success_<group>`` (pre-training / new apps).
    """
    engine = make_engine(p, base, tokenizer)
    make_env = engine.make_env

    def score(trajs) -> dict:
        n = max(1, len(trajs))
        return {"success": sum(t.success for t in trajs) / n, "reward": sum(t.reward for t in trajs) / n,
                **{f"success_{g}": v for g, v in success_by_group(p, tasks, trajs).items()}}

    rows = {"none": score(engine.run(tasks, 1, seed=seed, progress=False))}
    engine.make_env = lambda task: ContextEnv(make_env(task), "\n\n".join(experiences[task.task_id]))
    rows["retrieved_text"] = score(engine.run(tasks, 1, seed=seed, progress=False))
    engine.make_env = make_env

    n_latents = p.retrieval.n_ret * p.composer.num_latents
    for name, composer in composers.items():
        backend = LatentBackend(base, tokenizer, p.rollout.temperature, p.rollout.top_p)
        with torch.no_grad():
            for i in range(0, len(tasks), 32):
                chunk = tasks[i : i + 32]
                lat_BLD = composer([t.text for t in chunk], [list(experiences[t.task_id]) for t in chunk])
                for t, lat_LD in zip(chunk, lat_BLD):
                    backend.register(first_prompt(tokenizer, LatentContextEnv(make_env(t), n_latents)), lat_LD)
        latent_engine = RolloutEngine(backend, tokenizer, make_env=lambda task: LatentContextEnv(make_env(task), n_latents),
                                      max_new_tokens=p.rollout.max_new_tokens, batch_size=p.rollout.batch_size,
                                      max_seq_len=engine.max_seq_len)
        rows[name] = score(latent_engine.run(tasks, 1, seed=seed, progress=False))
    return rows
