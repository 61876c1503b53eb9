"""One memory and process budget per sandboxed run: a cgroup, or a watchdog where none can be made.

Per-process rlimits do not bound a run: every forked process gets its own address-space limit
(4 × 300 MB raised the host's memory in use by 1.2 GB), and memfd and tmpfs pages count against
no process at all. A memory cgroup counts all of them (shared memory is charged to the cgroup of
the process that touches it) and a pids cgroup counts processes and threads.

:func:`make_run_cgroup` creates ``lopd-sandbox/run-<id>`` under this process's own cgroup in
each hierarchy (cgroup v1: ``memory`` and ``pids``; v2: the unified one, where the controllers
can be enabled) with ``memory`` (and swap) capped at the run's budget and ``pids`` at its process
limit. The sandbox's pid 1 moves itself in before it forks the program (``cgroup.procs`` ← 0),
so every process of the run is inside from its first instruction. The parent polls
:meth:`RunCgroup.over_budget` while the run lasts, kills the run on the first OOM kill (a run
over budget fails as a whole), then removes the cgroup.

Where no cgroup can be made (not root, a read-only or undelegated hierarchy) the sandbox falls
back to :class:`Watchdog` and says so loudly: the parent sums the resident memory of the run's
uid (``VmRSS``, shared pages included) and the private ``/tmp``'s usage every few milliseconds and
kills the run over budget; memfds and SysV shared memory are then denied by the seccomp filter
(pages no process maps would escape the sum). Its slack is what a program allocates between two
polls.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunCgroup", "Watchdog", "cgroup_unavailable_reason", "make_run_cgroup", "warn_watchdog"]

log = logging.getLogger(__name__)

PARENT = "lopd-sandbox"
REMOVE_WAIT_S = 5.0


def _mounts() -> dict[str, Path]:
    """Hierarchy → mount point: ``memory`` / ``pids`` (v1) and ``unified`` (v2)."""
    out: dict[str, Path] = {}
    with open("/proc/self/mounts") as f:
        for line in f:
            _, target, fstype, options, *_ = line.split()
            if fstype == "cgroup2":
                out.setdefault("unified", Path(target))
            elif fstype == "cgroup":
                for opt in options.split(","):
                    if opt in ("memory", "pids"):
                        out.setdefault(opt, Path(target))
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy (``/proc/self/cgroup``)."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            if hid == "0":
                out["unified"] = path
            for c in controllers.split(","):
                if c in ("memory", "pids"):
                    out[c] = path
    return out


@dataclass
class _Layout:
    version: int
    parents: dict[str, Path]  # hierarchy → the lopd-sandbox directory runs are created in


@functools.lru_cache(maxsize=1)
def _layout() -> _Layout | str:
    """Where run cgroups go, or why there is no such place (probed once)."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as exc:
        return f"cannot read this process's cgroups: {exc}"
    try:
        if "memory" in mounts and "pids" in mounts:  # v1 (or hybrid): one directory per controller
            parents = {c: mounts[c] / own.get(c, "/").lstrip("/") / PARENT for c in ("memory", "pids")}
            for p in parents.values():
                p.mkdir(exist_ok=True)
                _remove_orphans(p)
            return _Layout(1, parents)
        if "unified" in mounts:
            root = mounts["unified"]
            have = set((root / "cgroup.controllers").read_text().split())
            if not {"memory", "pids"} <= have:
                return f"the cgroup v2 hierarchy at {root} has no memory/pids controllers ({sorted(have)})"
            parent = root / PARENT  # at the root: a non-root cgroup with processes cannot enable controllers
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
            _remove_orphans(parent)
            return _Layout(2, {"unified": parent})
    except OSError as exc:
        return f"cannot create a cgroup ({exc.strerror or exc}: {getattr(exc, 'filename', '')})"
    return "no memory and pids cgroup hierarchy is mounted"


def _remove_orphans(parent: Path) -> None:
    """Delete the empty run cgroups of processes that died mid-run (``run-<pid>-<id>``: nobody else removes them)."""
    for d in parent.glob("run-*-*"):
        try:
            os.kill(int(d.name.split("-")[1]), 0)
        except ProcessLookupError:
            try:
                d.rmdir()
            except OSError:
                pass  # still populated: its processes are dying; a later start removes it
        except (ValueError, PermissionError):
            pass


def cgroup_unavailable_reason() -> str | None:
    layout = _layout()
    return layout if isinstance(layout, str) else None


class RunCgroup:
    """The cgroup(s) of one run."""

    def __init__(self, layout: _Layout, memory_bytes: int, max_pids: int) -> None:
        name = f"run-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.version = layout.version
        self.dirs = {h: p / name for h, p in layout.parents.items()}
        try:
            for d in self.dirs.values():
                d.mkdir()
            if self.version == 1:
                mem, pids = self.dirs["memory"], self.dirs["pids"]
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                if (mem / "memory.memsw.limit_in_bytes").exists():  # swap too: pages pushed out still count
                    (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (pids / "pids.max").write_text(str(max_pids))
            else:
                d = self.dirs["unified"]
                (d / "memory.max").write_text(str(memory_bytes))
                if (d / "memory.swap.max").exists():
                    (d / "memory.swap.max").write_text("0")
                (d / "memory.oom.group").write_text("1")  # an OOM kill takes the whole run
                (d / "pids.max").write_text(str(max_pids))
        except OSError:
            self.remove()
            raise

    @property
    def procs_files(self) -> list[str]:
        """What the run's pid 1 writes ``0`` to, to move itself (and so all it forks) in."""
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def _mem(self) -> Path:
        return self.dirs["memory" if self.version == 1 else "unified"]

    def oom_kills(self) -> int:
        """OOM kills inside this run so far (also counts a run that hit the limit and could not reclaim)."""
        d = self._mem()
        try:
            if self.version == 1:
                stats = dict(line.split() for line in (d / "memory.oom_control").read_text().splitlines())
                return int(stats.get("oom_kill", "0"))
            events = dict(line.split() for line in (d / "memory.events").read_text().splitlines())
            return int(events.get("oom_kill", "0"))
        except (OSError, ValueError):
            return 0

    def peak_bytes(self) -> int:
        d = self._mem()
        for name in ("memory.max_usage_in_bytes", "memory.peak"):
            try:
                return int((d / name).read_text())
            except (OSError, ValueError):
                continue
        return 0

    def over_budget(self) -> bool:
        return self.oom_kills() > 0

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs.values():
            try:
                out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(out)

    def kill(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self) -> list[int]:
        """Wait until the run's processes are gone (killing stragglers), then delete it; the pids left, if any."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        while (left := self.pids()) and time.monotonic() < deadline:
            self.kill()
            time.sleep(0.005)
        for d in self.dirs.values():
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("sandbox: cannot remove cgroup %s: %s", d, exc)
        return left


def make_run_cgroup(memory_mb: int, max_pids: int) -> RunCgroup | None:
    """A fresh cgroup for one run, or None where none can be made (:func:`cgroup_unavailable_reason`)."""
    layout = _layout()
    return None if isinstance(layout, str) else RunCgroup(layout, memory_mb << 20, max_pids)


@functools.lru_cache(maxsize=None)
def warn_watchdog(reason: str) -> None:
    """Say loudly, once per reason and process, that runs are bounded by the weaker watchdog."""
    log.warning("code sandbox: NO cgroup for the runs' memory/process budget (%s); falling back to a parent-side "
                "watchdog on the sandbox uid's resident memory, with memfds and SysV shared memory denied", reason)


class Watchdog:
    """The fallback budget: the run's uid's resident memory plus its private /tmp, polled by the parent."""

    def __init__(self, uid: int, memory_mb: int) -> None:
        self.uid, self.budget, self.peak = uid, memory_mb << 20, 0

    def usage_bytes(self) -> int:
        from .uids import processes_of
        total, tmp_seen = 0, False
        for pid in processes_of(self.uid):
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next((int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:")), 0)
                if not tmp_seen:  # one private /tmp per run, seen through any of its processes
                    st = os.statvfs(f"/proc/{pid}/root/tmp")
                    total += (st.f_blocks - st.f_bfree) * st.f_frsize
                    tmp_seen = True
            except (OSError, ValueError):
                continue
        self.peak = max(self.peak, total)
        return total

    def over_budget(self) -> bool:
        return self.usage_bytes() > self.budget
