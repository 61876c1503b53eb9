import fnmatch
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

REPO = Path(__file__).resolve().parents[1]

# The suite runs on pytest-xdist workers (pyproject's addopts: -n auto --dist loadscope; docs/operate.md,
# "How the suite is parallelised"). loadscope sends each test module to one worker as a whole, so a module's
# fixtures (a smoke pipeline, a Prefect server, a trained project) are built once and its tests run in file
# order, as in one process. (loadgroup's xdist_group marks do not work with pytest 9.2 and xdist 3.8.0:
# xdist writes the group into Item._nodeid, which pytest 9.2 no longer reads; pytest-xdist issue #1386.)
#
# The modules whose work dominates the wall time, heaviest first, as measured (docs/operate.md's durations
# table). With --no-loadscope-reorder the workers take modules in collection order, so these start first and
# the many short modules fill the gaps at the end. A module missing here is only scheduled later.
HEAVY_FIRST = [
    "tests/test_ops.py",
    "tests/train/test_parallel.py",
    "tests/test_dvc.py",
    "tests/test_pipeline_smoke.py",
    "tests/test_env_pipelines.py",
    "tests/experiments/test_sweep.py",
    "tests/test_real_checkpoint.py",
    "tests/train/test_distill.py",
]


# Modules that must never run at the same time as each other: one work unit, so one worker runs them one after
# the other. The sandbox's uids are held host-wide (flock, lopd/envs/code/uids.py), so two workers would no
# longer share one; but the memory-budget tests measure the host's available memory while a hog runs, and the
# hostile battery's 0.5-1.5 s timeouts, both of which another worker's sandbox runs would disturb.
RUN_APART_TOGETHER = {"code-sandbox": ("tests/envs/test_code_*.py", "tests/test_env_pipelines.py")}


def _unit(nodeid: str) -> str:
    """The work unit of a test: its RUN_APART_TOGETHER name, else its module."""
    module = nodeid.split("::", 1)[0]
    return next((name for name, globs in RUN_APART_TOGETHER.items() if any(fnmatch.fnmatch(module, g) for g in globs)), module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope with the units of :func:`_unit` (xdist's own loadscope: one unit per module or class)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return UnitScheduling(config, log)


def _workers() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: `pytest -p no:xdist` must still load this file
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per CPU this process may use (xdist's own default counts physical cores)."""
    return _cpus()


def pytest_configure(config):
    # Each worker gets its share of the CPUs for torch's intra-op threads: with torch's default (one thread per
    # CPU) two workers would each spread tiny matmuls over both cores and fight for them. An OMP_NUM_THREADS
    # set by the caller wins (torch reads it at import).
    if _workers() > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, _cpus() // _workers()))


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands out modules in this order
        rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
        items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: file order kept


@pytest.fixture
def repo() -> Path:
    return REPO
