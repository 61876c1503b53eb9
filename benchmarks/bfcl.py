"""Benchmark: BFCL v4 multi-turn through ``lopd.envs.bfcl`` — replay, a wrong agent, prompt lengths, time.

Per category (``multi_turn_base``, ``long_context``, ``miss_func``, ``miss_param``; 200 entries each):

- **replay**: the ground truth played as JSON tool calls through the environment (parse → sandbox →
  BFCL's state and response checks) — success (every turn passes) and mean reward (turns passed);
- **drop_last**: the same agent without each turn's last call — it should lose every checked turn;
- **prompt tokens**: the first prompt (system + tools + first user turn) in the embedded base's
  tokenizer and chat template (median / max), and its characters;
- **seconds** to evaluate one method with the replay agent (all 200 entries), and what the embedded
  tiny model would need (its context against the prompts).

    .venv/bin/python benchmarks/bfcl.py [--out metrics/bfcl.json]
"""

from __future__ import annotations

import argparse
import time
from statistics import median

from transformers import AutoConfig, AutoTokenizer

from lopd.envs.bfcl import CATEGORIES, BFCLEnv, load_tasks
from lopd.envs.bfcl.agents import play
from lopd.io import write_json
from lopd.policy.base_asset import ASSET_DIR
from lopd.policy.chat import encode, render_prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the table as JSON")
    a = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(ASSET_DIR)
    context = AutoConfig.from_pretrained(ASSET_DIR).max_position_embeddings
    rows = {}
    for name in CATEGORIES:
        tasks = load_tasks(name)
        t0 = time.perf_counter()
        replay = [play(t) for t in tasks]
        replay_s = time.perf_counter() - t0
        wrong = [play(t, drop_last=True) for t in tasks]
        prompts = [render_prompt(tok, BFCLEnv(t).initial_observation()) for t in tasks]
        tokens = sorted(len(encode(tok, text)) for text in prompts)
        rows[name] = {
            "n": len(tasks),
            "replay_success": sum(r.info["success"] for r in replay), "replay_reward": sum(r.reward for r in replay) / len(tasks),
            "replay_failed": [t.task_id for t, r in zip(tasks, replay) if not r.info["success"]],
            "replay_seconds": replay_s,
            "drop_last_success": sum(r.info["success"] for r in wrong), "drop_last_reward": sum(r.reward for r in wrong) / len(tasks),
            "empty_truth_turns": sum(not gt for t in tasks for gt in t.ground_truth), "turns": sum(len(t.ground_truth) for t in tasks),
            "prompt_tokens_median": median(tokens), "prompt_tokens_max": tokens[-1],
            "prompt_chars_median": median(len(x) for x in prompts), "prompt_chars_max": max(len(x) for x in prompts),
            "embedded_context": context,
        }
    print(f"| category | replay success | replay reward | replay s (200) | drop-last success | drop-last reward | empty-truth turns "
          f"| prompt tokens, embedded (median / max) | prompt chars (median / max) | fits the embedded base ({context}) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['replay_success']} / {r['n']} | {r['replay_reward']:.3f} | {r['replay_seconds']:.2f} "
              f"| {r['drop_last_success']} / {r['n']} | {r['drop_last_reward']:.3f} | {r['empty_truth_turns']} / {r['turns']} "
              f"| {r['prompt_tokens_median']:.0f} / {r['prompt_tokens_max']} | {r['prompt_chars_median']:.0f} / {r['prompt_chars_max']} "
              f"| {'yes' if r['prompt_tokens_max'] < context else 'no'} |")
    for name, r in rows.items():
        if r["replay_failed"]:
            print(f"{name}: replay failed on {r['replay_failed']}")
    if a.out:
        write_json(a.out, rows)  # atomic: a reader never sees half a file


if __name__ == "__main__":
    main()
