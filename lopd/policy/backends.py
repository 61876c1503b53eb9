"""Generation backends behind one small interface, so vLLM can replace HF ``generate`` at scale.

A backend turns a batch of token-id prompts into one sampled continuation each, stopping at
the end-of-turn token, and returns the sampled tokens with their log-probs under the sampling
distribution (after temperature and top-p).
"""

from __future__ import annotations

from typing import Protocol

import torch

from lopd.policy.generation import Generation


class GenerationBackend(Protocol):
    def generate(self, prompts: list[list[int]], max_new_tokens: int, rngs: list[torch.Generator] | None = None) -> list[Generation]:
        """One continuation per prompt; ``rngs`` (one per prompt) make each row's sampling its own, where supported."""

    def reset(self) -> None:
        """Drop any state tied to the current weights (a KV cache); called around every run."""


class HFBackend:
    """Batched sampling with ``model.generate`` (KV cache within a turn), prompts left-padded.

    The reference backend (``rollout.backend: hf-generate``): stateless, so every turn
    re-prefills the conversation. ``lopd.policy.kv_backend.CachedHFBackend`` (``hf``) keeps the cache.
    ``generate`` samples from the global torch RNG (it ignores ``rngs``): its rollouts depend on
    which rows share a batch, so only ``hf`` makes data-parallel shards sample what one process does.
    """

    def reset(self) -> None:
        pass

    def __init__(self, model, tokenizer, temperature: float, top_p: float):
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.top_p = temperature, top_p
        self.pad_id = tokenizer.pad_token_id
        gen_eos = model.generation_config.eos_token_id
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        self.stop_ids = sorted({tokenizer.eos_token_id, *gen_eos})

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, rngs: list[torch.Generator] | None = None) -> list[Generation]:
        width = max(len(p) for p in prompts)
        ids_BT = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask_BT = torch.zeros_like(ids_BT)
        for i, p in enumerate(prompts):
            ids_BT[i, width - len(p):] = torch.tensor(p)
            mask_BT[i, width - len(p):] = 1
        device = self.model.device
        out = self.model.generate(
            input_ids=ids_BT.to(device),
            attention_mask=mask_BT.to(device),
            do_sample=True,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=0,  # the spec samples with temperature + top-p only
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_scores=True,
        )
        return self._generations(out.sequences[:, width:], out)

    def _generations(self, new_BN: torch.Tensor, out) -> list[Generation]:
        """``generate``'s output → one :class:`Generation` per row, cut after its first stop token."""
        new_BN = new_BN.cpu()
        # Scores are the processed (temperature, top-p) logits, so these are sampling log-probs.
        logp_BN = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True).cpu()
        stop = torch.tensor(self.stop_ids)
        gens = []
        for ids_N, logp_N in zip(new_BN, logp_BN):
            hits = torch.isin(ids_N, stop).nonzero()
            n = int(hits[0]) + 1 if len(hits) else len(ids_N)
            gens.append(Generation(ids_N[:n].tolist(), logp_N[:n].tolist(), stopped=bool(len(hits))))
        return gens


def make_backend(kind: str, model, tokenizer, temperature: float, top_p: float, **vllm_options) -> GenerationBackend:
    """The backend of ``rollout.backend``; ``vllm_options`` go to :class:`lopd.policy.vllm_backend.VLLMBackend`."""
    if kind == "hf":
        from lopd.policy.kv_backend import CachedHFBackend

        return CachedHFBackend(model, tokenizer, temperature, top_p)
    if kind == "hf-generate":
        return HFBackend(model, tokenizer, temperature, top_p)
    if kind == "vllm":
        from lopd.policy.vllm_backend import VLLMBackend

        return VLLMBackend(model, tokenizer, temperature, top_p, **vllm_options)
    raise ValueError(f"rollout.backend = {kind!r}: allowed values are 'hf', 'hf-generate', 'vllm'")
