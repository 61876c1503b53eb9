"""The sandbox's unprivileged uids: one per concurrent run, across every process on the host.

Each uid of the pool ``base .. base + slots - 1`` is held while an exclusive ``flock`` on
``lopd-sandbox-uid-<uid>.lock`` is. A lock belongs to an open file, so two threads of one process
exclude each other as two processes do (data-parallel ranks, two pipelines), and the kernel drops
it when its holder dies, so a crashed trainer frees its uids. Before, each process counted its own
pool from ``base``: two processes graded as one uid at once, one run's processes counted against
the other's process limit (a correct threaded solution scored 0), and a run's cleanup waited for
the other's processes (a 1 s timeout took 6 s).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

__all__ = ["UIDS", "UidPool", "processes_of", "stray_processes"]

UID_WAIT_S = 60.0  # how long a run waits for a free uid when every uid of the pool is held
LOCK_DIRS = ("/run/lock", tempfile.gettempdir())  # where the uid locks live: host-wide, the first writable


def processes_of(uids: int | Iterable[int]) -> list[int]:
    """Host pids whose real, effective, saved or fs uid is one of ``uids`` (zombies included)."""
    wanted = {str(uids)} if isinstance(uids, int) else {str(u) for u in uids}
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as f:
                    ids = next((line.split()[1:] for line in f if line.startswith("Uid:")), [])
            except OSError:
                continue
            if wanted.intersection(ids):
                pids.append(int(name))
    return pids


class UidPool:
    """Unprivileged uids no other run on this host holds: uid ``u`` is held while an exclusive ``flock``
    on ``lopd-sandbox-uid-<u>.lock`` is (per open file, so threads of one process exclude each other
    too; the kernel drops it when its holder dies, so a crash frees its uids)."""

    @functools.cached_property
    def lock_dir(self) -> Path:
        for d in LOCK_DIRS:
            if os.access(d, os.W_OK):
                return Path(d)
        raise RuntimeError(f"no writable directory for the sandbox's uid locks among {LOCK_DIRS}")

    def _open(self, uid: int) -> int:
        return os.open(self.lock_dir / f"lopd-sandbox-uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    @contextmanager
    def take(self, base: int, slots: int) -> Iterator[int]:
        """Hold the first free uid of the pool for the ``with`` block (waits while every one is held)."""
        deadline = time.monotonic() + UID_WAIT_S
        while True:
            for uid in range(base, base + slots):
                fd = self._open(uid)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    os.close(fd)
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    continue
                try:
                    yield uid
                finally:
                    os.close(fd)  # releases the lock
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"every sandbox uid {base}..{base + slots - 1} stayed held for {UID_WAIT_S:.0f} s")
            time.sleep(0.01)

    def strays(self, base: int, slots: int) -> list[int]:
        """Host pids of pool uids that no run holds: what a finished run left behind (should be none)."""
        strays = []
        for uid in range(base, base + slots):
            fd = self._open(uid)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live run holds it: its processes are its own
            else:
                strays += processes_of(uid)  # checked while holding the lock: no run can start on it meanwhile
            finally:
                os.close(fd)
        return strays


UIDS = UidPool()


def stray_processes(limits) -> list[int]:
    """Processes of the uid pool of ``limits`` (a :class:`~.sandbox.SandboxLimits`) that no running sandbox
    owns: what finished runs left behind (runs going on elsewhere, in any process, are not strays)."""
    return UIDS.strays(limits.uid_base, limits.uid_slots)
