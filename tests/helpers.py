"""Tiny fixtures shared by tests: a tokenizer and a random Qwen3 built from a config, never a hub."""

from __future__ import annotations

from functools import lru_cache

import torch

from lopd.config import ModelParams
from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, entity_words, make_tasks, run_episode
from lopd.policy.chat import encode
from lopd.policy.generation import Generation
from lopd.policy.modeling import build_tiny_qwen3, train_tokenizer


@lru_cache(maxsize=1)
def tiny_tokenizer():
    """BPE trained on a few expert transcripts (enough to cover ToolWorld's characters), with
    ToolWorld's entity words as whole tokens, as the embedded base has them."""
    texts = []
    for task in make_tasks("train", 40):
        env = ToolWorldEnv(task)
        ep = run_episode(env, ScriptedExpert())
        texts.append(env.system_prompt() + task.text + "".join(ep["actions"]) + "".join(o or "" for o in ep["observations"]))
    tok = train_tokenizer(texts, vocab_size=600, words=entity_words())
    tok.padding_side = "left"
    return tok


def tiny_model(seed: int = 0, init_std: float | None = None):
    """A random tiny Qwen3. ``init_std`` re-draws every weight at that std (Qwen3's own init,
    ``initializer_range``; default 0.02): at 0.02 the next-token distribution is almost uniform
    and barely moves with the context, so a teacher's extra context changes it by ~1e-6 nats;
    at 0.2 by ~1e-2 (what tests that compare KL or Δ across processes need)."""
    p = ModelParams(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    model = build_tiny_qwen3(p, tiny_tokenizer(), seed=seed)
    if init_std is not None:
        model.config.initializer_range = init_std
        torch.manual_seed(seed)
        model.apply(model._init_weights)
    return model.eval()


class ReplayBackend:
    """A backend that 'generates' the scripted expert's next action for each episode.

    The episode is recognised by its initial prompt; the turn by the eos tokens generated so far.
    """

    def __init__(self, tokenizer, prompts_to_actions: dict[tuple[int, ...], list[str]]):
        self.tok, self.episodes = tokenizer, prompts_to_actions

    def reset(self):
        pass

    def generate(self, prompts, max_new_tokens, rngs=None):
        out = []
        eos = self.tok.eos_token_id
        for p in prompts:
            key = next(k for k in self.episodes if tuple(p[: len(k)]) == k)
            turn = p[len(key):].count(eos) // 2  # each turn: the action's eos + the tool turn's
            ids = encode(self.tok, self.episodes[key][turn]) + [eos]
            out.append(Generation(ids, [-0.5] * len(ids), stopped=True))
        return out
