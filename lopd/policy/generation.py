"""What a generation backend returns: one sampled continuation (its own module, so that every
backend, ``lopd.policy.backends`` and ``lopd.policy.kv_backend`` alike, imports it without importing the other)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Generation:
    token_ids: list[int]  # sampled tokens, up to and including a stop token if one was sampled
    logprobs: list[float]  # log-prob of each sampled token under the sampling distribution
    stopped: bool  # ended with a stop token (else it hit max_new_tokens)
