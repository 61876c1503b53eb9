"""Operations, against real servers: the flow resumes at the stage that failed, deployment lopd/full
(served by flows/serve.py) runs the smoke pipeline to Completed on a Prefect server, a re-run
reuses every stage, growing the bank triggers a retrain, infra/prefect.yaml deploys to a process
work pool whose worker runs the flow, and an MLflow server answers with a distill run's metrics.

The served tests share one smoke pipeline run (module fixtures) in a temporary copy of the working
tree, so the repository's own outputs are never touched. Every server is a subprocess on a free
loopback port, waited for with a health check and killed in teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from lopd.config import Params, ParamsError, load_params

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STAGES = ["bootstrap", "collect", "ingest", "index", "privilege", "cold_start", "distill", "evaluate", "promote"]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


# ----------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, body: dict | None = None, timeout: float = 10.0):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


def wait_for(check, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    """Poll ``check()`` until it returns a truthy value; fail with the log's tail on timeout or exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (urllib.error.URLError, OSError, ValueError):
            value = None
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: process exited with {proc.returncode}\n{tail(log) if log else ''}")
        time.sleep(1.0)
    pytest.fail(f"{what}: not ready after {timeout:.0f}s\n{tail(log) if log else ''}")


def start(cmd: list[str], log: Path, **kw) -> subprocess.Popen:
    """A subprocess in its own session (so teardown can stop it and its children), output to ``log``."""
    return subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True, **kw)


def stop(proc: subprocess.Popen) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the process group this test started."""
    for sig, grace in ((signal.SIGINT, 15), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue
    try:  # children left in the group (e.g. a flow run) after the leader exited
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def base_env(prefect_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", PREFECT_HOME=str(prefect_home),
               PREFECT_SERVER_ANALYTICS_ENABLED="false", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", GX_ANALYTICS_ENABLED="false")
    return env


class PrefectServer:
    def __init__(self, home: Path):
        self.home, self.port = home, free_port()
        home.mkdir(parents=True, exist_ok=True)
        self.api = f"http://127.0.0.1:{self.port}/api"
        self.env = {**base_env(home), "PREFECT_API_URL": self.api}
        self.log = home / "server.log"
        self.proc = start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port), "--no-ui"],
                          self.log, env=base_env(home))
        wait_for(lambda: call(f"{self.api}/health") is True, 180, f"prefect server on port {self.port}", self.proc, self.log)

    def post(self, path: str, body: dict):
        return call(self.api + path, body)

    def get(self, path: str):
        return call(self.api + path)

    def task_states(self, flow_run_id: str) -> dict[str, str]:
        runs = self.post("/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "sort": "EXPECTED_START_TIME_ASC"})
        return {r["name"].rsplit("-", 1)[0]: r["state"]["name"] for r in runs}


def copy_worktree(dest: Path) -> Path:
    """Tracked and untracked-but-not-ignored files of the working tree (what a commit would hold)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO, capture_output=True, check=True, timeout=30).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"needs a git checkout to copy the working tree: {e}")
    for rel in filter(None, out.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def deployment_run(server: PrefectServer, cwd: Path, name: str, *params: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, str]:
    """`prefect deployment run NAME --watch`; returns the process and the flow run id."""
    cmd = [str(BIN / "prefect"), "deployment", "run", name, "--watch", "--watch-timeout", str(timeout)]
    for p in params:
        cmd += ["-p", p]
    proc = subprocess.run(cmd, cwd=cwd, env=server.env, capture_output=True, text=True, timeout=timeout + 60)
    run_id = next((line.split("UUID:")[1].strip() for line in proc.stdout.splitlines() if "UUID:" in line), None)
    assert run_id, f"no flow run created by {' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, run_id


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    server = PrefectServer(tmp_path_factory.mktemp("prefect-home"))
    yield server
    stop(server.proc)


@pytest.fixture(scope="module")
def served(prefect_server, tmp_path_factory):
    """A copy of the working tree serving lopd/full (and lopd-sweep/sweep if present) at the smoke profile."""
    repo = copy_worktree(tmp_path_factory.mktemp("repo"))
    log = prefect_server.home / "serve.log"
    proc = start([str(BIN / "python"), "-m", "flows.serve", "--profile", "smoke"], log, cwd=repo, env=prefect_server.env)
    wait_for(lambda: prefect_server.get("/deployments/name/lopd/full"), 120, "deployment lopd/full", proc, log)
    if (repo / "flows" / "sweep_flow.py").exists():
        wait_for(lambda: prefect_server.get("/deployments/name/lopd-sweep/sweep"), 60, "deployment lopd-sweep/sweep", proc, log)
    yield {"repo": repo, "server": prefect_server, "proc": proc, "log": log}
    stop(proc)


@pytest.fixture(scope="module")
def first_run(served):
    """`prefect deployment run lopd/full --watch`: the smoke pipeline, once for all tests below."""
    proc, run_id = deployment_run(served["server"], served["repo"], "lopd/full")
    return {"proc": proc, "id": run_id}


# ----------------------------------------------------------------------------- the flow resumes


@pytest.mark.slow
def test_rerun_after_a_failure_resumes_at_the_failed_stage(prefect_server, tmp_path, monkeypatch):
    """A cheap stage registry injected into the real flow, run in-process against a real server."""
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    import flows.lopd_flow as lf
    from lopd.memory.bank import BankError

    calls: list[str] = []
    fail: dict[str, type[Exception] | None] = {"c": OSError, "d": None}
    f = lambda p, name: p.root() / f"{name}.txt"  # noqa: E731

    def make(name: str, upstream: str | None):
        def stage(p):
            calls.append(name)
            if fail.get(name):
                exc = fail[name]
                raise exc("transient disk error") if exc is OSError else exc(f"stage {name}: bad data")
            text = (f(p, upstream).read_text() if upstream else "") + name
            f(p, name).write_text(text)
            return {"text": text}

        stage.__name__ = stage.__qualname__ = name
        return stage

    names = ["a", "b", "c", "d"]
    monkeypatch.setattr(lf, "STAGES", {n: make(n, up) for n, up in zip(names, [None, *names])})
    monkeypatch.setattr(lf, "STAGE_IO", {
        n: lf.StageIO(inputs=(lambda p, up=up: [f(p, up)] if up else []), outputs=(lambda p, n=n: [f(p, n)]))
        for n, up in zip(names, [None, *names])})
    overrides = [f"paths.root={tmp_path}", "schedule.retries=1", "schedule.retry_delay_s=0"]

    def run(*extra: str) -> tuple[bool, list[str]]:
        calls.clear()
        with temporary_settings({PREFECT_API_URL: prefect_server.api, PREFECT_HOME: tmp_path / "prefect-home"}):
            state = lf.lopd_flow(str(REPO / "params.yaml"), "smoke", overrides + list(extra), return_state=True)
            APILogWorker.drain_all(timeout=30)  # send the run's logs while this server is up
        return state.is_completed(), list(calls)

    # c fails with a transient error: retried once (schedule.retries=1), then the flow fails.
    assert run() == (False, ["a", "b", "c", "c"])
    # Re-run: a and b are reused; c runs; d fails on bad data, which is not retried.
    fail.update(c=None, d=BankError)
    assert run() == (False, ["c", "d"])
    fail["d"] = None
    assert run() == (True, ["d"])
    assert run() == (True, [])  # nothing changed: every stage reused
    assert (tmp_path / ".prefect" / "results").is_dir() and (tmp_path / "prefect-home").is_dir()
    # An input that changed re-runs its consumers; a missing output re-runs its producer.
    f(load_params(REPO / "params.yaml", "smoke", overrides), "a").write_text("a, edited")
    assert run() == (True, ["b", "c", "d"])
    assert (tmp_path / "d.txt").read_text() == "a, editedbcd"
    (tmp_path / "c.txt").unlink()
    assert run() == (True, ["c", "d"])
    # Different params, or reuse switched off, run everything; schedule.* changes no key.
    assert run("schedule.cron=0 4 * * *") == (True, [])
    assert run("seed=1") == (True, names)
    assert run("schedule.reuse_results=false") == (True, names)


# ----------------------------------------------------------------------------- the served deployment


@pytest.mark.slow
def test_deployment_run_watch_ends_completed(served, first_run):
    server, repo, proc = served["server"], served["repo"], first_run["proc"]
    assert proc.returncode == 0 and "Completed" in proc.stdout, f"{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}\n{tail(served['log'])}"
    run = server.get(f"/flow_runs/{first_run['id']}")
    assert run["state"]["type"] == "COMPLETED"
    assert server.task_states(first_run["id"]) == {s: "Completed" for s in STAGES}
    # The run happened in the copy, at the smoke profile.
    assert json.loads((repo / "metrics" / "bootstrap.json").read_text())["params"]["profile"] == "smoke"
    assert (repo / "models" / "student" / "config.json").exists() and (repo / "metrics" / "evaluate.md").exists()
    # The deployment: params' cron and timezone, the served profile, the bank trigger's automation.
    dep = server.get("/deployments/name/lopd/full")
    p = Params()
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in dep["schedules"]] == [
        (p.schedule.cron, p.schedule.timezone, True)]
    assert dep["parameters"]["profile"] == "smoke" and dep["parameters"]["params_path"] == str(repo / "params.yaml")
    automations = server.post("/automations/filter", {})
    assert [a["trigger"]["match"]["prefect.resource.id"] for a in automations if a["name"] == "retrain when the bank grows"] == [
        f"lopd.bank.{(repo / 'data' / 'bank').resolve()}"]
    # MLflow (the copy's own store): one parent run for the flow run, every stage's run nested under it
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlruns' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=[p.tracking.experiment], output_format="list")
    parents = [r for r in runs if r.data.tags.get("stage") == "pipeline" and r.info.run_name.startswith("flow-smoke-seed0-")]
    assert parents and all(r.info.status == "FINISHED" for r in parents), [r.info.run_name for r in runs]
    nested = [{r.data.tags.get("stage") for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id} for parent in parents]
    assert any(stages >= set(STAGES) for stages in nested), nested


@pytest.mark.slow
def test_second_deployment_run_reuses_every_stage(served, first_run):
    proc, run_id = deployment_run(served["server"], served["repo"], "lopd/full")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert served["server"].task_states(run_id) == {s: "Cached" for s in STAGES}


@pytest.mark.slow
def test_mlflow_server_answers_with_distill_beta_and_delta(served, first_run, tmp_path):
    repo = served["repo"]
    port, log = free_port(), tmp_path / "mlflow.log"
    env = {k: v for k, v in served["server"].env.items() if not k.startswith("PREFECT_")}
    # what `make ui` runs: the links, then `mlflow server` over the project store (mlruns/mlflow.db of the checkout)
    proc = start([str(BIN / "lopd"), "ui", "--profile", "smoke", "--port", str(port)], log, cwd=repo, env=env)
    api = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: urllib.request.urlopen(f"{api}/health", timeout=5).status == 200, 180, "mlflow server", proc, log)
        exp = call(f"{api}/api/2.0/mlflow/experiments/get-by-name?experiment_name=lopd")["experiment"]
        printed = log.read_text()
        assert f"runs table of experiment 'lopd': {api}/#/experiments/{exp['experiment_id']}/runs\n" in printed
        assert "newest pipeline run (stages nested under it): flow-smoke-seed0-" in printed
        runs = call(f"{api}/api/2.0/mlflow/runs/search", {
            "experiment_ids": [exp["experiment_id"]], "filter": "tags.stage = 'distill' and tags.method = 'lopd'",
            "order_by": ["attributes.start_time DESC"]})["runs"]
        assert runs, "no distill run of method lopd in the served pipeline's MLflow store"
        run_id = runs[0]["info"]["run_id"]
        history = {k: sorted((m["step"], m["value"]) for m in call(
            f"{api}/api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key={k}")["metrics"]) for k in ("beta", "delta")}
        p = load_params(repo / "params.yaml", "smoke")
        assert [s for s, _ in history["beta"]] == [s for s, _ in history["delta"]] == list(range(p.distill.steps))
        # The served numbers are LOPD's dual ascent: beta_t = max(0, beta_{t-1} + eta_beta (m - delta_t)).
        beta = p.distill.beta0
        for (_, b), (_, d) in zip(history["beta"], history["delta"]):
            beta = max(0.0, beta + p.distill.eta_beta * (p.distill.margin - d))
            assert b == pytest.approx(beta, abs=1e-6)
        # The UI can read the artifacts the stages wrote.
        ev = call(f"{api}/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]], "filter": "tags.stage = 'evaluate'"})["runs"][0]
        with urllib.request.urlopen(f"{api}/get-artifact?path=evaluate.md&run_uuid={ev['info']['run_id']}", timeout=10) as r:
            assert r.read().decode().startswith("| method |")
    finally:
        stop(proc)


_APPEND_ROUND = """
from lopd import layout
from lopd.memory.bank import append_round, expert_top_up, read_bank
from lopd.config import load_params
p = load_params("params.yaml", "smoke")
bank = read_bank(layout.bank_dir(p))
more = load_params("params.yaml", "smoke", [f"bank.expert_top_up={len(bank) + 8}"])
new = expert_top_up(more, bank, round_=1).iloc[len(bank):]
print("added", len(append_round(layout.bank_dir(p), new, 1, p.env.success_threshold)))
"""


@pytest.mark.slow
def test_bank_growth_triggers_a_retrain_from_index_on(served, first_run):
    server, repo = served["server"], served["repo"]
    dep_id = server.get("/deployments/name/lopd/full")["id"]
    out = subprocess.run([str(BIN / "python"), "-c", _APPEND_ROUND], cwd=repo, env=server.env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "added 8" in out.stdout, out.stderr[-3000:]

    def triggered():
        runs = server.post("/flow_runs/filter", {"deployments": {"id": {"any_": [dep_id]}}})
        return [r for r in runs if (r.get("created_by") or {}).get("type") == "AUTOMATION"]

    (run,) = wait_for(triggered, 120, "a flow run of lopd/full created by the bank trigger", served["proc"], served["log"])
    run = wait_for(lambda: (r := server.get(f"/flow_runs/{run['id']}"))["state"]["type"] in TERMINAL and r,
                   600, "the triggered run to finish", served["proc"], served["log"])
    assert run["state"]["type"] == "COMPLETED", tail(served["log"])
    assert run["created_by"]["display_value"] == "retrain when the bank grows"
    # Bootstrap and collect are reused; the grown bank re-runs everything that reads it.
    assert server.task_states(run["id"]) == {
        "bootstrap": "Cached", "collect": "Cached", **{s: "Completed" for s in STAGES[2:]}}
    assert json.loads((repo / "metrics" / "index.json").read_text())["n_entries"] == 64 + 8


@pytest.mark.slow
def test_prefect_yaml_deploys_to_a_process_work_pool(served, first_run, tmp_path):
    """infra/prefect.yaml on a fresh server: `prefect deploy`, a process worker, a run in the same checkout."""
    repo = served["repo"]
    server = PrefectServer(tmp_path / "prefect-home")
    worker = None
    try:
        env = {**server.env, "LOPD_HOME": str(repo)}
        sh = lambda *cmd: subprocess.run([str(BIN / "prefect"), *cmd], cwd=repo, env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
        made = sh("work-pool", "create", "lopd-process", "--type", "process", "--overwrite")
        assert made.returncode == 0, made.stdout + made.stderr
        names = ["--all"] if (repo / "flows" / "sweep_flow.py").exists() else ["--name", "full"]
        deployed = sh("--no-prompt", "deploy", *names, "--prefect-file", "infra/prefect.yaml")
        assert deployed.returncode == 0 and "successfully created" in deployed.stdout, deployed.stdout + deployed.stderr
        dep = server.get("/deployments/name/lopd/full")
        assert dep["work_pool_name"] == "lopd-process"
        assert dep["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(repo)}}]
        assert dep["parameters"]["params_path"] == str(repo / "params.yaml")
        worker_log = tmp_path / "worker.log"
        worker = start([str(BIN / "prefect"), "worker", "start", "--pool", "lopd-process", "--type", "process"],
                       worker_log, cwd=tmp_path, env=server.env)  # not the checkout: the pull step moves there
        proc, run_id = deployment_run(server, tmp_path, "lopd/full", "profile=smoke", timeout=400)
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{tail(worker_log)}"
        # Same checkout, same params as the served runs: every stage comes from their results.
        assert server.task_states(run_id) == {s: "Cached" for s in STAGES}
    finally:
        if worker is not None:
            stop(worker)
        stop(server.proc)


# ----------------------------------------------------------------------------- fast checks


def test_prefect_yaml_and_compose_agree_with_params():
    p = Params()
    spec = yaml.safe_load((REPO / "infra" / "prefect.yaml").read_text())
    full = next(d for d in spec["deployments"] if d["name"] == "full")
    assert full["entrypoint"] == "flows/lopd_flow.py:lopd_flow"
    assert full["schedules"] == [{"cron": p.schedule.cron, "timezone": p.schedule.timezone, "active": True}]
    assert full["parameters"]["profile"] == p.schedule.profile
    assert full["triggers"][0]["expect"] == ["lopd.bank.grew"]
    sweep = next(d for d in spec["deployments"] if d["name"] == "sweep")
    assert sweep["entrypoint"] == "flows/sweep_flow.py:sweep_flow"
    pools = {d["work_pool"]["name"] for d in spec["deployments"]}

    compose = yaml.safe_load((REPO / "infra" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "prefect-server", "prefect-worker", "mlflow"} <= set(services)
    worker_cmd = services["prefect-worker"]["command"]
    assert worker_cmd[worker_cmd.index("--pool") + 1] in pools and "process" in worker_cmd
    assert any(a.startswith("--backend-store-uri=postgresql://") for a in services["mlflow"]["command"])
    assert services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://")
    for name in ("prefect-server", "mlflow"):
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"])
    # The stages write artifacts to file URIs under mlruns/: the MLflow server must see the same volume.
    assert "mlruns:/opt/lopd/mlruns" in services["mlflow"]["volumes"] and "mlruns:/opt/lopd/mlruns" in services["prefect-worker"]["volumes"]
    init = (REPO / "infra" / "postgres-init.sql").read_text()
    assert "CREATE DATABASE prefect" in init and "CREATE DATABASE mlflow" in init


@pytest.mark.parametrize("override, message", [
    ("schedule.cron=every sunday", "schedule.cron = 'every sunday' is invalid"),
    ("schedule.timezone=Mars/Olympus", "schedule.timezone = 'Mars/Olympus' is invalid"),
    ("schedule.retries=-1", "schedule.retries = -1 is invalid"),
])
def test_schedule_params_fail_with_one_line(override, message):
    with pytest.raises(ParamsError) as e:
        load_params(REPO / "params.yaml", "smoke", [override])
    assert str(e.value).count("\n") == 0 and message in str(e.value)


def test_bank_events_are_inert_without_a_prefect_server(tmp_path):
    """append_round with no PREFECT_API_URL: the bank grows, and Prefect is not even imported."""
    code = f"""
import sys
import pandas as pd
from lopd.memory.bank import append_round, expert_top_up
from lopd.config import load_params
p = load_params({str(REPO / 'params.yaml')!r}, "smoke", ["bank.expert_top_up=3"])
rows = expert_top_up(p, pd.DataFrame(columns=["task_id"]))
print(len(append_round({str(tmp_path / 'bank')!r}, rows, 0, p.env.success_threshold)), "prefect" in sys.modules)
"""
    env = base_env(tmp_path / "home")
    out = subprocess.run([str(BIN / "python"), "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["3", "False"]
    assert not (tmp_path / "home").exists()  # nothing written to a Prefect home either
