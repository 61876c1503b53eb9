"""The pipeline's stages in order: one registry that the CLI, ``lopd run`` and the flows share."""

from __future__ import annotations

import importlib
from typing import Callable

from lopd.config import Params


def _stage(module: str) -> Callable[[Params], dict]:
    """``lopd.<module>.run``, imported on first call (torch, mlflow and faiss load only when a stage runs)."""

    def run(p: Params) -> dict:
        return importlib.import_module(f"lopd.{module}").run(p)

    run.__name__ = run.__qualname__ = module
    return run


# name -> stage function, in pipeline order (CLI subcommands use the name with "-" for "_").
STAGES: dict[str, Callable[[Params], dict]] = {
    "bootstrap": _stage("bootstrap"),
    "collect": _stage("collect"),
    "index": _stage("index_stage"),
    "privilege": _stage("privilege"),  # text experiences vs none, before any latent is trained
    "cold_start": _stage("cold_start"),
    "distill": _stage("distill"),  # lopd needs cold start's models/composer
    "evaluate": _stage("evaluate"),
}


def run_all(p: Params) -> dict[str, dict]:
    """Every stage in order, in-process (no Prefect server involved)."""
    return {name: fn(p) for name, fn in STAGES.items()}
