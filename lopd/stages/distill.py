"""Stage `distill` (spec step 6): iterative LOPD, and the OPSD / GRPO / SFT / vanilla baselines at the same budget.

Each method trains in the one loop of ``lopd.train.loop`` (one LOPD step reads top to bottom in
``lopd.train.lopd_trainer``). This stage checks the inputs, trains ``distill.methods`` in turn
under one MLflow run each, and writes what they compare on: dev curves against generations
spent, the efficiency of LOPD against GRPO, plots.

Outputs: ``models/student`` (LOPD's student, a plain HF checkpoint of the base architecture),
``models/students/<method>`` for the baselines, ``metrics/distill.json`` and
``metrics/distill_curve.csv``; checkpoints in ``models/checkpoints/distill/<method>``.

Data parallel: ``lopd distill --nproc N`` (or ``torchrun`` / ``deepspeed`` launching ``lopd distill``)
with ``distill.engine=deepspeed`` runs this stage on every rank; rank 0 alone writes metrics,
plots and MLflow runs (``lopd.train.parallel``).
"""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from lopd import layout
from lopd.config import Params, ParamsError
from lopd.io import atomic_path, read_json, write_json
from lopd.train.loop import comparable_hash, train_method
from lopd.train.onpolicy import check_methods, rollout_budget, tasks_per_step
from lopd.train.parallel import DataParallel, from_env, init_data_parallel

log = logging.getLogger(__name__)

HEADLINE = ("rollouts", "final_dev_reward", "final_dev_success", "final_dev_success_pretrain", "final_dev_success_new",
            "beta_final", "delta_final")


# ----------------------------------------------------------------------------- efficiency, curve, plots


def first_reaching(curve: Sequence[dict], target: float, key: str = "dev_success") -> dict | None:
    """The first dev evaluation whose ``key`` is at least ``target`` (None if none is)."""
    return next((pt for pt in curve if pt[key] is not None and pt[key] >= target - 1e-12), None)


def efficiency(results: dict) -> dict:
    """How much of GRPO's budget LOPD needed to first reach GRPO's final dev success.

    ``rollouts_to_grpo_final_frac`` = LOPD's generations at that point / GRPO's budget;
    ``wall_to_grpo_final_ratio`` = LOPD's training seconds at that point / GRPO's training seconds
    for its whole budget (dev evaluations excluded on both sides). If LOPD never reaches it,
    ``grpo_final_reached`` is False, the fraction counts as 1.0 and the ratio as LOPD's whole
    training time over GRPO's (at least 1.0): a seed is flagged, never dropped. The resolution is
    one dev point, every ``distill.eval_every`` steps.
    """
    out = {"grpo_budget": None, "grpo_final_dev_success": None, "rollouts_to_grpo_final": None,
           "rollouts_to_grpo_final_frac": None, "wall_to_grpo_final_ratio": None, "grpo_final_reached": None}
    grpo, lopd = results.get("grpo"), results.get("lopd")
    if grpo is None or lopd is None:
        return out
    target = grpo["final_dev_success"]
    hit = first_reaching(lopd["curve"], target)
    grpo_wall = max(grpo["train_wall_s"], 1e-9)
    out.update(grpo_budget=grpo["rollouts"], grpo_final_dev_success=target, grpo_final_reached=hit is not None)
    if hit is not None:
        out.update(rollouts_to_grpo_final=hit["rollouts_cum"],
                   rollouts_to_grpo_final_frac=hit["rollouts_cum"] / max(1, grpo["rollouts"]),
                   wall_to_grpo_final_ratio=hit["train_wall_s"] / grpo_wall)
    else:
        out.update(rollouts_to_grpo_final_frac=1.0, wall_to_grpo_final_ratio=max(1.0, lopd["train_wall_s"] / grpo_wall))
    return out


def curve_frame(results: dict) -> pd.DataFrame:
    """Wide dev curve: one row per ``rollouts_cum`` (every method evaluates on the same grid), ``<method>_dev_reward`` columns.

    Vanilla (one evaluation at 0 generations) is a constant across the rows.
    """
    trained = {m: r for m, r in results.items() if m != "vanilla"}
    grid = sorted({pt["rollouts_cum"] for r in trained.values() for pt in r["curve"]} or {0})
    df = pd.DataFrame({"rollouts_cum": grid})
    for m, r in results.items():
        pts = pd.DataFrame(r["curve"])
        for col in ("dev_reward", "dev_success"):
            if m == "vanilla":
                df[f"{m}_{col}"] = pts[col].iloc[0]
            else:
                df = df.merge(pts[["rollouts_cum", col]].rename(columns={col: f"{m}_{col}"}), on="rollouts_cum", how="left")
    return df


def plot_curves(results: dict, out_dir: Path) -> list[Path]:
    """Dev reward vs generations (all methods, one figure); β and Δ over LOPD's steps. PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, r in results.items():
        pts = pd.DataFrame(r["curve"])
        if m == "vanilla":
            ax.axhline(pts["dev_reward"].iloc[0], ls="--", c="gray", label="vanilla")
        else:
            ax.plot(pts["rollouts_cum"], pts["dev_reward"], marker="o", label=m)
    ax.set(xlabel="generations (cumulative rollouts)", ylabel="dev reward", title="Dev reward vs rollout budget")
    ax.legend()
    paths.append(_save(plt, fig, out_dir / "dev_reward_vs_rollouts.png"))

    hist = results.get("lopd", {}).get("history")
    if hist:
        h = pd.DataFrame(hist)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
        a1.plot(h["step"], h["beta"], marker=".")
        a1.set(xlabel="step", ylabel="β", title="dual variable β")
        a2.plot(h["step"], h["delta"], marker=".", label="Δ")
        a2.axhline(float(h["delta"].iloc[0] + h["margin_violation"].iloc[0]), ls="--", c="gray", label="margin m")
        a2.set(xlabel="step", ylabel="nats", title="trajectory margin Δ")
        a2.legend()
        paths.append(_save(plt, fig, out_dir / "lopd_beta_delta.png"))
    decisions = plot_decisions({0: results}, out_dir / "decisions.png")
    return paths + ([decisions] if decisions else [])


DECISION_KINDS = ("format", "check", "commit")
METHOD_COLORS = {"lopd": "C0", "opsd": "C1", "grpo": "C2", "sft": "C3"}


def _seed_band(ax, runs: Sequence[Mapping], method: str, series: str, key: str, color: str) -> None:
    """``key`` of ``method``'s ``series`` (curve or history) against generations: mean ± 1 std over ``runs`` (seeds), aligned by index."""
    rows = [r[method][series] for r in runs if r.get(method, {}).get(series) and key in r[method][series][-1]]
    if not rows:
        return
    n = min(len(r) for r in rows)
    x = np.array([[pt["rollouts_cum"] for pt in r[:n]] for r in rows], dtype=float).mean(0)
    y = np.array([[np.nan if pt.get(key) is None else pt[key] for pt in r[:n]] for r in rows], dtype=float)
    with warnings.catch_warnings():  # a step where every seed's share is NaN (a GRPO batch of equal rewards) is a gap
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, std = np.nanmean(y, 0), (np.nanstd(y, 0, ddof=1) if len(rows) > 1 else np.zeros(n))
    ax.plot(x, mean, marker=".", ms=4, color=color, label=method)
    ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=color)


def plot_decisions(details: Mapping[int, Mapping], path: Path) -> Path | None:
    """Where learning stops (``lopd.train.decisions``): one column per decision kind at the new apps.

    ``details``: ``{seed: distill.json's details}``. Top: each method's student P(right) against
    generations (mean ± 1 std over seeds), the text and latent teachers as dashed and dotted lines;
    bottom: each method's share of its training loss on that decision's tokens, per step. None
    when no run recorded decisions (``distill.decision_tasks = 0``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(details.values())
    methods = [m for m in METHOD_COLORS if any(r.get(m, {}).get("curve") and "decision/format/student" in r[m]["curve"][0] for r in runs)]
    if not methods:
        return None
    fig, axes = plt.subplots(2, len(DECISION_KINDS), figsize=(4.4 * len(DECISION_KINDS), 7), sharex=True)
    for j, kind in enumerate(DECISION_KINDS):
        top, bottom = axes[0, j], axes[1, j]
        for m in methods:
            _seed_band(top, runs, m, "curve", f"decision/{kind}/student", METHOD_COLORS[m])
            _seed_band(bottom, runs, m, "history", f"decision/{kind}/loss_share", METHOD_COLORS[m])
        for role, ls in (("teacher_text", "--"), ("teacher_latent", ":")):  # fixed: the first point of any method's curve
            refs = [r[m]["curve"][0].get(f"decision/{kind}/{role}") for r in runs for m in methods if r.get(m, {}).get("curve")]
            refs = [v for v in refs if v is not None]
            if refs:
                top.axhline(float(np.mean(refs)), ls=ls, c="k", lw=1.2, label=f"{role.split('_')[1]} teacher")
        top.set(title=f"{kind}: P(right) at new apps", ylim=(-0.02, 1.02), ylabel="σ(log π(right) − log π(wrong))" if j == 0 else None)
        bottom.set(title=f"{kind}: share of the training loss", xlabel="generations (cumulative rollouts)",
                   ylabel="loss mass on its tokens / all" if j == 0 else None)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _merge_previous(p: Params, results: dict) -> dict:
    """Earlier results (same params) of methods not run now, so ``--method grpo`` then ``--method lopd`` compare."""
    path = layout.metrics_path(p, "distill")
    if not path.exists():
        return results
    try:
        old = read_json(path).get("details", {})
    except (json.JSONDecodeError, AttributeError):
        return results
    keep = {m: r for m, r in old.items() if m not in results and r.get("params_hash") == comparable_hash(p)}
    return {**keep, **results}


# ----------------------------------------------------------------------------- the stage


def _check_inputs(p: Params, methods: Sequence[str]) -> None:
    """Every input the methods need exists, before any model loads."""
    from lopd.memory.retrieval import INDEX_FILE

    if p.distill.init == "champion":
        from lopd.ops.registry import fetch_champion

        fetch_champion(p)  # models/champion = the version holding the alias now (downloaded when it moved)
    base = layout.init_path(p)
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"distill: no base policy at {base}: run `lopd bootstrap` (or set model.path)")
    if "lopd" in methods and not (layout.composer_dir(p) / "composer.json").exists():
        raise FileNotFoundError(f"distill: method lopd needs the cold-start composer at {layout.composer_dir(p)}: run `lopd cold-start`")
    for m in ("lopd", "opsd"):
        if m in methods and not (layout.index_dir(p) / INDEX_FILE).exists():
            raise FileNotFoundError(f"distill: method {m} needs the retrieval index at {layout.index_dir(p)}: run `lopd index`")
    if {"lopd", "opsd", "sft"} & set(methods) and not any(layout.bank_dir(p).glob("round-*.parquet")):
        raise FileNotFoundError(f"distill: methods lopd/opsd/sft need the experience bank at {layout.bank_dir(p)}: run `lopd collect`")
    check_parallel(p, methods, from_env().world)


def check_parallel(p: Params, methods: Sequence[str], world: int) -> None:
    """``distill.engine`` / ``zero_config`` against the launch, before any model loads."""
    d, errors = p.distill, []
    if d.engine == "single":
        if world > 1 and d.workers > 1:
            errors.append(f"params: distill.workers = {d.workers} trains methods in processes of its own, but {world} ranks were "
                          "launched: set distill.workers=1 with distill.engine=deepspeed and --nproc")
        elif world > 1:
            errors.append(f"params: distill.engine = 'single' runs one process, but {world} were launched: set distill.engine=deepspeed")
    else:
        try:
            import deepspeed  # noqa: F401
        except ImportError:
            errors.append("params: distill.engine = 'deepspeed' needs the deepspeed package: pip install -e '.[dev]' (CPU) or '.[gpu]'")
        if not Path(d.zero_config).is_file():
            errors.append(f"params: distill.zero_config = {d.zero_config!r} is not a file: use infra/deepspeed/zero2.json or zero3.json "
                          "(paths are relative to where lopd runs)")
        per_step = {m: tasks_per_step(p, m) for m in methods if m != "vanilla"}
        short = {m: n for m, n in per_step.items() if n < world}
        if short:
            errors.append(f"params: {world} ranks but tasks per step {short}: every rank needs a task; raise distill.batch_tasks or lower --nproc")
    if errors:
        raise ParamsError("\n".join(errors))


# ----------------------------------------------------------------------------- one method, in this process or a worker

# Relative cost of a method's step on CPU (metrics/distill.json step_ms, demo profile): the
# dearest start first, so the workers finish together (longest-processing-time order).
COST = {"lopd": 11.0, "opsd": 8.5, "grpo": 4.4, "sft": 3.5, "vanilla": 0.1}


def _train_tracked(p: Params, method: str, resume: bool, stop_after: int | None, dp) -> dict | None:
    """``train_method`` under its own MLflow run (rank 0), its final numbers logged and the run id kept."""
    import contextlib

    import mlflow

    from lopd.ops.tracking import stage_run

    tracked = stage_run(p, "distill", run_name=f"distill-{method}-seed{p.seed}", method=method) if dp.is_main else contextlib.nullcontext()
    with tracked as run_:
        summary = train_method(p, method, resume=resume, stop_after=stop_after, dp=dp)
        if summary is not None and dp.is_main:
            mlflow.log_metrics({k: float(v) for k, v in summary.items() if isinstance(v, (int, float))})
            summary["run_id"] = getattr(getattr(run_, "info", None), "run_id", None)  # the registry's lineage names the run that trained it
    return summary


def _worker_init(level: int, context: dict) -> None:
    """A worker: one torch thread (two one-thread processes outrun one two-thread process on small
    models), the parent's log format and its MLflow nesting (``run_context`` does not cross processes)."""
    from lopd.ops import tracking

    torch_threads(1)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    tracking._CONTEXT.set(context)


def torch_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _train_worker(p: Params, method: str, resume: bool, stop_after: int | None) -> dict | None:
    return _train_tracked(p, method, resume, stop_after, DataParallel())


def _train_in_workers(p: Params, methods: Sequence[str], workers: int, resume: bool, stop_after: int | None) -> dict:
    """``distill.workers`` methods at once, each in a spawned process with one thread; results in ``methods`` order.

    The seed gives the same numbers for the same ``distill.workers`` (one thread per worker)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from lopd.ops import tracking

    order = sorted(methods, key=lambda m: -COST.get(m, 5.0))
    log.info("distill: %d workers, one thread each, methods in the order %s", workers, order)
    tracking.ensure_experiment(p)  # the store exists before two processes open it (else both would create its tables)
    init = (logging.getLogger().getEffectiveLevel(), tracking._CONTEXT.get())
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init, initargs=init) as pool:
        futures = {m: pool.submit(_train_worker, p, m, resume, stop_after) for m in order}
        done = {m: f.result() for m, f in futures.items()}
    return {m: done[m] for m in methods}


def run(p: Params, methods: Sequence[str] | None = None, resume: bool | None = None, stop_after: int | None = None) -> dict:
    """Train ``methods`` (default ``distill.methods``) at one rollout budget; write students, metrics, curve, plots.

    ``resume`` (default ``distill.resume``) continues each method from its last checkpoint.
    ``stop_after`` is a testing hook: stop every method after that many steps, as if killed.
    """
    import mlflow

    from lopd.ops.tracking import stage_run

    methods = list(dict.fromkeys(methods or p.distill.methods))
    resume = p.distill.resume if resume is None else resume
    check_methods(p, methods)
    _check_inputs(p, methods)
    dp = init_data_parallel(p.distill.engine)
    if dp.is_main:
        log.info("distill: methods %s, %d generations each (%d steps × %d), resume=%s, engine %s on %d process(es)",
                 methods, rollout_budget(p), p.distill.steps, p.distill.batch_tasks, resume, p.distill.engine, dp.world)
    if dp.active and p.rollout.rng != "trajectory" and dp.is_main:
        log.warning("distill: rollout.rng = batch: each rank's rollouts differ from one process's; "
                    "set rollout.rng=trajectory for rollouts that do not depend on --nproc")

    workers = min(p.distill.workers, len(methods))
    if workers > 1 and not dp.active:
        results = _train_in_workers(p, methods, workers, resume, stop_after)
    else:
        results = {}
        for method in methods:  # in turn; a method cut short by stop_after ends the stage there
            results[method] = _train_tracked(p, method, resume, stop_after, dp)
            if results[method] is None:
                break
    stopped = [m for m, r in results.items() if r is None]
    if stopped:
        return {"stopped_after": stop_after, "method": stopped[0]}
    if not dp.is_main:
        return {"rank": dp.rank, "methods": methods}  # rank 0 writes the stage's outputs

    merged = _merge_previous(p, results)
    # Headline numbers per method at the top level (what `dvc metrics show` prints), the full
    # record (dev curve, timings, params hash) under "details".
    out: dict = {m: {k: r[k] for k in HEADLINE if k in r} for m, r in merged.items()}
    out.update(budget=rollout_budget(p), rollouts_per_step=p.distill.batch_tasks, **efficiency(merged))
    out["details"] = {m: {k: v for k, v in r.items() if not k.startswith("_")} for m, r in merged.items()}
    write_json(layout.metrics_path(p, "distill"), out)
    curve = curve_frame(merged)
    with atomic_path(layout.distill_curve_path(p)) as tmp:
        curve.to_csv(tmp, index=False)

    with stage_run(p, "distill", run_name=f"distill-summary-seed{p.seed}", method="summary"):
        flat = {k: v for k, v in out.items() if isinstance(v, (int, float)) and v is not None}
        mlflow.log_metrics({k: float(v) for k, v in flat.items()})
        with tempfile.TemporaryDirectory() as td:
            for path in plot_curves(merged, Path(td)):
                mlflow.log_artifact(str(path), "plots")
        mlflow.log_artifact(str(layout.metrics_path(p, "distill")))
        mlflow.log_artifact(str(layout.distill_curve_path(p)))
    return out
