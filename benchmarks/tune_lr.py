"""Benchmark: each distillation method's learning rate, tuned on dev with the same grid and budget.

The paper's rates (1e-5) are for billion-parameter models. For the embedded default every
method gets the same small grid of student learning rates at the profile's rollout budget,
one seed, and is scored by its final dev success (dev only: test is for ``lopd evaluate``).
LOPD's composer rate follows its student rate. Each (method, rate) trains in its own root
under ``runs/tune/`` that links the shared base, bank, index and composer (as ``lopd sweep``
does), so nothing of the project's own outputs is overwritten. Writes
``metrics/lr_grid.json`` and prints a markdown table (the README's).

    .venv/bin/python benchmarks/tune_lr.py [--profile demo] [--methods lopd,grpo,sft] [--grid 1e-4,3e-4,1e-3] [--set k=v ...]

Needs the shared outputs (``lopd run`` up to cold start, or ``lopd bootstrap/collect/index/cold-start``).
"""

from __future__ import annotations

import argparse
import json
import time

from lopd.config import load_params, validate_params
from lopd.distill import train_method
from lopd.io import write_json
from lopd.sweep import link_shared
from lopd.tracking import stage_run

LR_KEYS = {"lopd": ("distill.student_lr", "distill.composer_lr"), "grpo": ("grpo.lr",), "sft": ("distill.sft_lr",)}


def tuned_params(p, method: str, lr: float):
    """``p`` with ``method``'s rate(s) at ``lr``, in its own root under ``runs/tune``."""
    d = p.model_dump()
    for key in LR_KEYS[method]:
        section, name = key.split(".")
        d[section][name] = lr
    d["distill"]["methods"] = [method]
    d["paths"]["root"] = str(p.root() / "runs" / "tune" / f"{method}-lr{lr:g}")
    d["tracking"]["tracking_uri"] = d["tracking"]["tracking_uri"] or f"sqlite:///{p.root() / 'mlruns' / 'mlflow.db'}"
    return validate_params(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--methods", default="lopd,grpo,sft")
    ap.add_argument("--grid", default="1e-4,3e-4,1e-3", help="student learning rates, the same for every method")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    p = load_params(a.params, a.profile, a.overrides)
    grid = [float(x) for x in a.grid.split(",")]
    rows = []
    for method in a.methods.split(","):
        for lr in grid:
            q = tuned_params(p, method, lr)
            q.root().mkdir(parents=True, exist_ok=True)
            link_shared(p, q)
            t0 = time.perf_counter()
            with stage_run(q, "tune", run_name=f"tune-{method}-lr{lr:g}", method=method):
                s = train_method(q, method)
            rows.append({"method": method, "lr": lr, "final_dev_success": s["final_dev_success"],
                         "final_dev_success_pretrain": s["final_dev_success_pretrain"], "final_dev_success_new": s["final_dev_success_new"],
                         "final_dev_reward": s["final_dev_reward"], "start_dev_success": s["curve"][0]["dev_success"],
                         "rollouts": s["rollouts"], "wall_s": time.perf_counter() - t0})
            print(json.dumps(rows[-1]), flush=True)
    best = {m: max((r for r in rows if r["method"] == m), key=lambda r: (r["final_dev_success"], r["final_dev_reward"]))["lr"]
            for m in dict.fromkeys(r["method"] for r in rows)}
    write_json(p.root() / "metrics" / "lr_grid.json", {"profile": p.profile, "grid": grid, "rows": rows, "best": best})
    print("| method | lr | dev success (start → final) | pre-training apps | new apps | dev reward | generations |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        mark = " **(chosen)**" if best[r["method"]] == r["lr"] else ""
        print(f"| {r['method']} | {r['lr']:g}{mark} | {r['start_dev_success']:.3f} → {r['final_dev_success']:.3f} | "
              f"{r['final_dev_success_pretrain']:.3f} | {r['final_dev_success_new']:.3f} | {r['final_dev_reward']:.3f} | {r['rollouts']} |")


if __name__ == "__main__":
    main()
