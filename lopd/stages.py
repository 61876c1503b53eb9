"""The pipeline's stages in order: one registry that the CLI, ``lopd run`` and the flows share."""

from __future__ import annotations

from typing import Callable

from lopd.config import Params


def _bootstrap(p: Params) -> dict:
    from lopd import bootstrap

    return bootstrap.run(p)


def _collect(p: Params) -> dict:
    from lopd import collect

    return collect.run(p)


def _index(p: Params) -> dict:
    from lopd import index_stage

    return index_stage.run(p)


def _cold_start(p: Params) -> dict:
    from lopd import cold_start

    return cold_start.run(p)


def _distill(p: Params) -> dict:
    from lopd import distill

    return distill.run(p)


def _evaluate(p: Params) -> dict:
    from lopd import evaluate

    return evaluate.run(p)


# name -> stage function, in pipeline order (CLI subcommands use the name with "-" for "_").
STAGES: dict[str, Callable[[Params], dict]] = {
    "bootstrap": _bootstrap,
    "collect": _collect,
    "index": _index,
    "cold_start": _cold_start,
    "distill": _distill,
    "evaluate": _evaluate,
}


def run_all(p: Params) -> dict[str, dict]:
    """Every stage in order, in-process (no Prefect server involved)."""
    return {name: fn(p) for name, fn in STAGES.items()}
