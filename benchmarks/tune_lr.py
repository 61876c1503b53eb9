"""Benchmark: each distillation method's learning rate, tuned on dev with the same grid and budget.

The paper's rates (1e-5) are for billion-parameter models. For the embedded default every
method gets the same small grid of student learning rates at the profile's rollout budget,
one seed, and is scored by its final dev success (dev only: test is for ``lopd evaluate``).
LOPD's composer rate follows its student rate. Each (method, rate) trains in its own root
under ``runs/tune/`` that links the shared base, bank, index and composer (as ``lopd sweep``
does), so nothing of the project's own outputs is overwritten. GRPO's group size G and updates
per batch μ are tuned too: ``--grpo-shapes 4x1,8x2`` trains each extra ``Gxμ`` shape at GRPO's
best rate, and ``--grpo-scales group,none`` trains GRPO at every rate of the grid with each
advantage scaling (``grpo.scale_rewards``; ``none`` is Dr. GRPO). Writes ``metrics/lr_grid.json`` (``--merge`` keeps its earlier rows and replaces
the ones re-run) and prints a markdown table (docs/results.md's).

    .venv/bin/python benchmarks/tune_lr.py [--profile demo] [--methods lopd,grpo,sft] [--grid 1e-4,3e-4,1e-3]
        [--grpo-shapes 4x1,8x2] [--grpo-scales group,none] [--merge] [--set k=v ...]

Needs the shared outputs (``lopd run`` up to cold start, or ``lopd bootstrap/collect/index/cold-start``).
"""

from __future__ import annotations

import argparse
import json
import time

from lopd.config import load_params, validate_params
from lopd.experiments.sweep import link_shared
from lopd.io import write_json
from lopd.ops.tracking import stage_run
from lopd.train.loop import train_method

LR_KEYS = {"lopd": ("distill.student_lr", "distill.composer_lr"), "opsd": ("distill.opsd_lr",), "grpo": ("grpo.lr",), "sft": ("distill.sft_lr",)}


def tuned_params(p, method: str, lr: float, shape: tuple[int, int] | None = None, scale: str | None = None):
    """``p`` with ``method``'s rate(s) at ``lr`` (and GRPO's ``(G, μ)`` and reward scaling), in its own root under ``runs/tune``."""
    d = p.model_dump()
    for key in LR_KEYS[method]:
        section, name = key.split(".")
        d[section][name] = lr
    if method == "grpo":
        shape = shape or (p.grpo.group_size, p.grpo.updates_per_batch)
        d["grpo"]["group_size"], d["grpo"]["updates_per_batch"] = shape
        d["grpo"]["scale_rewards"] = scale = scale or p.grpo.scale_rewards
    d["distill"]["methods"] = [method]
    tag = f"{method}-lr{lr:g}" + (f"-g{shape[0]}u{shape[1]}" + ("" if scale == "group" else f"-{scale}") if method == "grpo" else "")
    d["paths"]["root"] = str(p.root() / "runs" / "tune" / tag)
    d["tracking"]["tracking_uri"] = d["tracking"]["tracking_uri"] or f"sqlite:///{p.root() / 'mlruns' / 'mlflow.db'}"
    return validate_params(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--methods", default="lopd,grpo,sft")
    ap.add_argument("--grid", default="1e-4,3e-4,1e-3", help="student learning rates, the same for every method")
    ap.add_argument("--grpo-shapes", default="", help="extra GRPO shapes GxU (group size x updates per batch) at GRPO's best rate")
    ap.add_argument("--grpo-scales", default="", help="GRPO advantage scalings to train at every grid rate (group,none); default: the params' own")
    ap.add_argument("--merge", action="store_true", help="keep metrics/lr_grid.json's earlier rows (re-run ones are replaced)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    p = load_params(a.params, a.profile, a.overrides)
    grid = [float(x) for x in a.grid.split(",")] if a.grid else []
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.grpo_shapes.split(",") if s]
    except ValueError:
        raise SystemExit(f"error: --grpo-shapes {a.grpo_shapes!r}: write shapes as GxU, e.g. 4x1,8x2")
    out = p.root() / "metrics" / "lr_grid.json"
    rows = json.loads(out.read_text())["rows"] if a.merge and out.exists() else []

    def run(method: str, lr: float, shape: tuple[int, int] | None = None, scale: str | None = None) -> None:
        q = tuned_params(p, method, lr, shape, scale)
        q.root().mkdir(parents=True, exist_ok=True)
        link_shared(p, q)
        t0 = time.perf_counter()
        with stage_run(q, "tune", run_name=f"tune-{q.root().name}", method=method):
            s = train_method(q, method)
        row = {"method": method, "lr": lr, "final_dev_success": s["final_dev_success"],
               "final_dev_success_pretrain": s["final_dev_success_pretrain"], "final_dev_success_new": s["final_dev_success_new"],
               "final_dev_reward": s["final_dev_reward"], "start_dev_success": s["curve"][0]["dev_success"],
               "rollouts": s["rollouts"], "wall_s": time.perf_counter() - t0}
        if method == "grpo":
            row.update(group_size=q.grpo.group_size, updates_per_batch=q.grpo.updates_per_batch, scale_rewards=q.grpo.scale_rewards)
        if method == "lopd":
            row.update(composer_frozen=q.composer.frozen)
        rows[:] = [r for r in rows if _key(r) != _key(row)] + [row]
        print(json.dumps(row), flush=True)

    scales = [s for s in a.grpo_scales.split(",") if s] or [None]
    for method in a.methods.split(","):
        for lr in grid:
            for scale in scales if method == "grpo" else [None]:
                run(method, lr, scale=scale)
    if shapes:
        lr = _best(rows, "grpo")["lr"]
        for shape in shapes:
            run("grpo", lr, shape)
    best = {m: {k: v for k, v in _best(rows, m).items() if k in ("lr", "group_size", "updates_per_batch", "scale_rewards")}
            for m in dict.fromkeys(r["method"] for r in rows)}
    write_json(out, {"profile": p.profile, "grid": sorted({r["lr"] for r in rows}), "rows": rows, "best": best})
    print("| method | lr | G × μ, scaling | dev success (start → final) | pre-training apps | new apps | dev reward | generations |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        mark = " **(chosen)**" if _key(_best(rows, r["method"])) == _key(r) else ""
        shape = f"{r['group_size']} × {r['updates_per_batch']}, {r.get('scale_rewards', 'group')}" if r["method"] == "grpo" else "—"
        print(f"| {r['method']} | {r['lr']:g}{mark} | {shape} | {r['start_dev_success']:.3f} → {r['final_dev_success']:.3f} | "
              f"{r['final_dev_success_pretrain']:.3f} | {r['final_dev_success_new']:.3f} | {r['final_dev_reward']:.3f} | {r['rollouts']} |")


def _key(r: dict) -> tuple:
    return r["method"], r["lr"], r.get("group_size"), r.get("updates_per_batch"), r.get("scale_rewards", "group" if r["method"] == "grpo" else None)


def _best(rows: list[dict], method: str) -> dict:
    """The method's row with the highest final dev success (dev reward breaks ties)."""
    return max((r for r in rows if r["method"] == method), key=lambda r: (r["final_dev_success"], r["final_dev_reward"]))


if __name__ == "__main__":
    main()
