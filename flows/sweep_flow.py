"""Flow `lopd-sweep`: ``lopd sweep`` (``lopd.experiments.headline.run``: every method at every seed, the
profile's ablations over the same seeds, the report), as a Prefect flow.

No logic here: the sweep (shared stages, one output root per seed, MLflow parent and child
runs, the aggregate tables) lives in ``lopd/experiments/sweep.py``, the ablations and the report
in ``lopd/experiments/headline.py`` and ``sweep_report.py``. Run it in-process with
``python -m flows.sweep_flow --profile smoke --seeds 0,1 --methods lopd,vanilla``.
"""

from __future__ import annotations

import argparse

from prefect import flow

from lopd.config import DEFAULT_PROFILE, load_params
from lopd.experiments import headline, sweep


@flow(name="lopd-sweep", log_prints=True)
def sweep_flow(
    params_path: str = "params.yaml",
    profile: str = DEFAULT_PROFILE,
    overrides: list[str] | None = None,
    seeds: list[int] = [0, 1, 2],  # noqa: B006 - Prefect parameters: the defaults are copied per run
    methods: list[str] = ["lopd", "opsd", "grpo", "vanilla", "sft"],  # noqa: B006
    name: str = "sweep",
    ablations: bool = True,
) -> dict:
    """``lopd sweep``: returns what ``lopd.experiments.headline.run`` returns (parent run id, per-seed metrics, aggregate, report)."""
    p = load_params(params_path, None if profile in ("", "none") else profile, overrides or [])
    return headline.run(p, list(seeds), list(methods), name, ablations)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--methods", default=",".join(sweep.DEFAULT_METHODS))
    ap.add_argument("--name", default="sweep")
    ap.add_argument("--no-ablations", action="store_true")
    a = ap.parse_args()
    sweep_flow(a.params, a.profile, a.overrides, sweep.parse_seeds(a.seeds), sweep.parse_methods(a.methods), sweep.check_name(a.name),
               not a.no_ablations)
