"""The pipeline's MLflow parent run: its name, its nesting, and its status when a stage fails."""

from datetime import datetime, timezone

import pytest

from lopd.config import load_params
from lopd.ops.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, pipeline_run, pipeline_run_name, stage_run


def _params(repo, tmp_path):
    return load_params(repo / "params.yaml", "smoke", [f"paths.root={tmp_path}", f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db"])


def test_parent_run_name_says_what_profile_seed_and_when(repo, tmp_path):
    p = _params(repo, tmp_path)
    when = datetime(2026, 12, 4, 19, 30, 5, tzinfo=timezone.utc)
    assert pipeline_run_name(p, "run", when) == "run-smoke-seed0-20261204-193005"


def test_stages_nest_under_the_parent_which_fails_with_them(repo, tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    p = _params(repo, tmp_path)
    with pytest.raises(RuntimeError, match="stage broke"):
        with pipeline_run(p, "run") as parent_id:
            with stage_run(p, "bootstrap"):
                pass
            raise RuntimeError("stage broke")
    client = MlflowClient(p.tracking.tracking_uri)
    assert client.get_run(parent_id).info.status == "FAILED"
    mlflow.set_tracking_uri(p.tracking.tracking_uri)
    (child,) = [r for r in mlflow.search_runs(experiment_names=["lopd"], output_format="list") if r.info.run_id != parent_id]
    assert child.data.tags["mlflow.parentRunId"] == parent_id and child.data.tags["pipeline_run_id"] == parent_id
    assert client.get_experiment_by_name("lopd").tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    with stage_run(p, "collect") as outside:  # after the pipeline: not nested any more
        pass
    assert "mlflow.parentRunId" not in client.get_run(outside.info.run_id).data.tags


def test_ui_links_point_at_the_runs_table_and_the_newest_parent_runs(repo, tmp_path, capsys):
    from lopd.cli import main
    from lopd.ops.tracking import ensure_experiment, ui_links

    p = _params(repo, tmp_path)
    assert ui_links(p, "http://127.0.0.1:5000") == [f"no MLflow store yet at {tmp_path}/mlflow.db: run `make run` (or `lopd run`) first"]
    assert not (tmp_path / "mlflow.db").exists()  # looking creates nothing
    for _ in range(2):
        with pipeline_run(p, "run") as parent_id:
            with stage_run(p, "bootstrap"):
                pass
    exp_id = ensure_experiment(p)
    base = f"http://127.0.0.1:5000/#/experiments/{exp_id}"
    lines = ui_links(p, "http://127.0.0.1:5000/")
    assert lines[0] == f"runs table of experiment 'lopd': {base}/runs"
    assert len(lines) == 2 and lines[1].startswith("newest pipeline run") and lines[1].endswith(f"{base}/runs/{parent_id}")  # no sweep yet
    args = ["ui", "--profile", "smoke", "--set", f"paths.root={tmp_path}", "--set", f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            "--port", "5123", "--links-only"]
    assert main(args) == 0
    assert f"http://127.0.0.1:5123/#/experiments/{exp_id}/runs\n" in capsys.readouterr().out
