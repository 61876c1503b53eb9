"""The Prefect flow runs the same stage functions, to the same outputs, against a real
(temporary, local) Prefect server."""

import json

import pytest

from lopd import layout
from lopd.config import load_params
from lopd.stages import STAGES

pytestmark = pytest.mark.slow


def test_flow_runs_every_stage_at_smoke_scale(tmp_path, repo, monkeypatch):
    from prefect.testing.utilities import prefect_test_harness

    from flows.lopd_flow import lopd_flow

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))
    overrides = [f"paths.root={tmp_path}", "bootstrap.n_demos=32", "collect.n_tasks=8"]
    with prefect_test_harness(server_startup_timeout=120):
        state = lopd_flow(str(repo / "params.yaml"), "smoke", overrides, return_state=True)
    assert state.is_completed(), state
    results = state.result()
    p = load_params(repo / "params.yaml", "smoke", overrides)
    assert list(results) == list(STAGES) and list(STAGES)[:3] == ["bootstrap", "collect", "index"]
    assert results["collect"] == json.loads(layout.metrics_path(p, "collect").read_text())
    assert results["collect"]["n_rollouts"] == 8
    # one MLflow parent run for the flow run; every stage run nested under it
    import mlflow

    from lopd.ops.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri(p))
    runs = mlflow.search_runs(experiment_names=[p.tracking.experiment], output_format="list")
    (parent,) = [r for r in runs if r.data.tags["stage"] == "pipeline"]
    assert parent.info.run_name.startswith("flow-smoke-seed0-") and parent.info.status == "FINISHED"
    stages = [r for r in runs if r is not parent]
    assert len(stages) >= len(STAGES) and all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id for r in stages)
