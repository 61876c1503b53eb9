"""The sandboxed program's syscall filter: what namespaces and a uid do not isolate, denied.

Kernel keyrings are per uid, not per namespace, so a key one run adds is readable by the next run
under the same uid; ``io_uring``, ``bpf``, ``userfaultfd`` and ``perf_event_open`` are large
attack surfaces no HumanEval solution needs; ``ptrace`` and ``process_vm_*`` reach other
processes; new namespaces and mounts would undo the sandbox's own. Each returns ``EPERM``
(``clone3`` returns ``ENOSYS``: its flags sit in memory a filter cannot read, and glibc then falls
back to ``clone``, whose namespace flags are filtered). A program of another architecture's ABI
(32-bit syscalls from a 64-bit process) is killed by libseccomp's architecture check.

The filter is compiled once, in the parent, with libseccomp through ``pyseccomp`` (a pure-Python
ctypes binding of the system's ``libseccomp.so.2``, with the official bindings' API; the official
bindings are not on PyPI, and Debian's ``python3-seccomp`` serves only Debian's own interpreter,
not a virtual environment). The child receives the raw BPF program and installs it with one
``prctl`` after dropping its privileges: it runs ``python -I -S`` with site-packages hidden and
needs no library.
"""

from __future__ import annotations

import errno
import functools
import tempfile

__all__ = ["DENIED", "filter_bpf", "seccomp_unavailable_reason"]

DENIED = (
    "add_key", "request_key", "keyctl",  # the per-uid keyring: state that outlives the run
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "bpf", "userfaultfd", "perf_event_open",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "name_to_handle_at", "open_by_handle_at",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "syslog", "memfd_secret",
)
DENIED_WITHOUT_CGROUP = ("memfd_create", "shmget")  # memory no per-process counter sees (the watchdog's blind spot)
CLONE_NEW = {"CLONE_NEWTIME": 0x80, "CLONE_NEWNS": 0x20000, "CLONE_NEWCGROUP": 0x2000000, "CLONE_NEWUTS": 0x4000000,
             "CLONE_NEWIPC": 0x8000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
             "CLONE_NEWNET": 0x40000000}


@functools.lru_cache(maxsize=1)
def seccomp_unavailable_reason() -> str | None:
    """Why the filter cannot be built here, or None."""
    try:
        filter_bpf(False)
    except (ImportError, OSError, RuntimeError) as exc:
        return (f"cannot build the seccomp filter ({type(exc).__name__}: {exc}); install libseccomp "
                "(Debian: `apt-get install libseccomp2`) and the `pyseccomp` package")
    return None


@functools.lru_cache(maxsize=2)
def filter_bpf(deny_shared_memory: bool) -> bytes:
    """The filter as a raw BPF program (``struct sock_filter[]``) for ``prctl(PR_SET_SECCOMP)``.

    ``deny_shared_memory`` also denies memfds and SysV shared memory: where no cgroup counts a
    run's memory, the watchdog sums its processes' resident memory, which such pages escape.
    """
    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ALLOW)
    for name in DENIED + (DENIED_WITHOUT_CGROUP if deny_shared_memory else ()):
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        except (OSError, RuntimeError, ValueError):
            pass  # a syscall this architecture does not have
    for flag in CLONE_NEW.values():
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()
