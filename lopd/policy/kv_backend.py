"""A generation backend that keeps the KV cache across turns (prefix caching, like vLLM's).

``model.generate`` starts from scratch on every call, so a multi-turn rollout re-reads the
whole growing conversation each turn. Here the cache of every row survives between calls:
the engine's token ids are append-only, so a new prompt that extends a row's cached tokens
only needs its new tail (the tool observation) prefilled. Rows can finish, and new episodes
join, between calls; the batch keeps one cache with per-row positions:

* ``mask_BL`` marks the cache slots that hold real tokens. Tokens fed after a row stopped,
  left padding and rows merged from a shorter cache are holes (mask 0), never attended to.
* ``position_ids`` count real tokens per row, so RoPE sees exactly the positions a fresh
  forward over the row's tokens would (keys are rotated once, when written). A test checks
  the sampled log-probs against a plain full forward.
* When holes pass half the cache, it is compacted by gathering each row's real slots.

Sampling is temperature then top-p (the transformers warpers), then a multinomial draw from
the global torch RNG, so the same seed gives the same rollouts on CPU. With ``rngs``
(``rollout.rng: trajectory``: one ``torch.Generator`` per trajectory, seeded by the engine from the
run's seed, the task and the sample index) each row instead takes an inverse-CDF draw from its own
generator: a trajectory is then a function of its seed and the weights alone, not of which rows
share its batch, so any ``rollout.batch_size`` gives the same rollouts and a data-parallel rank
that plays a shard of the tasks samples exactly what one process playing all of them samples. The cache is
only valid for fixed weights: the engine calls ``reset()`` at the start and end of every run.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper
from transformers.cache_utils import DynamicLayer

from lopd.policy.generation import Generation

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys_BHLD, values_BHLD


class _GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends into a buffer with spare room.

    ``DynamicLayer`` re-concatenates the whole cache on every decode step (O(L) copies per token
    per layer); doubling the capacity makes appends amortised O(1). ``keys``/``values`` stay
    views of the filled part, so everything else that reads them is unchanged.
    """

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._k = self._v = None
            self._n = 0
        n = key_states.shape[-2]
        if self._k is None or self._n + n > self._k.shape[-2]:
            cap = max(64, 2 * (self._n + n))
            k = key_states.new_empty(*key_states.shape[:-2], cap, key_states.shape[-1])
            v = value_states.new_empty(*value_states.shape[:-2], cap, value_states.shape[-1])
            if self._n:
                k[..., : self._n, :] = self._k[..., : self._n, :]
                v[..., : self._n, :] = self._v[..., : self._n, :]
            self._k, self._v = k, v
        self._k[..., self._n : self._n + n, :] = key_states
        self._v[..., self._n : self._n + n, :] = value_states
        self._n += n
        self.keys, self.values = self._k[..., : self._n, :], self._v[..., : self._n, :]
        return self.keys, self.values


def _new_cache() -> DynamicCache:
    cache = DynamicCache()
    cache.layer_class_to_replicate = _GrowingLayer  # layers are created lazily, one per layer index
    return cache


def _kv(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _cache(kv: KV) -> DynamicCache:
    cache = _new_cache()
    for idx, (k, v) in enumerate(kv):
        cache.update(k, v, idx)
    return cache


def _left_pad_kv(kv: KV, length: int) -> KV:
    """Zero slots on the left so the cache is ``length`` long (they are masked out)."""
    out = []
    for k, v in kv:
        extra = length - k.shape[-2]
        if extra:
            k = torch.nn.functional.pad(k, (0, 0, extra, 0))
            v = torch.nn.functional.pad(v, (0, 0, extra, 0))
        out.append((k, v))
    return out


def sample_rows(probs_BV: torch.Tensor, live_B: torch.Tensor, rngs: list[torch.Generator] | None) -> torch.Tensor:
    """One token id per row, on CPU. With ``rngs``, row b draws ``u ~ U[0, 1)`` from ``rngs[b]``
    (live rows only, so a row's stream never depends on its batch-mates) and takes the first id
    whose cumulative probability exceeds ``u·Σp``; without, a multinomial from the global RNG."""
    if rngs is None:
        return torch.multinomial(probs_BV, 1).squeeze(1).cpu()
    u_B = torch.zeros(probs_BV.shape[0], dtype=torch.float64)
    for b in live_B.nonzero().squeeze(1).tolist():
        u_B[b] = torch.rand((), generator=rngs[b], dtype=torch.float64)
    cdf_BV = probs_BV.double().cumsum(-1)
    idx_B = torch.searchsorted(cdf_BV, (u_B.to(cdf_BV.device) * cdf_BV[:, -1])[:, None], right=True).squeeze(1)
    # u·Σp < Σp, so idx < V except through rounding; never land on a zero-probability (top-p cut) id
    last_B = probs_BV.shape[1] - 1 - (probs_BV > 0).flip(-1).int().argmax(-1)
    return torch.minimum(idx_B, last_B).cpu()


class CachedHFBackend:
    """Batched sampling with a Hugging Face causal LM and a KV cache that persists across turns."""

    def __init__(self, model, tokenizer, temperature: float, top_p: float):
        self.model = model
        self.pad_id = tokenizer.pad_token_id
        gen_eos = model.generation_config.eos_token_id
        gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        self.stop_ids = torch.tensor(sorted({tokenizer.eos_token_id, *gen_eos}))
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p)])
        self.reset()

    def reset(self) -> None:
        """Forget every cached row (call whenever the weights change)."""
        self.rows: list[list[int]] = []  # real tokens held in the cache, per row
        self.kv: KV | None = None
        self.mask_BL: torch.Tensor | None = None

    # -- cache bookkeeping ---------------------------------------------------------------
    def _match(self, prompts: list[list[int]]) -> list[int | None]:
        """For each prompt, a cached row whose tokens are a strict prefix of it (or None)."""
        free = set(range(len(self.rows)))
        out: list[int | None] = []
        for i, prompt in enumerate(prompts):
            order = ([i] if i in free else []) + sorted(free - {i})
            hit = next((j for j in order if len(self.rows[j]) < len(prompt) and prompt[: len(self.rows[j])] == self.rows[j]), None)
            if hit is not None:
                free.discard(hit)
            out.append(hit)
        return out

    def _prefill(self, kv: KV | None, mask_BL: torch.Tensor | None, rows: list[list[int]], tails: list[list[int]]):
        """Append ``tails`` (left-padded to one width) to the cache of ``rows``; returns (kv, mask)."""
        B, width = len(tails), max(len(t) for t in tails)
        device = self.model.device
        if mask_BL is None:
            mask_BL = torch.zeros(B, 0, dtype=torch.long)
        if width == 0:
            return kv, mask_BL
        ids_BW = torch.full((B, width), self.pad_id, dtype=torch.long)
        new_BW = torch.zeros(B, width, dtype=torch.long)
        pos_BW = torch.zeros(B, width, dtype=torch.long)
        for b, (row, tail) in enumerate(zip(rows, tails)):
            if tail:
                ids_BW[b, width - len(tail):] = torch.tensor(tail)
                new_BW[b, width - len(tail):] = 1
                pos_BW[b, width - len(tail):] = torch.arange(len(row), len(row) + len(tail))
        mask_BL = torch.cat([mask_BL, new_BW], 1)
        cache = _cache(kv) if kv is not None else _new_cache()
        self.model(input_ids=ids_BW.to(device), attention_mask=mask_BL.to(device), position_ids=pos_BW.to(device),
                   cache=cache, use_cache=True, logits_to_keep=1)
        return _kv(cache), mask_BL

    def _compact(self) -> None:
        """Drop hole slots: gather each row's real slots, left-padded to the longest row."""
        real_B = self.mask_BL.sum(1)
        length = int(real_B.max())
        if self.mask_BL.shape[1] <= 2 * length:
            return
        B = len(self.rows)
        idx_BL = torch.zeros(B, length, dtype=torch.long)
        mask_BL = torch.zeros(B, length, dtype=torch.long)
        for b in range(B):
            slots = self.mask_BL[b].nonzero().squeeze(1)
            idx_BL[b, length - len(slots):] = slots
            mask_BL[b, length - len(slots):] = 1
        dev_idx = idx_BL.to(self.model.device)
        out = []
        for k, v in self.kv:
            gather = dev_idx[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            out.append((k.gather(2, gather), v.gather(2, gather)))
        self.kv, self.mask_BL = out, mask_BL

    def _prepare(self, prompts: list[list[int]]) -> None:
        """Make the cache hold ``prompt[:-1]`` for every prompt, in prompt order."""
        hits = self._match(prompts) if self.kv is not None else [None] * len(prompts)
        old = [i for i, h in enumerate(hits) if h is not None]
        new = [i for i, h in enumerate(hits) if h is None]
        parts = []  # (prompt indices, kv, mask)
        if old:
            keep = torch.tensor([hits[i] for i in old])
            kv = [(k[keep.to(k.device)], v[keep.to(v.device)]) for k, v in self.kv]
            rows = [self.rows[hits[i]] for i in old]
            tails = [prompts[i][len(r):-1] for i, r in zip(old, rows)]
            parts.append((old, *self._prefill(kv, self.mask_BL[keep], rows, tails)))
        if new:
            parts.append((new, *self._prefill(None, None, [[] for _ in new], [prompts[i][:-1] for i in new])))
        self.rows = [p[:-1] for p in prompts]
        template = next((kv for _, kv, _ in parts if kv is not None), None)
        if template is None:  # every prompt is one token: nothing cached yet
            self.kv, self.mask_BL = None, torch.zeros(len(prompts), 0, dtype=torch.long)
            return
        length = max(m.shape[1] for _, _, m in parts)
        order, kvs, masks = [], [], []
        for idx, kv, mask in parts:
            if kv is None:
                kv = [(k.new_zeros(len(idx), k.shape[1], 0, k.shape[3]),) * 2 for k, _ in template]
            order += idx
            masks.append(torch.nn.functional.pad(mask, (length - mask.shape[1], 0)))
            kvs.append(_left_pad_kv(kv, length))
        inv = torch.tensor(sorted(range(len(order)), key=lambda j: order[j]))
        self.kv = [(torch.cat([kv[l][0] for kv in kvs])[inv.to(self.model.device)],
                    torch.cat([kv[l][1] for kv in kvs])[inv.to(self.model.device)]) for l in range(len(kvs[0]))]
        self.mask_BL = torch.cat(masks)[inv]
        self._compact()

    # -- sampling --------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, rngs: list[torch.Generator] | None = None) -> list[Generation]:
        """One sampled turn per prompt; ``rngs`` (one CPU generator per prompt) make each row's draws its own."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        self._prepare(prompts)
        device, B = self.model.device, len(prompts)
        cache = _cache(self.kv) if self.kv is not None else _new_cache()
        mask_BL = self.mask_BL
        cur_B = torch.tensor([p[-1] for p in prompts])
        pos_B = torch.tensor([len(p) - 1 for p in prompts])
        live_B = torch.ones(B, dtype=torch.bool)  # still generating
        feed_B = torch.ones(B, dtype=torch.long)  # cur_B holds a real token
        tokens = [[] for _ in range(B)]
        logps = [[] for _ in range(B)]
        for _ in range(max_new_tokens):
            mask_BL = torch.cat([mask_BL, feed_B[:, None]], 1)
            logits_BV = self.model(
                input_ids=cur_B[:, None].to(device), attention_mask=mask_BL.to(device),
                position_ids=pos_B[:, None].to(device), cache=cache, use_cache=True,
            ).logits[:, -1].float()
            for b in feed_B.nonzero().squeeze(1).tolist():
                self.rows[b].append(int(cur_B[b]))
            pos_B = pos_B + feed_B
            scores_BV = self.warpers(None, logits_BV)
            logp_BV = torch.log_softmax(scores_BV, -1)
            next_B = sample_rows(logp_BV.exp(), live_B, rngs)
            lp_B = logp_BV.gather(1, next_B[:, None].to(logp_BV.device)).squeeze(1).cpu()
            for b in live_B.nonzero().squeeze(1).tolist():
                tokens[b].append(int(next_B[b]))
                logps[b].append(float(lp_B[b]))
            feed_B = live_B.long()  # the token just sampled is real for rows that were live
            cur_B = torch.where(live_B, next_B, torch.full_like(next_B, self.pad_id))
            live_B = live_B & ~torch.isin(next_B, self.stop_ids)
            if not live_B.any():
                break
        self.kv, self.mask_BL = _kv(cache), mask_BL
        return [Generation(t, lp, stopped=bool(t) and t[-1] in self.stop_ids.tolist()) for t, lp in zip(tokens, logps)]
