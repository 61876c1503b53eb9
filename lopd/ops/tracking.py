"""MLflow tracking: one store under ``<repo>/mlruns/`` unless ``MLFLOW_TRACKING_URI`` says otherwise.

The URI is absolute. Inside a DVC stage, a relative ``paths.root`` is taken relative to
``$DVC_ROOT`` (set by DVC to the repository root; for ``dvc exp run --temp`` / ``--queue``, which
run in a temp copy under ``.dvc/tmp/exps/``, DVC sets it to the *parent* repository), so those
experiments log to the real store instead of a temp directory that is deleted afterwards.

Each stage opens one run named after itself and logs its resolved params. Every run is tagged
with the code's git commit (``git_commit``, ``git_dirty``), the resolved params' hash
(``params_hash``) and the experience bank's DVC hash (``bank_dvc_hash``, ``bank_dvc_source``).
:func:`run_context` adds tags to, and picks parents for, every stage run opened inside it (the
sweeps use it to nest each method's distill run under its sweep child run).
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Mapping

from lopd.config import Params

# The user's choice, read once: mlflow.set_tracking_uri() writes this variable itself, so
# reading it later would pick up whatever store the previous stage in this process used.
_ENV_URI = os.environ.get("MLFLOW_TRACKING_URI")

# Code location: the git commit tag describes the code that ran, not the data root.
_CODE_DIR = Path(__file__).resolve().parents[2]  # the repository (lopd/ops/tracking.py)

UNTRACKED = "untracked"

# The UI opens an experiment on the view its kind names: model training (runs, metrics, charts),
# not the GenAI view (traces), which MLflow 3 may otherwise infer.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


def store_root(params: Params) -> Path:
    """Directory whose ``mlruns/`` holds the default store: ``paths.root``, relative to ``$DVC_ROOT`` inside DVC."""
    root = Path(params.paths.root).expanduser()
    dvc_root = os.environ.get("DVC_ROOT")
    if not root.is_absolute() and dvc_root:
        return (Path(dvc_root) / root).resolve()
    return params.root()


def tracking_uri(params: Params) -> str:
    """params ``tracking.tracking_uri`` > ``$MLFLOW_TRACKING_URI`` > sqlite under ``<store root>/mlruns``."""
    if params.tracking.tracking_uri:
        return params.tracking.tracking_uri
    if _ENV_URI:
        return _ENV_URI
    return f"sqlite:///{store_root(params) / 'mlruns' / 'mlflow.db'}"


def artifact_location(params: Params) -> str:
    """Where a new experiment keeps its artifacts: ``<store root>/mlruns/artifacts``."""
    return (store_root(params) / "mlruns" / "artifacts").as_uri()


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI; None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def ensure_experiment(params: Params) -> str:
    """Point MLflow at the store and return ``tracking.experiment``'s id (created on first use)."""
    import mlflow

    uri = tracking_uri(params)
    if (db := sqlite_file(uri)) is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(params.tracking.experiment)
    if exp is None:
        return mlflow.create_experiment(params.tracking.experiment, artifact_location=artifact_location(params),
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # stores made before the tag existed
        mlflow.MlflowClient().set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


# ----------------------------------------------------------------------------- tags


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=_CODE_DIR, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_tags() -> dict[str, str]:
    """``git_commit`` of the code that runs and ``git_dirty``: the ``lopd`` package differs from that commit
    (modified or new files; the stages' outputs, e.g. committed metrics, do not count)."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return {"git_commit": "unknown"}
    dirty = _git("status", "--porcelain", "--", "lopd")
    return {"git_commit": commit, "git_dirty": "unknown" if dirty is None else str(bool(dirty)).lower()}


def dvc_dir_hash(path: Path) -> str:
    """DVC's md5 of a directory (``<md5>.dir``, as ``dvc add`` / ``dvc.lock`` record it), computed by DVC's own code."""
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem
    from dvc_objects.fs.memory import MemoryFileSystem

    staging = HashFileDB(MemoryFileSystem(), "/lopd-dvc-hash")  # objects are hashed, never stored (dry run)
    _, _, obj = build(staging, str(path.resolve()), LocalFileSystem(), "md5", dry_run=True)
    return str(obj.hash_info.value)


def dvc_lock_hash(lock_file: Path, out: str) -> str | None:
    """The md5 that ``dvc.lock`` records for output ``out`` (a path relative to the lock file), if any."""
    import yaml

    try:
        lock = yaml.safe_load(lock_file.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    for stage in (lock.get("stages") or {}).values():
        for o in stage.get("outs") or []:
            if o.get("path") == out and o.get("md5"):
                return str(o["md5"])
    return None


def bank_tags(params: Params) -> dict[str, str]:
    """``bank_dvc_hash`` of ``data/bank`` and where it comes from (``bank_dvc_source``).

    ``dvc.lock`` (the workspace's, next to ``data/``) when it records the bank as it is now;
    ``computed`` (DVC's directory hash of the files) when the lock has no entry, or records
    another bank (then ``bank_dvc_lock_hash`` holds the lock's value, e.g. while `collect`
    rewrites the bank inside `dvc repro`, before DVC updates the lock); ``untracked`` when there
    is no bank (yet).
    """
    from lopd import layout

    bank = layout.bank_dir(params)
    locked = dvc_lock_hash(params.root() / "dvc.lock", "data/bank")
    computed = None
    if bank.is_dir() and any(bank.iterdir()):
        try:
            computed = dvc_dir_hash(bank)
        except Exception:  # noqa: BLE001 - a tag must never fail a stage; fall back to the lock
            computed = None
    if computed is None and locked is None:
        return {"bank_dvc_hash": UNTRACKED, "bank_dvc_source": UNTRACKED}
    if computed is None or computed == locked:
        return {"bank_dvc_hash": locked, "bank_dvc_source": "dvc.lock"}
    out = {"bank_dvc_hash": computed, "bank_dvc_source": "computed"}
    if locked is not None:
        out["bank_dvc_lock_hash"] = locked
    return out


def dvc_exp_tags() -> dict[str, str]:
    """The DVC experiment a stage runs in (``dvc exp run`` sets these variables), if any."""
    names = {"DVC_EXP_NAME": "dvc_exp_name", "DVC_EXP_BASELINE_REV": "dvc_exp_baseline_rev", "DVC_STAGE": "dvc_stage"}
    return {tag: os.environ[var] for var, tag in names.items() if os.environ.get(var)}


@lru_cache(maxsize=1)
def _static_tags() -> tuple[tuple[str, str], ...]:
    return tuple({**git_tags(), **dvc_exp_tags()}.items())


def run_tags(params: Params) -> dict[str, str]:
    """Tags every run carries: seed, profile, git commit, params hash, the bank's DVC hash."""
    return {
        "seed": str(params.seed),
        "profile": params.profile or "none",
        **dict(_static_tags()),
        "params_hash": params.digest(),
        **bank_tags(params),
    }


# ----------------------------------------------------------------------------- runs

_CONTEXT: ContextVar[dict] = ContextVar("lopd_tracking_context", default={"tags": {}, "parents": {}, "parent": None})


@contextmanager
def run_context(tags: Mapping[str, str] | None = None, parents: Mapping[str, str] | None = None,
                parent: str | None = None) -> Iterator[None]:
    """Inside: every :func:`stage_run` also gets ``tags``; one whose ``method`` tag is a key of
    ``parents`` is nested under that run id (``mlflow.parentRunId``), any other under ``parent``."""
    outer = _CONTEXT.get()
    token = _CONTEXT.set({"tags": {**outer["tags"], **(tags or {})}, "parents": {**outer["parents"], **(parents or {})},
                          "parent": parent or outer.get("parent")})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def pipeline_run_name(params: Params, kind: str, when: datetime | None = None) -> str:
    """``run-demo-seed0-20261204-193000``: what ran, at which profile and seed, when (UTC)."""
    when = when or datetime.now(timezone.utc)
    return f"{kind}-{params.profile or 'none'}-seed{params.seed}-{when:%Y%m%d-%H%M%S}"


@contextmanager
def pipeline_run(params: Params, kind: str = "run") -> Iterator[str]:
    """One parent run for a whole ``lopd run`` or flow run; every stage run inside nests under it.

    Yields the parent's run id. It ends FINISHED, or FAILED when a stage raises.
    """
    from mlflow.entities import Param, RunStatus
    from mlflow.tracking import MlflowClient
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    experiment_id = ensure_experiment(params)
    client = MlflowClient(tracking_uri(params))
    name = pipeline_run_name(params, kind)
    run = client.create_run(experiment_id, run_name=name,
                            tags={MLFLOW_RUN_NAME: name, "stage": "pipeline", "pipeline": kind, **run_tags(params)})
    run_id, status = run.info.run_id, RunStatus.FAILED
    client.log_batch(run_id, params=[Param(k, param_value(v)) for k, v in params.flat().items()])
    try:
        with run_context(tags={"pipeline_run_id": run_id}, parent=run_id):
            yield run_id
        status = RunStatus.FINISHED
    finally:
        client.set_terminated(run_id, RunStatus.to_string(status))


@contextmanager
def stage_run(params: Params, stage: str, run_name: str | None = None, **tags: str) -> Iterator["object"]:
    """An MLflow run for one stage, with its params and :func:`run_tags`.

    The bank tags are taken again when the run ends, so `collect`'s run names the bank it wrote.
    """
    import mlflow  # slow import: only when a stage actually runs

    ensure_experiment(params)
    mlflow.set_experiment(params.tracking.experiment)
    ctx = _CONTEXT.get()
    name = run_name or f"{stage}-seed{params.seed}"
    all_tags = {"stage": stage, **run_tags(params), **ctx["tags"], **tags}
    parent = ctx["parents"].get(tags.get("method", ""), ctx.get("parent"))
    with mlflow.start_run(run_name=name, tags=all_tags, parent_run_id=parent) as run:
        mlflow.log_params({k: param_value(v) for k, v in params.flat().items()})
        try:
            yield run
        finally:
            after = bank_tags(params)
            if after != {k: all_tags.get(k) for k in after}:
                mlflow.set_tags(after)


def param_value(v: object) -> str:
    """A param as MLflow stores it (at most 500 characters)."""
    s = str(v)
    return s if len(s) <= 500 else s[:497] + "..."


# ----------------------------------------------------------------------------- the UI


def ui_links(params: Params, base_url: str) -> list[str]:
    """Where to look in the MLflow UI served at ``base_url``, one line each.

    The experiment's runs table (MLflow 3 may open an experiment on its GenAI overview instead), the
    newest pipeline parent run (``lopd run`` / the flow; its stages are nested under it) and the newest
    sweep parent (its tables and ``plots/``). Reads the store; creates nothing.
    """
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(params)
    if (db := sqlite_file(uri)) is not None and not db.exists():
        return [f"no MLflow store yet at {db}: run `make run` (or `lopd run`) first"]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(params.tracking.experiment)
    if exp is None:
        return [f"no experiment {params.tracking.experiment!r} in {uri} yet: run `make run` (or `lopd run`) first"]
    base = f"{base_url.rstrip('/')}/#/experiments/{exp.experiment_id}"
    lines = [f"runs table of experiment {exp.name!r}: {base}/runs"]
    for stage, what in (("pipeline", "newest pipeline run (stages nested under it)"), ("sweep", "newest sweep (tables, plots/)")):
        runs = client.search_runs([exp.experiment_id], f"tags.stage = '{stage}'", order_by=["attributes.start_time DESC"], max_results=1)
        if runs:
            lines.append(f"{what}: {runs[0].info.run_name}: {base}/runs/{runs[0].info.run_id}")
    return lines
