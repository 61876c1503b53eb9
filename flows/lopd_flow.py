"""Flow `lopd`: the pipeline's stages as Prefect tasks, calling the same ``lopd`` stage functions
as the CLI and DVC. Run it in-process with ``python -m flows.lopd_flow --profile smoke``; serve it
as deployment ``lopd/full`` with ``python -m flows.serve`` (``make serve``).

Resume after a failure: every stage task persists its result under ``<paths.root>/.prefect/results``
with a cache key made of the stage's name, the resolved params (less ``schedule``, which changes
no result), the source of the ``lopd`` package and a fingerprint (path, size, mtime) of the
stage's input files (:data:`STAGE_IO`). A re-run finds the earlier stages' keys and reuses their
results (Prefect state ``Cached``) and runs from the stage that failed. A stage whose outputs
are missing runs again whatever its key. ``--set schedule.reuse_results=false`` runs everything.

Retries: ``schedule.retries`` after a transient failure (an OSError, a crash of a library); none
after bad params or bad data (ParamsError, DataValidationError, FileNotFoundError), which a
retry would only repeat.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from prefect import flow, task
from prefect.cache_policies import CachePolicy

from lopd import layout
from lopd.config import DEFAULT_PROFILE, Params, ParamsError, load_params
from lopd.ops.tracking import pipeline_run
from lopd.stages import STAGES


@dataclass(frozen=True)
class StageIO:
    """What a stage reads (its cache key fingerprints these) and writes (missing = run again)."""

    inputs: Callable[[Params], list[Path]]
    outputs: Callable[[Params], list[Path]]


def _students(p: Params) -> list[Path]:
    from lopd import layout

    return [layout.student_dir(p, m) for m in p.distill.methods if m != "vanilla"]


def _champion(p: Params) -> list[Path]:
    """The champion's local copy, which ``distill.init: champion`` trains from (the promote stage keeps it current)."""
    return [layout.champion_dir(p)] if p.distill.init == "champion" else []


def _metrics(stage: str) -> Callable[[Params], list[Path]]:
    return lambda p: [layout.metrics_path(p, stage)]


# The same dependencies as dvc.yaml's stages, as paths under paths.root.
STAGE_IO: dict[str, StageIO] = {
    "bootstrap": StageIO(lambda p: [Path(p.model.path).expanduser()] if p.model.path else [],
                         lambda p: _metrics("bootstrap")(p) + ([] if p.model.path else [layout.base_model_dir(p)])),
    "collect": StageIO(lambda p: [layout.policy_path(p)],
                       lambda p: [layout.rollouts_dir(p), layout.bank_dir(p), *_metrics("collect")(p)]),
    "ingest": StageIO(lambda p: [*map(Path, p.ingest.files), layout.bank_dir(p)], _metrics("ingest")),
    "index": StageIO(lambda p: [layout.bank_dir(p)], lambda p: [layout.index_dir(p), *_metrics("index")(p)]),
    "privilege": StageIO(lambda p: [layout.policy_path(p), layout.bank_dir(p), layout.index_dir(p)], _metrics("privilege")),
    "cold_start": StageIO(lambda p: [layout.policy_path(p), *_champion(p), layout.bank_dir(p), layout.index_dir(p)],
                          lambda p: [layout.composer_dir(p), *_metrics("cold_start")(p)]),
    "distill": StageIO(lambda p: [layout.policy_path(p), *_champion(p), layout.composer_dir(p), layout.bank_dir(p), layout.index_dir(p)],
                       lambda p: [*_students(p), *_metrics("distill")(p)]),
    "evaluate": StageIO(lambda p: [layout.policy_path(p), *_students(p)],
                        lambda p: [*_metrics("evaluate")(p), layout.metrics_path(p, "evaluate").with_suffix(".md")]),
    "promote": StageIO(lambda p: [*_students(p), *_metrics("evaluate")(p)], _metrics("promotion")),
}


def results_dir(p: Params) -> Path:
    """Where stage results and their cache keys persist (git-ignored, like all of ``.prefect/``)."""
    return p.root() / ".prefect" / "results"


def params_key(p: Params) -> str:
    d = p.model_dump()
    d.pop("schedule")
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def code_key() -> str:
    """Hash of every source file of the ``lopd`` package."""
    import lopd

    h = hashlib.sha256()
    for f in sorted(Path(lopd.__file__).parent.rglob("*.py")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def fingerprint(paths: list[Path]) -> list:
    """(path, size, mtime_ns) of every file under ``paths``; a missing path is (path, None)."""
    out: list = []
    for path in paths:
        path = Path(path)
        files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else []
        if not files:
            out.append((str(path), None))
        for f in files:
            st = f.stat()
            out.append((str(f), st.st_size, st.st_mtime_ns))
    return out


def stage_key(name: str, fn: Callable, p: Params) -> str | None:
    io = STAGE_IO.get(name)
    try:
        inputs = fingerprint(io.inputs(p)) if io else None
    except ParamsError:
        return None  # bad model.path: no caching, the stage itself reports it
    blob = json.dumps([name, f"{fn.__module__}.{fn.__qualname__}", params_key(p), code_key(), inputs], default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _cache_key(ctx, inputs: dict) -> str | None:
    (p,) = inputs.values()  # stage functions take the params only
    return stage_key(ctx.task.name, ctx.task.fn, p)


def outputs_missing(name: str, p: Params) -> bool:
    io = STAGE_IO.get(name)
    if io is None:
        return True  # nothing to check: never trust a cached result
    try:
        return not all(Path(o).exists() for o in io.outputs(p))
    except ParamsError:
        return True


def is_transient(task, task_run, state) -> bool:
    """retry_condition_fn: retry unless the failure is one a retry would only repeat."""
    from lopd.ops.validation import DataValidationError

    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # the exception could not be read back: treat the failure as transient
        return True
    return not isinstance(exc, (ParamsError, DataValidationError, FileNotFoundError))


def stage_task(name: str, fn: Callable[[Params], dict], p: Params | None = None):
    """A Prefect task for one stage: retried on transient failures, result persisted and cached.

    With ``p``: retries, result storage (under ``p``'s root) and cache refresh set for that run.
    """
    t = task(fn, name=name, retries=2, retry_delay_seconds=30, retry_condition_fn=is_transient,
             persist_result=True, cache_policy=CachePolicy.from_cache_key_fn(_cache_key))
    if p is None:
        return t
    storage = results_dir(p)
    storage.mkdir(parents=True, exist_ok=True)
    return t.with_options(
        retries=p.schedule.retries,
        retry_delay_seconds=p.schedule.retry_delay_s,
        result_storage=storage,  # a Path: a local file system there, no server-side block needed
        refresh_cache=not p.schedule.reuse_results or outputs_missing(name, p),
    )


# One Prefect task per entry of the STAGES registry, so a stage added there is in the flow too
# (default options; the flow configures them for each run's params).
STAGE_TASKS = {name: stage_task(name, fn) for name, fn in STAGES.items()}
bootstrap, collect, index = STAGE_TASKS["bootstrap"], STAGE_TASKS["collect"], STAGE_TASKS["index"]


@flow(name="lopd", log_prints=True)
def lopd_flow(params_path: str = "params.yaml", profile: str = DEFAULT_PROFILE, overrides: list[str] | None = None) -> dict:
    """Every registered stage in order: bootstrap → collect → ingest → index → privilege → cold_start → distill → evaluate → promote.

    Bootstrap adopts ``model.path`` when it is set (a real checkpoint: nothing is trained)."""
    p = load_params(params_path, None if profile in ("", "none") else profile, overrides or [])
    results = {}
    with pipeline_run(p, "flow"):  # one MLflow parent run; each stage's run nests under it
        for name, fn in STAGES.items():
            # Built when the stage is about to run, so the outputs check sees what earlier stages wrote.
            results[name] = stage_task(name, fn, p)(p)
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    lopd_flow(a.params, a.profile, a.overrides)
