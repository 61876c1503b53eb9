"""MLflow tracking: one store under ``<repo>/mlruns/`` unless ``MLFLOW_TRACKING_URI`` says otherwise.

The URI is absolute, so DVC experiments queued into a temp copy of the repo still log to the
real store. Each stage opens one run named after itself and logs its resolved params.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from lopd.config import Params

# The user's choice, read once: mlflow.set_tracking_uri() writes this variable itself, so
# reading it later would pick up whatever store the previous stage in this process used.
_ENV_URI = os.environ.get("MLFLOW_TRACKING_URI")


def tracking_uri(params: Params) -> str:
    """params ``tracking.tracking_uri`` > ``$MLFLOW_TRACKING_URI`` > sqlite under ``<root>/mlruns``."""
    if params.tracking.tracking_uri:
        return params.tracking.tracking_uri
    if _ENV_URI:
        return _ENV_URI
    return f"sqlite:///{params.root() / 'mlruns' / 'mlflow.db'}"


def _git_commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


@contextmanager
def stage_run(params: Params, stage: str, run_name: str | None = None, **tags: str) -> Iterator["object"]:
    """An MLflow run for one stage, with its params, the git commit and the params hash."""
    import mlflow  # slow import: only when a stage actually runs

    uri = tracking_uri(params)
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    artifacts = (params.root() / "mlruns" / "artifacts").as_uri()
    if mlflow.get_experiment_by_name(params.tracking.experiment) is None:
        mlflow.create_experiment(params.tracking.experiment, artifact_location=artifacts)
    mlflow.set_experiment(params.tracking.experiment)
    name = run_name or f"{stage}-seed{params.seed}"
    all_tags = {
        "stage": stage,
        "seed": str(params.seed),
        "profile": params.profile or "none",
        "git_commit": _git_commit(params.root()),
        "params_hash": params.digest(),
        **tags,
    }
    with mlflow.start_run(run_name=name, tags=all_tags) as run:
        mlflow.log_params({k: _short(v) for k, v in params.flat().items()})
        yield run


def _short(v: object) -> str:
    s = str(v)
    return s if len(s) <= 500 else s[:497] + "..."
