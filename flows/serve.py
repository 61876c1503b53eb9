"""Serve deployment ``lopd/full`` (flow ``lopd``) and, when ``flows/sweep_flow.py`` exists,
``lopd-sweep/sweep``, from this checkout: ``python -m flows.serve [--start-server] [--profile smoke]``
(``make serve`` = ``--start-server`` on 127.0.0.1:4200).

``lopd/full`` runs every stage with the served profile (``--profile``, else ``schedule.profile``)
on the cron ``schedule.cron`` in ``schedule.timezone``, and, with ``schedule.bank_trigger``, on
every ``lopd.bank.grew`` event about this checkout's ``data/bank`` (``lopd.memory.bank.append_round``
emits it when ``$PREFECT_API_URL`` is set). At most one run of each deployment at a time; further
runs wait. Runs execute as subprocesses of this process, in this checkout (outputs under
``paths.root``), until Ctrl-C (which pauses the schedule).

``--start-server`` starts ``prefect server start`` on ``--host``/``--port`` with ``PREFECT_HOME``
(default ``<checkout>/.prefect``, git-ignored; its database is ``.prefect/prefect.db``) unless a
server already answers there, and stops it on exit. Without it, ``$PREFECT_API_URL`` must name a
running server.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from lopd.config import ParamsError, load_params

FLOW_NAME, DEPLOYMENT = "lopd", "full"
SWEEP_FLOW_FILE = Path(__file__).with_name("sweep_flow.py")


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(api_url: str, proc: subprocess.Popen | None, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if healthy(api_url):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with code {proc.returncode} before answering at {api_url}"
                               + (f"; see {log}" if log else ""))
        time.sleep(0.5)
    raise TimeoutError(f"no Prefect server answered at {api_url}/health within {timeout:.0f}s" + (f"; see {log}" if log else ""))


def start_server(host: str, port: int, home: Path, timeout: float = 180.0) -> subprocess.Popen:
    """``prefect server start`` in the background (log in ``<home>/server.log``), once it answers."""
    home.mkdir(parents=True, exist_ok=True)
    log = home / "server.log"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    # Its own session: Ctrl-C in the terminal reaches only the serving process, which pauses the
    # schedules through this server before `finally` stops it.
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
                            env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://{host}:{port}/api", proc, timeout, log)
    except BaseException:
        stop(proc)
        raise
    return proc


def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def build_deployments(params_path: Path, profile: str, overrides: list[str]) -> list:
    """The RunnerDeployments this checkout serves (see the module doc)."""
    from prefect.events import DeploymentEventTrigger
    from prefect.schedules import Cron

    from flows.lopd_flow import lopd_flow
    from lopd import layout
    from lopd.ops.events import BANK_GREW, bank_resource_id

    p = load_params(params_path, None if profile in ("", "none") else profile, overrides)
    parameters = {"params_path": str(params_path), "profile": profile, "overrides": overrides}
    triggers = [DeploymentEventTrigger(
        name="retrain when the bank grows",
        description=f"{BANK_GREW} about {layout.bank_dir(p)} (lopd.memory.bank.append_round added a round)",
        expect={BANK_GREW},
        match={"prefect.resource.id": bank_resource_id(layout.bank_dir(p))},
    )] if p.schedule.bank_trigger else []
    schedules = [Cron(p.schedule.cron, timezone=p.schedule.timezone)] if p.schedule.cron.strip() else []
    deployments = [lopd_flow.to_deployment(
        name=DEPLOYMENT,
        description="Every LOPD stage in order; stages whose inputs did not change reuse their results",
        parameters=parameters,
        schedules=schedules,
        triggers=triggers,
        concurrency_limit=1,
        tags=["lopd", f"profile:{profile}"],
    )]
    if SWEEP_FLOW_FILE.exists():  # lands with `lopd sweep`; a broken file is an error, not skipped
        from flows.sweep_flow import sweep_flow

        deployments.append(sweep_flow.to_deployment(
            name="sweep",
            description="Seeds x methods at one budget (flows/sweep_flow.py)",
            parameters={"params_path": str(params_path), "profile": profile, "overrides": overrides},
            concurrency_limit=1,
            tags=["lopd", f"profile:{profile}"],
        ))
    return deployments


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default="params.yaml", help="params file; its directory is the checkout served")
    ap.add_argument("--profile", default=None, help="profile of the served runs (default: schedule.profile)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override for the served runs (and the schedule), repeatable")
    ap.add_argument("--start-server", action="store_true", help="start a local Prefect server unless one answers")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=4200)
    args = ap.parse_args(argv)

    params_path = Path(args.params).resolve()
    root = params_path.parent
    try:
        base = load_params(params_path, None, args.overrides)
        profile = args.profile or base.schedule.profile
        load_params(params_path, None if profile in ("", "none") else profile, args.overrides)
    except ParamsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.chdir(root)  # flow runs inherit it: paths.root '.' is this checkout
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    server = None
    if args.start_server:
        url = f"http://{args.host}:{args.port}/api"
        if healthy(url):
            print(f"using the Prefect server already at {url}")
        else:
            print(f"starting a Prefect server at {url} (PREFECT_HOME={os.environ['PREFECT_HOME']})", flush=True)
            server = start_server(args.host, args.port, Path(os.environ["PREFECT_HOME"]))
        os.environ["PREFECT_API_URL"] = url
    elif not os.environ.get("PREFECT_API_URL"):
        print("error: no Prefect server: set PREFECT_API_URL=http://127.0.0.1:4200/api or pass --start-server", file=sys.stderr)
        return 2
    elif not healthy(os.environ["PREFECT_API_URL"]):
        print(f"error: no Prefect server answers at PREFECT_API_URL={os.environ['PREFECT_API_URL']}", file=sys.stderr)
        return 2

    try:
        from prefect import serve  # after PREFECT_API_URL / PREFECT_HOME are final: settings are read at import

        deployments = build_deployments(params_path, profile, args.overrides)
        print(f"serving {', '.join(f'{d.flow_name}/{d.name}' for d in deployments)} from {root} (profile {profile}); "
              f"in another shell: PREFECT_API_URL={os.environ['PREFECT_API_URL']} prefect deployment run {FLOW_NAME}/{DEPLOYMENT} --watch",
              flush=True)
        serve(*deployments)
    finally:
        if server is not None:
            stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
