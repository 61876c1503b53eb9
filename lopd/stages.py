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


# name -> stage function; later issues append index, cold-start, distill, evaluate.
STAGES: dict[str, Callable[[Params], dict]] = {
    "bootstrap": _bootstrap,
    "collect": _collect,
}


def run_all(p: Params) -> dict[str, dict]:
    """Every stage in order, in-process (no Prefect server involved)."""
    return {name: fn(p) for name, fn in STAGES.items()}
