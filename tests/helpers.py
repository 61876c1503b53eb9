"""Tiny fixtures shared by tests: a tokenizer and a random Qwen3 built from a config, never a hub."""

from __future__ import annotations

from functools import lru_cache

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


def tiny_model(seed: int = 0):
    p = ModelParams(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    return build_tiny_qwen3(p, tiny_tokenizer(), seed=seed).eval()


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
