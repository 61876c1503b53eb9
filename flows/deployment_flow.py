"""Flow `lopd-deployment`: the simulated deployment (``lopd.experiments.deployment.run``), as a Prefect flow.

No logic here: the weeks (production traffic, ingest, the retrain from the champion, the gate) live in
``lopd/experiments/deployment.py``. Run it in-process with
``python -m flows.deployment_flow --profile smoke --weeks 2 --tasks-per-week 16``.
"""

from __future__ import annotations

import argparse

from prefect import flow

from lopd.config import DEFAULT_PROFILE, load_params
from lopd.experiments import deployment


@flow(name="lopd-deployment", log_prints=True)
def deployment_flow(params_path: str = "params.yaml", profile: str = DEFAULT_PROFILE, overrides: list[str] | None = None,
                    weeks: int = 4, tasks_per_week: int = 64, seed: int | None = None) -> dict:
    """``lopd deploy-sim``: returns what ``metrics/deployment.json`` holds."""
    p = load_params(params_path, None if profile in ("", "none") else profile, overrides or [])
    return deployment.run(p, weeks, tasks_per_week, seed=seed)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--weeks", type=int, default=4)
    ap.add_argument("--tasks-per-week", type=int, default=64)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    deployment_flow(a.params, a.profile, a.overrides, a.weeks, a.tasks_per_week, a.seed)
