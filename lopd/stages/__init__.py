"""Layer `stages`: the pipeline's stages, and the one registry (in order) that the CLI, ``lopd run``, DVC and the flows share.

Each ``lopd.stages.<name>.run(p)`` reads its inputs from ``paths.root``, writes its outputs atomically and logs
to MLflow. Imports ``lopd.train`` and below. See docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import Callable

from lopd.config import Params


def _stage(module: str) -> Callable[[Params], dict]:
    """``lopd.stages.<module>.run``, imported on first call (torch, mlflow and faiss load only when a stage runs)."""

    def run(p: Params) -> dict:
        return importlib.import_module(f"lopd.stages.{module}").run(p)

    run.__name__ = run.__qualname__ = module
    return run


# name -> stage function, in pipeline order (CLI subcommands use the name with "-" for "_").
STAGES: dict[str, Callable[[Params], dict]] = {
    "bootstrap": _stage("bootstrap"),
    "collect": _stage("collect"),
    "ingest": _stage("ingest"),  # deployed trajectories (ingest.files) validated into a new bank round; none by default
    "index": _stage("index"),
    "privilege": _stage("privilege"),  # text experiences vs none, before any latent is trained
    "cold_start": _stage("cold_start"),
    "distill": _stage("distill"),  # lopd needs cold start's models/composer
    "evaluate": _stage("evaluate"),
    "promote": _stage("promote"),  # register every student; the gate moves the alias `champion` (dev only)
}


def run_all(p: Params) -> dict[str, dict]:
    """Every stage in order, in-process (no Prefect server involved)."""
    return {name: fn(p) for name, fn in STAGES.items()}
