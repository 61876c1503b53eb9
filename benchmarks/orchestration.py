"""Benchmark: the pipeline through the Prefect flow ``lopd`` vs the same stage functions called directly.

Each pipeline runs in its own fresh temporary ``paths.root`` (so neither reuses the other's
models, data, embeddings cache, MLflow store or persisted task results), in this process, against
a temporary Prefect server started for the benchmark (its start-up is timed and printed apart).
The heavy stage modules are imported before either is timed. With ``--repeats 2`` (default) the
order alternates (direct then flow, flow then direct) and the ratio is the sum of flow times over
the sum of direct times. Target: flow / direct ≤ 1.15.

    .venv/bin/python benchmarks/orchestration.py [--profile smoke] [--repeats 2] [--set k=v ...]

Writes only under the temporary directory (removed at the end unless ``--keep``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--repeats", type=int, default=2, help="pipelines of each kind; the order alternates")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--keep", action="store_true", help="keep the temporary roots")
    a = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="lopd-orchestration-"))
    os.environ["PREFECT_HOME"] = str(tmp / "prefect-home")
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # each root keeps its own sqlite store
    from flows.serve import start_server, stop

    t0 = time.perf_counter()
    port = free_port()
    server = start_server("127.0.0.1", port, tmp / "prefect-home")
    os.environ["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"  # before prefect is imported
    server_s = time.perf_counter() - t0
    try:
        from flows.lopd_flow import lopd_flow
        from lopd.cli import _quiet_libraries
        from lopd.config import load_params
        from lopd.stages import run_all

        _quiet_libraries()
        logging.basicConfig(level=logging.WARNING)
        for module in ("bootstrap", "collect", "index", "cold_start", "distill", "evaluate"):
            importlib.import_module(f"lopd.stages.{module}")  # import cost is not what is compared

        def direct(root: Path) -> float:
            p = load_params(a.params, a.profile, [*a.overrides, f"paths.root={root}"])
            t = time.perf_counter()
            run_all(p)
            return time.perf_counter() - t

        def flow(root: Path) -> float:
            t = time.perf_counter()
            state = lopd_flow(a.params, a.profile, [*a.overrides, f"paths.root={root}"], return_state=True)
            elapsed = time.perf_counter() - t
            if not state.is_completed():
                raise SystemExit(f"flow run ended {state.name}: {state.message}")
            return elapsed

        times: dict[str, list[float]] = {"direct": [], "flow": []}
        for i in range(a.repeats):
            order = [("direct", direct), ("flow", flow)][:: 1 if i % 2 == 0 else -1]
            for name, fn in order:
                root = tmp / f"{name}-{i}"
                root.mkdir()
                times[name].append(fn(root))
                print(f"run {i + 1}: {name:6s} {times[name][-1]:7.1f} s  (root {root})", flush=True)
    finally:
        stop(server)
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    d, f = sum(times["direct"]), sum(times["flow"])
    print(f"profile {a.profile}, {a.repeats} pipeline(s) of each kind, fresh roots, 1 process, "
          f"{os.environ.get('OMP_NUM_THREADS', '?')} torch thread(s)")
    print(f"prefect server start-up (not counted): {server_s:.1f} s")
    print(f"direct (lopd.stages.run_all): {' + '.join(f'{t:.1f}' for t in times['direct'])} = {d:.1f} s")
    print(f"flow   (flows.lopd_flow):     {' + '.join(f'{t:.1f}' for t in times['flow'])} = {f:.1f} s")
    print(f"flow / direct = {f / d:.3f}  (target <= 1.15)")


if __name__ == "__main__":
    main()
