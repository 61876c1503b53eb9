"""Multi-seed sweeps: every method × every seed, one MLflow parent run with mean ± std and t-intervals.

``lopd sweep --seeds 0,1,2 --methods lopd,grpo,vanilla,sft`` (or the Prefect flow
``flows/sweep_flow.py``) runs, per seed, the ``distill`` and ``evaluate`` stage functions of
:data:`lopd.stages.STAGES` with ``seed = k`` in its own output root
``<paths.root>/runs/sweep/seed<k>``, so seeds never overwrite each other's students.

What the seed changes: as in the paper, the seeds vary the distillation (each method's rollouts,
the order of its training tasks, the dev evaluations) and the test-time sampling of ``evaluate``.
The base policy, the experience bank, its index and the cold-start composer φ₀ do not depend on
it: they are built once, at ``params.seed``, by ``bootstrap``/``collect``/``index``/``cold_start``
in ``paths.root`` (the main project's outputs, reused when they exist and were built with these
params, else run once there), and each seed root links to them (``models/base``,
``models/composer``, ``data/bank``, ``data/index``; symlinks, never written through: LOPD copies
the bank to the seed's own ``data/distill/bank`` before it grows it). ``vanilla`` is the base
itself, evaluated without training. A method only needs what it reads: grpo and vanilla the base;
sft also the bank; lopd also the index and the composer.

MLflow: a parent run ``sweep-<profile>`` (tag ``stage = sweep``) with one child run
``sweep-<method>-seed<k>`` per (method, seed) (nested: tag ``mlflow.parentRunId``), each
holding that method's final numbers under the names of :data:`lopd.experiments.tables.METRICS`. Each method's
``distill-<method>-seed<k>`` stage run (its training curve) is nested under that child; the
seed's ``evaluate`` and ``distill-summary`` runs carry the tag ``sweep_run_id``. The parent holds,
per method and metric, ``<method>/<metric>/{mean,std,ci_low,ci_high}`` (Student-t interval at
``evaluate.ci``) and the tables ``sweep.md``, ``sweep.csv``, ``sweep.json``, also written to
``metrics/``.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Mapping, Sequence

from lopd import layout
from lopd.config import Params, ParamsError, validate_params
from lopd.experiments.tables import aggregate_table, csv_table, markdown_table, seed_rows
from lopd.io import atomic_path, read_json, write_json
from lopd.stages import STAGES
from lopd.train.onpolicy import METHODS, check_methods

log = logging.getLogger(__name__)

DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_METHODS = ("lopd", "opsd", "grpo", "vanilla", "sft")

# The stages that do not depend on the sweep's seed, in pipeline order, and what each needs.
SHARED_STAGES = ("bootstrap", "collect", "index", "cold_start")
NEEDS = {"vanilla": ("bootstrap",), "grpo": ("bootstrap",), "sft": ("bootstrap", "collect"), "opsd": ("bootstrap", "collect", "index"),
         "lopd": ("bootstrap", "collect", "index", "cold_start")}
# Params each shared stage's outputs depend on (as in dvc.yaml); a recorded run with other values is stale.
SHARED_PARAMS = {
    "bootstrap": ("seed", "model", "bootstrap", "env", "rollout"),
    "collect": ("seed", "model.path", "model.dtype", "env", "rollout", "collect", "bank"),
    "index": ("seed", "model.path", "model.dtype", "env", "bank", "retrieval"),
    "cold_start": ("seed", "model.path", "model.dtype", "env", "rollout", "retrieval", "composer", "cold_start",
                   "bank.min_size", "distill.grad_clip", "distill.top_m"),
}
# Keys inside those sections that only distillation reads (an ablation may change them over shared outputs).
DISTILL_ONLY = ("composer.frozen",)
# Shared outputs a seed root links to (relative to paths.root).
SHARED_LINKS = ("models/base", "models/composer", "data/bank", "data/index", ".cache/embeddings")


class SweepError(RuntimeError):
    """The sweep cannot run as asked (e.g. shared outputs built with other params); one line with the fix."""


# ----------------------------------------------------------------------------- arguments


def parse_seeds(text: str | Sequence[int]) -> list[int]:
    """``"0,1,2"`` (or a list) → ``[0, 1, 2]``: integers, at least one, no repeats."""
    try:
        seeds = [int(s) for s in (text.split(",") if isinstance(text, str) else text) if str(s).strip() != ""]
    except ValueError:
        raise ParamsError(f"--seeds {text!r}: expected comma-separated integers, e.g. --seeds 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ParamsError(f"--seeds {text!r}: name at least one seed, each once, e.g. --seeds 0,1,2")
    return seeds


def parse_methods(text: str | Sequence[str]) -> list[str]:
    """``"lopd,grpo"`` (or a list) → ``["lopd", "grpo"]``: known methods, at least one, no repeats."""
    methods = [m.strip() for m in (text.split(",") if isinstance(text, str) else text) if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods or len(set(methods)) != len(methods):
        raise ParamsError(f"--methods {text!r}: name each method once, from {', '.join(METHODS)}")
    return methods


# ----------------------------------------------------------------------------- where things live


def check_name(name: str) -> str:
    """A sweep's name: its folder under ``runs/`` and its tables' stem in ``metrics/`` (``sweep``, ``margin0``, ...)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,63}", name or ""):
        raise ParamsError(f"--name {name!r}: use lowercase letters, digits, '-' and '_' (e.g. --name margin0)")
    return name


def sweep_root(p: Params, name: str = "sweep") -> Path:
    return p.root() / "runs" / check_name(name)


def seed_root(p: Params, seed: int, name: str = "sweep") -> Path:
    """A seed's own output root: its students, checkpoints, LOPD's growing bank, its metrics."""
    return sweep_root(p, name) / f"seed{seed}"


def seed_params(p: Params, seed: int, methods: Sequence[str], uri: str, name: str = "sweep") -> Params:
    """``p`` with ``seed``, the seed's root, ``distill.methods = methods`` and the sweep's MLflow store."""
    d = p.model_dump()
    d["seed"] = seed
    d["paths"]["root"] = str(seed_root(p, seed, name))
    d["distill"]["methods"] = list(methods)
    d["tracking"]["tracking_uri"] = uri  # the seed root must not get a store of its own
    return validate_params(d)


def link_shared(p: Params, ps: Params) -> None:
    """Make ``ps``'s root see the shared outputs of ``p``'s root (relative symlinks)."""
    src_root, dst_root = p.root(), ps.root()
    (src_root / ".cache" / "embeddings").mkdir(parents=True, exist_ok=True)
    for rel in SHARED_LINKS:
        src, dst = src_root / rel, dst_root / rel
        if dst.is_symlink() or dst.is_file():
            dst.unlink()
        elif dst.exists():
            shutil.rmtree(dst)
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.symlink_to(os.path.relpath(src, dst.parent), target_is_directory=True)


# ----------------------------------------------------------------------------- shared stages


def _present(p: Params, stage: str) -> bool:
    """Whether ``stage``'s outputs exist under ``paths.root`` (with its metrics file)."""
    from lopd.memory.retrieval import INDEX_FILE

    outputs = {
        "bootstrap": layout.policy_path(p) / "config.json" if not p.model.path else None,
        "collect": next(layout.bank_dir(p).glob("round-*.parquet"), None) if layout.bank_dir(p).is_dir() else None,
        "index": layout.index_dir(p) / INDEX_FILE,
        "cold_start": layout.composer_dir(p) / "composer.json",
    }
    if stage == "bootstrap" and p.model.path:
        return True  # a real checkpoint: nothing to build
    out = outputs[stage]
    return out is not None and Path(out).exists() and layout.metrics_path(p, stage).exists()


def _selected(flat: Mapping[str, object], keys: Sequence[str]) -> dict[str, object]:
    return {k: v for k, v in flat.items() if any(k == key or k.startswith(key + ".") for key in keys)}


def stale_keys(p: Params, stage: str) -> list[str]:
    """Params ``stage``'s recorded run (``metrics/<stage>.json`` ``params``) differs from ``p`` in.

    Only bootstrap and cold start record their params; for collect and index the record of the
    next recording stage (cold start) stands in when present, else they are taken as they are.
    """
    keys = SHARED_PARAMS[stage]
    record = "bootstrap" if stage == "bootstrap" else "cold_start"
    path = layout.metrics_path(p, record)
    if not path.exists():
        return []
    try:
        recorded = read_json(path).get("params") or {}
    except (ValueError, AttributeError):
        return []
    if not recorded:
        return []
    want = {k: v for k, v in _selected(p.flat(), keys).items() if k not in DISTILL_ONLY}
    return sorted(k for k, v in want.items() if recorded.get(k, v) != v)


def plan_shared(p: Params, methods: Sequence[str]) -> list[str]:
    """The shared stages to run once before the seeds: those the methods need whose outputs are
    missing under ``paths.root``, and every needed stage after the first of them.

    Existing outputs built with other params stop the sweep (before anything runs) with the fix:
    they would make the seeds' numbers meaningless, and rebuilding them would silently replace
    the project's models.
    """
    needed = [s for s in SHARED_STAGES if any(s in NEEDS[m] for m in methods)]
    missing = [s for s in needed if not _present(p, s)]
    to_run = needed[needed.index(missing[0]):] if missing else []
    for stage in needed:
        stale = [] if stage in to_run else stale_keys(p, stage)
        if stale:
            shown = ", ".join(stale[:5]) + (", ..." if len(stale) > 5 else "")
            raise SweepError(
                f"sweep: the {stage} outputs in {p.root()} were built with other params ({shown}); "
                f"run `lopd run` (or `dvc repro`) with the sweep's params and profile first, or point the sweep "
                f"at another root with --set paths.root=..."
            )
    return to_run


# ----------------------------------------------------------------------------- the sweep


def run(p: Params, seeds: Sequence[int] | str = DEFAULT_SEEDS, methods: Sequence[str] | str = DEFAULT_METHODS,
        name: str = "sweep") -> dict:
    """Every method of ``methods`` at every seed of ``seeds``; returns (and writes) the aggregate.

    Writes ``metrics/<name>.{json,csv,md}`` under ``paths.root`` (``name`` also names the seeds'
    folder ``runs/<name>``, so an ablation such as ``--name margin0 --set distill.margin=0``
    never overwrites the main sweep); see the module docstring for the MLflow layout.
    """
    from mlflow.entities import Metric, Param, RunStatus, RunTag
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID, MLFLOW_RUN_NAME

    from lopd.ops.tracking import bank_tags, ensure_experiment, param_value, run_context, run_tags, tracking_uri

    seeds, methods, name = parse_seeds(seeds), parse_methods(methods), check_name(name)
    uri = tracking_uri(p)
    for k in seeds:  # every seed's params are valid (and the methods fit them) before any compute
        check_methods(seed_params(p, k, methods, uri, name), methods)
    shared = plan_shared(p, methods)
    ci = p.evaluate.ci
    experiment_id = ensure_experiment(p)
    client = MlflowClient(uri)
    sweep_name = f"{name}-{p.profile or 'none'}"
    base_tags = {"stage": "sweep", "sweep_name": name, "sweep_seeds": ",".join(map(str, seeds)), "sweep_methods": ",".join(methods)}
    parent = client.create_run(experiment_id, run_name=sweep_name,
                               tags={MLFLOW_RUN_NAME: sweep_name, **run_tags(p), **base_tags,
                                     "seed": ",".join(map(str, seeds)), "shared_seed": str(p.seed)})
    parent_id = parent.info.run_id
    log.info("sweep %s: methods %s × seeds %s (MLflow parent run %s)", sweep_name, methods, seeds, parent_id)
    open_runs = [parent_id]
    try:
        client.log_batch(parent_id, params=[Param(k, param_value(v)) for k, v in p.flat().items()]
                         + [Param("sweep.seeds", ",".join(map(str, seeds))), Param("sweep.methods", ",".join(methods))])
        for stage in shared:
            log.info("sweep: shared stage %s (seed %d) in %s", stage, p.seed, p.root())
            with run_context(tags={"sweep_run_id": parent_id}):
                STAGES[stage](p)
        # the bank the seeds read (the parent was tagged before a shared collect wrote it)
        tags = {**bank_tags(p), "shared_stages_run": ",".join(shared) or "none"}
        client.log_batch(parent_id, tags=[RunTag(k, v) for k, v in tags.items()])
        per_seed: dict[str, dict[int, dict[str, float]]] = {}
        children: dict[str, dict[int, str]] = {m: {} for m in methods}
        for k in seeds:
            ps = seed_params(p, k, methods, uri, name)
            ps.root().mkdir(parents=True, exist_ok=True)
            link_shared(p, ps)
            kids = {}
            for m in methods:
                child = f"{name}-{m}-seed{k}"
                run = client.create_run(experiment_id, run_name=child, tags={
                    MLFLOW_RUN_NAME: child, MLFLOW_PARENT_RUN_ID: parent_id, **run_tags(ps), **base_tags,
                    "method": m, "sweep_run_id": parent_id})
                kids[m] = run.info.run_id
                open_runs.append(kids[m])
            with run_context(tags={"sweep_run_id": parent_id}, parents=kids):
                distilled = STAGES["distill"](ps)
                evaluated = STAGES["evaluate"](ps)
            rows = seed_rows(methods, distilled, evaluated)  # the chance row first, then the methods
            for m, metrics in rows.items():
                per_seed.setdefault(m, {})[k] = metrics
            for m in methods:
                metrics = rows[m]
                children[m][k] = kids[m]
                client.log_batch(kids[m], metrics=[Metric(n, v, now_ms(), 0) for n, v in metrics.items()],
                                 params=[Param("method", m), Param("seed", str(k))])
                client.set_terminated(kids[m], RunStatus.to_string(RunStatus.FINISHED))
                open_runs.remove(kids[m])
            log.info("sweep: seed %d done: %s", k, {m: per_seed[m][k].get("test_success_rate") for m in methods})

        agg = aggregate_table(per_seed, ci)
        result = {
            "parent_run_id": parent_id,
            "experiment_id": experiment_id,
            "name": name,
            "profile": p.profile,
            "seeds": seeds,
            "methods": methods,
            "ci": ci,
            "shared_stages_run": shared,
            "aggregate": agg,
            "per_seed": {m: {str(k): v for k, v in by.items()} for m, by in per_seed.items()},
            "children": {m: {str(k): v for k, v in by.items()} for m, by in children.items()},
        }
        out_dir = p.root() / "metrics"
        write_json(out_dir / f"{name}.json", result)
        for fname, text in ((f"{name}.csv", csv_table(agg, per_seed, seeds)), (f"{name}.md", markdown_table(agg, seeds, ci))):
            with atomic_path(out_dir / fname) as tmp:
                tmp.write_text(text)
        stats = []
        for m, row in agg.items():
            for metric, a in row.items():
                for f in ("mean", "std", "ci_low", "ci_high"):
                    if a[f] is not None and a[f] == a[f]:
                        stats.append(Metric(f"{m}/{metric}/{f}", float(a[f]), now_ms(), 0))
        client.log_batch(parent_id, metrics=stats, tags=[RunTag("n_children", str(len(methods) * len(seeds)))])
        for fname in (f"{name}.md", f"{name}.csv", f"{name}.json"):
            client.log_artifact(parent_id, str(out_dir / fname))
        client.set_terminated(parent_id, RunStatus.to_string(RunStatus.FINISHED))
        open_runs.remove(parent_id)
        return result
    finally:
        for run_id in reversed(open_runs):  # an exception: every run still open is marked failed
            client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))


def now_ms() -> int:
    import time

    return int(time.time() * 1000)

