"""Benchmark: data-parallel distill (DeepSpeed ZeRO, 2 CPU ranks, gloo) against one process.

1. ``smoke``: the smoke pipeline (``lopd run --profile smoke``) once, then ``lopd distill`` of every
   method three times on copies of it, all with ``rollout.rng=trajectory``: one process
   (``distill.engine=single``), ZeRO-2 on 2 ranks and ZeRO-3 on 2 ranks. Prints each method's
   rollout count and, per step, the loss and gradient norms of the 2-rank runs against the one-process
   run (relative difference).
2. ``grpo``: wall-clock of demo-scale GRPO steps (the committed base, ``distill.batch_tasks`` 32,
   G = 8): 1 process against 2 ranks (ZeRO-2) on this machine. ``distill.steps`` steps each;
   the first step is a warm-up (DeepSpeed's first step builds its buffers), so the mean is over the rest.

    .venv/bin/python benchmarks/parallel.py [--what smoke,grpo] [--root /tmp/lopd-parallel] [--grpo-steps 3]

Writes only under ``--root``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOPD = [sys.executable, "-m", "lopd.cli", "-q"]
KEYS = ("kl", "delta", "loss", "student_grad_norm", "composer_grad_norm", "grad_norm", "beta")


def lopd(*args: str) -> None:
    subprocess.run([*LOPD, *args], cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def details(root: Path) -> dict:
    return json.loads((root / "metrics" / "distill.json").read_text())["details"]


def smoke(root: Path) -> None:
    base = root / "smoke"
    if not (base / "metrics" / "distill.json").exists():
        lopd("run", "--profile", "smoke", "--set", f"paths.root={base}")
    runs = {"1 process": (1, []), "ZeRO-2 × 2": (2, ["--set", "distill.engine=deepspeed"]),
            "ZeRO-3 × 2": (2, ["--set", "distill.engine=deepspeed", "--set", "distill.zero_config=infra/deepspeed/zero3.json"])}
    out = {}
    for name, (nproc, extra) in runs.items():
        dst = root / f"smoke-{nproc}-{len(extra)}"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(base, dst)
        lopd("distill", "--profile", "smoke", "--set", f"paths.root={dst}", "--set", "rollout.rng=trajectory", *extra,
             *(["--nproc", str(nproc)] if nproc > 1 else []))
        out[name] = details(dst)
    ref = out["1 process"]
    print("| run | method | rollouts | step | quantity | 1 process | this run | rel. diff |\n|---|---|---|---|---|---|---|---|")
    for name, d in out.items():
        if name == "1 process":
            continue
        for method, r in d.items():
            for h, h0 in zip(r["history"], ref[method]["history"]):
                for k in KEYS:
                    if h.get(k) is not None and h0.get(k) is not None:
                        rel = abs(h[k] - h0[k]) / max(abs(h0[k]), 1e-30)
                        print(f"| {name} | {method} | {r['rollouts']} (1 process: {ref[method]['rollouts']}) | {h['step']} | {k} "
                              f"| {h0[k]:.8g} | {h[k]:.8g} | {rel:.1e} |")


def grpo(root: Path, steps: int) -> None:
    base = root / "demo"
    if not (base / "models" / "base" / "config.json").exists():
        lopd("bootstrap", "--profile", "demo", "--set", f"paths.root={base}")
    common = ["--profile", "demo", "--method", "grpo", "--set", f"paths.root={base}", "--set", f"distill.steps={steps}",
              "--set", "distill.eval_every=1000", "--set", "distill.eval_dev_tasks=2", "--set", "distill.rounds=1",
              "--set", "rollout.rng=trajectory"]
    print("| run | steps | wall per step after the first (s) | first step (s) | rollouts | loss step 0 | grad norm step 0 |\n|---|---|---|---|---|---|---|")
    for name, extra in {"1 process": [], "ZeRO-2 × 2": ["--set", "distill.engine=deepspeed", "--nproc", "2"]}.items():
        lopd("distill", *common, *extra)
        r = details(base)["grpo"]
        walls = [h["train_wall_s"] for h in r["history"]]
        per_step = [b - a for a, b in zip([0.0] + walls[:-1], walls)]
        rest = per_step[1:] or per_step
        print(f"| {name} | {len(per_step)} | {sum(rest) / len(rest):.2f} | {per_step[0]:.2f} | {r['rollouts']} "
              f"| {r['history'][0]['loss']:.6g} | {r['history'][0]['grad_norm']:.6g} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--what", default="smoke,grpo")
    ap.add_argument("--root", default="/tmp/lopd-parallel")
    ap.add_argument("--grpo-steps", type=int, default=3)
    args = ap.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    if "smoke" in args.what:
        smoke(root)
    if "grpo" in args.what:
        grpo(root, args.grpo_steps)


if __name__ == "__main__":
    main()
