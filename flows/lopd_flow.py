"""Flow `lopd`: the pipeline's stages as Prefect tasks, calling the same ``lopd`` stage functions
as the CLI and DVC. Run it in-process with ``python -m flows.lopd_flow --profile smoke``."""

from __future__ import annotations

import argparse

from prefect import flow, task

from lopd.config import DEFAULT_PROFILE, load_params
from lopd.stages import STAGES


def _stage_task(name: str):
    return task(STAGES[name], name=name, retries=1, retry_delay_seconds=5)


# One Prefect task per entry of the STAGES registry, so a stage added there is in the flow too.
STAGE_TASKS = {name: _stage_task(name) for name in STAGES}
bootstrap, collect, index = STAGE_TASKS["bootstrap"], STAGE_TASKS["collect"], STAGE_TASKS["index"]


@flow(name="lopd", log_prints=True)
def lopd_flow(params_path: str = "params.yaml", profile: str = DEFAULT_PROFILE, overrides: list[str] | None = None) -> dict:
    """Every registered stage in order: bootstrap → collect → index (later: cold start → distill → evaluate)."""
    p = load_params(params_path, profile, overrides or [])
    return {name: stage(p) for name, stage in STAGE_TASKS.items()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default=DEFAULT_PROFILE)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    lopd_flow(a.params, a.profile, a.overrides)
