"""Benchmark: generated tokens/s of the batched multi-turn rollout engine vs one raw ``generate``.

The raw call is the ceiling: the same model, batch size and sampling settings, one turn, no
environment. The engine adds tokenisation, environment steps, re-prefilling the growing
conversation each turn and bookkeeping; target ratio engine/raw >= 0.7.

    .venv/bin/python benchmarks/rollout.py [--profile demo] [--tasks 64] [--set k=v ...]

Uses models/base (run `lopd bootstrap` first) or model.path.
"""

from __future__ import annotations

import argparse
import time

import torch

from lopd import layout
from lopd.config import load_params
from lopd.envs.toolworld import ToolWorldEnv
from lopd.policy.chat import encode, render_prompt
from lopd.policy.engine import make_engine, split_tasks
from lopd.policy.modeling import load_policy


def raw_generate_tokens_per_s(model, tokenizer, prompts, p, repeats: int) -> tuple[float, int]:
    """Tokens/s of ``model.generate`` on left-padded prompts (real tokens only, up to eos)."""
    enc = tokenizer.pad({"input_ids": prompts}, return_tensors="pt", padding=True)
    total, wall = 0, 0.0
    for r in range(repeats):
        torch.manual_seed(r)
        t0 = time.perf_counter()
        out = model.generate(
            **enc, do_sample=True, temperature=p.rollout.temperature, top_p=p.rollout.top_p, top_k=0,
            max_new_tokens=p.rollout.max_new_tokens, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
        wall += time.perf_counter() - t0
        new = out[:, enc["input_ids"].shape[1]:]
        for row in new.tolist():
            total += row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
    return total / wall, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--tasks", type=int, default=64, help="dev tasks rolled out by the engine")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    p = load_params(a.params, a.profile, a.overrides)
    torch.set_num_threads(torch.get_num_threads())
    model, tok = load_policy(layout.policy_path(p), p.model.dtype)
    tasks = split_tasks(p, "dev", a.tasks)
    B = p.rollout.batch_size
    prompts = [encode(tok, render_prompt(tok, ToolWorldEnv(t).initial_observation())) for t in tasks[:B]]

    raw_tps, raw_tokens = raw_generate_tokens_per_s(model, tok, prompts, p, repeats=max(1, a.tasks // B))
    engine = make_engine(p, model, tok)
    trajs = engine.run(tasks, seed=p.seed, progress=False)
    s = engine.stats
    turns = sum(len(t.actions) for t in trajs)
    print(f"model: {layout.policy_path(p)}  params: {sum(x.numel() for x in model.parameters()):,}  "
          f"batch: {B}  max_new_tokens/turn: {p.rollout.max_new_tokens}  threads: {torch.get_num_threads()}")
    print(f"{'':28s}{'gen tokens':>12s}{'wall s':>10s}{'tokens/s':>12s}")
    print(f"{'raw model.generate (1 turn)':28s}{raw_tokens:>12d}{raw_tokens / raw_tps:>10.2f}{raw_tps:>12.1f}")
    print(f"{'multi-turn engine':28s}{s.gen_tokens:>12d}{s.wall_s:>10.2f}{s.gen_tokens_per_s:>12.1f}")
    print(f"engine time in backend.generate: {s.backend_s:.2f}s ({s.backend_s / s.wall_s:.0%}); "
          f"env + tokenisation + bookkeeping: {s.wall_s - s.backend_s:.2f}s")
    print(f"episodes: {len(trajs)}  turns: {turns}  backend calls: {s.backend_calls}  "
          f"success: {sum(t.success for t in trajs) / len(trajs):.3f}")
    print(f"ratio engine/raw: {s.gen_tokens_per_s / raw_tps:.3f}  (target >= 0.7)")


if __name__ == "__main__":
    main()
