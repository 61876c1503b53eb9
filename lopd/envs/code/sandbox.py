"""Run untrusted Python in a real sandbox: Linux namespaces, a minimal read-only root, an
unprivileged uid, a seccomp filter, rlimits, one memory and process budget per run (a cgroup),
a wall clock and an output cap.

One run is ``unshare --fork --kill-child --pid --net --mount --mount-proc --ipc --uts`` starting
the base interpreter on :file:`_sandbox_init.py` (read its docstring for what happens inside):
pid 1 of the new namespaces builds a root that holds only ``/usr``, the interpreter's prefix
(site-packages hidden), four device nodes and a private size-capped ``/tmp`` (the working
directory), then forks the program as an unprivileged uid with no capabilities, no new
privileges, a syscall filter (:mod:`.seccomp`: no keyring, io_uring, bpf, ptrace, namespaces or
mounts) and rlimits on memory, CPU, processes, file size and open files, all inside a cgroup that
caps the whole run's memory (memfds and ``/tmp`` included) and processes (:mod:`.cgroup`; a loud
watchdog fallback where none can be made). There is no network
(an empty network namespace), no view of the host's processes, and no path to the checkout,
``/etc``, ``/root`` or any installed data set. About 30 ms a run.

Why the parts that look redundant are there (each was measured):

- the unprivileged uid: root ignores ``RLIMIT_NPROC``, so a fork bomb run as root is unbounded;
- killing ``unshare`` rather than a process group: killing the group left zombies and setsid'd
  children behind. ``--kill-child`` turns the death of ``unshare`` into SIGKILL for pid 1 of the
  namespace, and the kernel then kills every process in it;
- a uid per concurrent run, across processes (a pool of uids, each held with ``flock`` on its
  own lock file, so data-parallel ranks and two pipelines never share one; a lock dies with its
  process): after a kill, the run waits until none of its processes is left, so the caller never
  sees a straggler, and one run's fork bomb cannot use up the process limit of another run;
- the output cap: at most ``max_output_bytes`` are read from each stream, then the run is killed.

Where namespaces are refused (no root, an unprivileged container) :func:`run_python` raises
:class:`SandboxUnavailable` naming the fix, unless ``allow_unsafe`` is set: then it runs a plain
subprocess with the rlimits only and says so with ``logging.warning`` on every run.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .cgroup import Watchdog, cgroup_unavailable_reason, make_run_cgroup, warn_watchdog
from .seccomp import filter_bpf, seccomp_unavailable_reason
from .uids import UIDS, processes_of, stray_processes  # noqa: F401 - stray_processes: part of this API

__all__ = ["SandboxError", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "run_python",
           "sandbox_available", "sandbox_unavailable_reason", "stray_processes"]

log = logging.getLogger(__name__)

INIT_SOURCE = Path(__file__).with_name("_sandbox_init.py").read_text()
UNSHARE_FLAGS = ("--fork", "--kill-child", "--pid", "--net", "--mount", "--mount-proc", "--ipc", "--uts")
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # all the program sees of the host's environment
MAX_SOURCE_BYTES = 100_000  # the program travels as one argv string (Linux caps one at 128 KiB)
REAP_WAIT_S = 5.0  # after a kill, how long to wait for the namespace's processes to be gone
WATCH_EVERY_S = 0.01  # how often the parent checks the run's memory budget

FIX = ("run as root where pid/net/mount namespaces are allowed (e.g. `docker run --privileged ...` or a VM), "
       "or pass allow_unsafe=True to run the code WITHOUT isolation (rlimits only)")


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): setup, privilege drop, or launch."""


class SandboxUnavailable(SandboxError):
    """Namespaces are not available here; the message names the fix."""


@dataclass(frozen=True)
class SandboxLimits:
    """The knobs of one sandboxed run."""

    timeout_s: float = 5.0  # wall clock for the whole run; the namespace is killed after it
    memory_mb: int = 512  # RLIMIT_AS (address space) of each process
    cpu_s: int | None = None  # RLIMIT_CPU of each process; None = ceil(timeout_s) + 1
    max_procs: int = 16  # RLIMIT_NPROC of the sandbox uid (processes + threads)
    max_file_mb: int = 16  # RLIMIT_FSIZE: the largest file the program may write
    max_open_files: int = 64  # RLIMIT_NOFILE
    tmp_mb: int = 64  # size of the private /tmp tmpfs, the program's working directory
    max_output_bytes: int = 65536  # read at most this much of stdout and of stderr, then kill the run
    uid_base: int = 64100  # first uid of the pool of unprivileged uids (must be unused on the host)
    uid_slots: int = 32  # concurrent runs (of every process on the host) get distinct uids base .. base + slots - 1
    run_memory_mb: int = 512  # the whole run's memory: every process, memfds, shared memory and its /tmp
    cgroup: bool = True  # enforce run_memory_mb and max_procs with a cgroup where one can be made (else a watchdog)
    hide: tuple[str, ...] = ()  # extra host paths (inside /usr or the interpreter prefix) to cover with an empty tmpfs
    allow_unsafe: bool = False  # no namespaces: run a plain subprocess with rlimits only (logged every run)

    def __post_init__(self) -> None:
        positive = {"timeout_s": self.timeout_s, "memory_mb": self.memory_mb, "max_procs": self.max_procs,
                    "max_file_mb": self.max_file_mb, "max_open_files": self.max_open_files, "tmp_mb": self.tmp_mb,
                    "max_output_bytes": self.max_output_bytes, "uid_slots": self.uid_slots,
                    "run_memory_mb": self.run_memory_mb}
        if self.cpu_s is not None:
            positive["cpu_s"] = self.cpu_s
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {value!r}")
        if not 1000 <= self.uid_base <= 2**31 - self.uid_slots:
            raise ValueError(f"SandboxLimits.uid_base must be an unprivileged uid (>= 1000), got {self.uid_base}")
        if self.max_open_files < 16:
            raise ValueError(f"SandboxLimits.max_open_files must be >= 16 (Python needs a few), got {self.max_open_files}")

    def rlimits(self) -> list[int]:
        """Values for _sandbox_init.RLIMITS: AS, CPU, NPROC, FSIZE, NOFILE, CORE."""
        cpu = self.cpu_s if self.cpu_s is not None else math.ceil(self.timeout_s) + 1
        return [self.memory_mb << 20, cpu, self.max_procs, self.max_file_mb << 20, self.max_open_files, 0]


@dataclass
class SandboxResult:
    """What a run produced. ``returncode`` follows :mod:`subprocess`: negative = killed by that
    signal (-9 when the sandbox killed the run for its timeout or output cap)."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    wall_s: float
    isolated: bool = True  # False for an allow_unsafe run
    memory_exceeded: bool = False  # killed for going over run_memory_mb
    memory_peak_mb: float = 0.0  # the run's peak memory as its cgroup (or the watchdog) saw it


@functools.lru_cache(maxsize=None)
def _layout() -> tuple[str, tuple[str, ...], tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The base interpreter, and what the new root binds, links and hides."""
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    binds, links = ["/usr"], []
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            binds.append(top)
    for extra in (prefix, os.path.dirname(python)):
        if not any(extra == b or extra.startswith(b + "/") for b in binds):
            binds.append(extra)
    hide = sorted({p for root in ("/usr/lib", "/usr/local/lib", f"{prefix}/lib")
                   for p in glob.glob(f"{root}/python3*/*-packages")})
    return python, tuple(binds), tuple(links), tuple(hide)


def _communicate(proc: subprocess.Popen, data: bytes, deadline: float, cap: int,
                 over_budget: Callable[[], bool]) -> tuple[bytes, bytes, bool, bool, bool]:
    """Feed stdin and read stdout/stderr until EOF, the deadline, the cap or the memory budget, then until
    the process exits: ``(out, err, timed_out, truncated, over)``."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    timed_out = truncated = over = False
    next_check = time.monotonic() + WATCH_EVERY_S

    def over_now() -> bool:  # at most every WATCH_EVERY_S: the watchdog's check scans /proc
        nonlocal next_check
        if time.monotonic() < next_check:
            return False
        next_check = time.monotonic() + WATCH_EVERY_S
        return over_budget()

    with selectors.DefaultSelector() as sel:
        for f in bufs:
            sel.register(f, selectors.EVENT_READ)
        if data:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        view, pos = memoryview(data), 0
        while sel.get_map() and not truncated:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if over_now():
                over = True
                break
            for key, _ in sel.select(min(remaining, WATCH_EVERY_S)):
                f = key.fileobj
                if f is proc.stdin:
                    try:
                        pos += os.write(f.fileno(), view[pos:pos + 65536])
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        pos = len(view)
                    if pos >= len(view):
                        sel.unregister(f)
                        f.close()
                    continue
                chunk = os.read(f.fileno(), 65536)
                if not chunk:
                    sel.unregister(f)
                    continue
                buf = bufs[f]
                room = cap - len(buf)
                buf += chunk[:room]
                if len(chunk) > room:
                    truncated = True
                    break
    while not (timed_out or truncated or over) and proc.poll() is None:  # it may close its streams and run on
        if time.monotonic() >= deadline:
            timed_out = True
        elif over_now():
            over = True
        else:
            try:  # returns the moment it exits
                proc.wait(timeout=min(WATCH_EVERY_S, max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), timed_out, truncated, over


def _read_status(fd: int) -> str:
    os.set_blocking(fd, False)
    out = b""
    try:
        while chunk := os.read(fd, 4096):
            out += chunk
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return out.decode(errors="replace")


def _run(source: str, stdin: bytes, limits: SandboxLimits, isolated: bool) -> SandboxResult:
    if len(source.encode()) > MAX_SOURCE_BYTES:
        raise ValueError(f"run_python: source of {len(source.encode())} bytes exceeds {MAX_SOURCE_BYTES}; "
                         "pass large inputs through stdin instead")
    python, binds, links, hide = _layout()
    cfg = {"isolated": isolated, "source": source, "rlimits": limits.rlimits(), "tmp_mb": limits.tmp_mb,
           "binds": binds, "links": links, "hide": [*hide, *limits.hide]}
    workdir = None if isolated else tempfile.mkdtemp(prefix="lopd-unsafe-")
    with UIDS.take(limits.uid_base, limits.uid_slots) if isolated else _no_uid() as uid:
        # one budget for the whole run: a cgroup its pid 1 joins before forking the program, else a watchdog
        group, why = None, "SandboxLimits.cgroup is False"
        if isolated and limits.cgroup:
            try:
                group = make_run_cgroup(limits.run_memory_mb, limits.max_procs + 2)
                why = cgroup_unavailable_reason() or ""
            except OSError as exc:  # this run's cgroup could not be made (a full hierarchy?): the watchdog serves
                why = f"this run's cgroup failed: {exc}"
        watchdog = None
        if isolated and group is None:
            warn_watchdog(why)
            watchdog = Watchdog(uid, limits.run_memory_mb)
        budget = group or watchdog
        cfg.update(uid=uid, cgroup_procs=group.procs_files if group else [],
                   seccomp=filter_bpf(deny_shared_memory=group is None).hex() if isolated else "")
        status_r, status_w = os.pipe() if isolated else (-1, -1)
        cfg.update(status_fd=status_w)
        argv = [python, "-I", "-S", "-B", "-c", INIT_SOURCE, json.dumps(cfg)]
        killed = over = False
        peak = 0
        start = time.monotonic()
        try:
            try:
                proc = subprocess.Popen(
                    [shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin") or "unshare", *UNSHARE_FLAGS, *argv]
                    if isolated else argv,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                    cwd=workdir or "/", pass_fds=(status_w,) if isolated else (), start_new_session=not isolated)
            finally:
                if isolated:
                    os.close(status_w)
            try:
                out, err, timed_out, truncated, over = _communicate(
                    proc, stdin, start + limits.timeout_s, limits.max_output_bytes,
                    budget.over_budget if budget else (lambda: False))
                killed = timed_out or truncated or over
                if killed:
                    if isolated:
                        proc.kill()  # --kill-child: pid 1 of the namespace dies, and with it every process inside
                    else:
                        os.killpg(proc.pid, signal.SIGKILL)
                returncode = proc.wait()
                wall_s = time.monotonic() - start
            finally:
                for f in (proc.stdin, proc.stdout, proc.stderr):
                    if f is not None and not f.closed:
                        f.close()
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                status = _read_status(status_r) if isolated else ""
                if workdir is not None:
                    shutil.rmtree(workdir, ignore_errors=True)
        finally:
            if group is not None:
                over = over or group.over_budget()  # an OOM kill just before the end still fails the run
                peak = group.peak_bytes()
                if left := group.remove():
                    log.error("sandbox: processes %s of the run's cgroup still alive %.0f s after the kill", left,
                              REAP_WAIT_S)
            elif watchdog is not None:
                peak = watchdog.peak
                if killed:
                    _wait_gone(uid)
    stderr = err.decode(errors="replace")
    if isolated and not killed:
        if status.startswith("err "):
            raise SandboxError(f"sandbox setup failed: {status[4:].strip()}")
        if not status.startswith("exit "):
            raise SandboxError(f"sandbox did not start (unshare exit {returncode}): {stderr.strip()[-500:]}")
        returncode = os.waitstatus_to_exitcode(int(status.split()[1]))
    return SandboxResult(-9 if killed or over else returncode, out.decode(errors="replace"), stderr, timed_out,
                         truncated, wall_s, isolated, memory_exceeded=over,
                         memory_peak_mb=(peak if budget else 0) / 2**20)


@contextmanager
def _no_uid() -> Iterator[int]:
    yield -1  # an allow_unsafe run keeps the caller's uid


def _wait_gone(uid: int) -> None:
    """Block until the killed namespace has no process left (the kernel tears it down asynchronously)."""
    deadline = time.monotonic() + REAP_WAIT_S
    while pids := processes_of(uid):
        if time.monotonic() > deadline:
            log.error("sandbox: processes %s of uid %d still alive %.0f s after the kill", pids, uid, REAP_WAIT_S)
            return
        time.sleep(0.005)


@functools.lru_cache(maxsize=1)
def sandbox_unavailable_reason() -> str | None:
    """Why the isolated sandbox cannot run here, or None when it can (probed once, then cached)."""
    if sys.platform != "linux":
        return f"namespaces need Linux, this is {sys.platform}"
    if shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin") is None:
        return "`unshare` (util-linux) is not installed"
    if os.geteuid() != 0:
        return f"not root (euid {os.geteuid()}): creating namespaces and switching to the sandbox uid needs root"
    if (reason := seccomp_unavailable_reason()) is not None:
        return reason
    try:
        result = _run("print('lopd-sandbox-ok')", b"", SandboxLimits(timeout_s=30.0), isolated=True)
    except (SandboxError, OSError) as exc:
        return str(exc)
    if result.stdout != "lopd-sandbox-ok\n":
        return f"probe run failed (exit {result.returncode}): {result.stderr.strip()[-300:]}"
    return None


def sandbox_available() -> bool:
    """Whether :func:`run_python` can isolate here (cached)."""
    return sandbox_unavailable_reason() is None


def run_python(source: str, *, stdin: str = "", timeout_s: float | None = None, memory_mb: int | None = None,
               max_output_bytes: int | None = None, allow_unsafe: bool | None = None,
               limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``source`` as ``__main__`` in the sandbox (stdlib only: ``-I -S``); keyword arguments override ``limits``."""
    overrides = {k: v for k, v in {"timeout_s": timeout_s, "memory_mb": memory_mb, "max_output_bytes": max_output_bytes,
                                   "allow_unsafe": allow_unsafe}.items() if v is not None}
    limits = dataclasses.replace(limits or SandboxLimits(), **overrides)
    if sandbox_available():
        return _run(source, stdin.encode(), limits, isolated=True)
    if not limits.allow_unsafe:
        raise SandboxUnavailable(f"the code sandbox cannot isolate here ({sandbox_unavailable_reason()}); {FIX}")
    log.warning("allow_unsafe=True: running untrusted code WITHOUT a sandbox (no namespaces, no uid drop; rlimits "
                "only) because %s", sandbox_unavailable_reason())
    return _run(source, stdin.encode(), limits, isolated=False)
