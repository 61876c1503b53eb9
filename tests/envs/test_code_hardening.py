"""The five ways the code environment failed a reinforcement-learning pipeline, each reproduced.

Each test drives the real sandbox the way a policy would (through ``CodeEnv.step`` or
``run_python``) and fails without the hardening:

1. a return value the parent cannot judge (an int above float range on a tolerance check);
2. success without solving, by harvesting expected values from the feedback over turns;
3. state that outlives a run (the per-uid kernel keyring), and ``io_uring``;
4. memory beyond one budget per run (forked hogs, memfds);
5. two processes grading under one uid at once.

Skipped as a whole where namespaces are refused.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from lopd.envs.code import CodeEnv, SandboxLimits, grade, hostile, load_tasks, run_python, sandbox_available, \
    sandbox_unavailable_reason
from lopd.envs.code import grading

pytestmark = pytest.mark.skipif(not sandbox_available(),
                                reason=f"code sandbox unavailable here: {sandbox_unavailable_reason()}")


@pytest.fixture(scope="module")
def tasks():
    return {t.task_id: t for t in load_tasks()}


# --- 1. a verdict for every value ------------------------------------------------------------------

def test_a_return_value_beyond_float_range_gets_a_verdict(tasks):
    """HumanEval/2 is checked with ``abs(candidate(x) - y) < 1e-6``: an int above ~1.8e308 made the
    parent's comparison raise OverflowError, which ended the whole rollout batch."""
    env = CodeEnv(tasks["HumanEval/2"], max_turns=1)
    step = env.step(hostile.block(hostile.source("huge_int_return", "HumanEval/2")))
    assert step.reward == 0.0 and step.done and step.info["success"] is False


def test_an_exception_in_the_verdict_fails_the_episode_not_the_batch(tasks, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("grader bug")

    monkeypatch.setattr(grading, "judge_cases", broken)
    env = CodeEnv(tasks["HumanEval/0"], max_turns=2)
    with caplog.at_level(logging.ERROR):
        step = env.step(hostile.block(tasks["HumanEval/0"].canonical_solution))
    assert step.reward == 0.0 and not step.done
    assert "grader bug" in step.info["error"] and any("grader bug" in r.getMessage() for r in caplog.records)


# --- 2. no success without solving ----------------------------------------------------------------

@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/2", "HumanEval/44"])
def test_harvesting_the_feedback_over_turns_never_succeeds(tasks, task_id):
    """The attacker answers each call from a table of every expected value the feedback showed
    so far (matched by the call's label, in call order): it reached success on all three within
    8 turns when the feedback showed any failing test's expected value."""
    play = hostile.harvest_feedback(tasks[task_id], max_turns=8)
    assert not play["success"], play["feedback"]
    assert play["reward"] < 1.0


# --- 3. nothing persists across runs --------------------------------------------------------------

KEYS = textwrap.dedent("""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    NR = {"x86_64": {"add_key": 248, "request_key": 249, "io_uring_setup": 425},
          "aarch64": {"add_key": 217, "request_key": 218, "io_uring_setup": 425}}[os.uname().machine]
    def call(name, *args):
        r = libc.syscall(NR[name], *args)
        return r if r >= 0 else -ctypes.get_errno()
    if sys.argv[0] == "<sandbox>" and "WRITE":
        print(call("add_key", b"user", b"lopd-DESC", b"secret", 6, -4))  # KEY_SPEC_USER_KEYRING
    print(call("request_key", b"user", b"lopd-DESC", None, 0))
    params = (ctypes.c_uint32 * 30)()
    print(call("io_uring_setup", 4, ctypes.byref(params)))
""")


def test_a_key_written_by_one_run_is_not_readable_by_the_next():
    import errno
    import uuid
    desc = uuid.uuid4().hex[:12]
    write = run_python(KEYS.replace("DESC", desc), timeout_s=5.0)
    read = run_python(KEYS.replace("DESC", desc).replace('and "WRITE"', "and False"), timeout_s=5.0)
    added, found_then, uring = map(int, write.stdout.split())
    found_later, uring_later = map(int, read.stdout.split())
    assert added == -errno.EPERM and found_then == -errno.EPERM, write.stdout  # the keyring is denied
    assert found_later < 0, "a key written by an earlier run was read by a later one"
    assert uring == uring_later == -errno.EPERM


MESSAGES = textwrap.dedent("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    KEY, IPC_CREAT = 0x10BD0, 0o1000
    if WRITE:
        open("/tmp/left-behind", "w").write("secret")
        q = libc.msgget(KEY, IPC_CREAT | 0o666)
        msg = ctypes.create_string_buffer(b"\\x01\\0\\0\\0\\0\\0\\0\\0secret")
        print(q >= 0 and libc.msgsnd(q, msg, 6, 0) == 0)
    else:
        print(os.path.exists("/tmp/left-behind"), libc.msgget(KEY, 0) >= 0)
""")


def test_a_file_or_message_written_by_one_run_is_not_readable_by_the_next():
    assert run_python(MESSAGES.replace("WRITE", "True")).stdout.split() == ["True"]  # both were written
    assert run_python(MESSAGES.replace("WRITE", "False")).stdout.split() == ["False", "False"]


def test_the_filter_denies_what_namespaces_do_not_isolate_and_threads_still_run():
    program = textwrap.dedent("""
        import ctypes, errno, os, threading
        libc = ctypes.CDLL(None, use_errno=True)
        def errno_of(fn):
            ok = fn() >= 0
            return 0 if ok else ctypes.get_errno()
        NR = {"x86_64": {"bpf": 321, "userfaultfd": 323, "perf_event_open": 298, "keyctl": 250, "clone3": 435},
              "aarch64": {"bpf": 280, "userfaultfd": 282, "perf_event_open": 241, "keyctl": 219, "clone3": 435}}
        nr = NR[os.uname().machine]
        out = {
            "unshare(NEWUSER)": errno_of(lambda: libc.unshare(0x10000000)),
            "unshare(NEWNS)": errno_of(lambda: libc.unshare(0x20000)),
            "mount": errno_of(lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
            "ptrace(ATTACH, 1)": errno_of(lambda: libc.ptrace(16, 1, None, None)),
            "bpf": errno_of(lambda: libc.syscall(nr["bpf"], 0, None, 0)),
            "userfaultfd": errno_of(lambda: libc.syscall(nr["userfaultfd"], 0)),
            "perf_event_open": errno_of(lambda: libc.syscall(nr["perf_event_open"], None, 0, -1, -1, 0)),
            "keyctl": errno_of(lambda: libc.syscall(nr["keyctl"], 0, -4, 0)),
            "clone3": errno_of(lambda: libc.syscall(nr["clone3"], None, 0)),
        }
        done = []
        t = threading.Thread(target=lambda: done.append(1))
        t.start(); t.join()
        out["thread"] = len(done)
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        print(out)
    """)
    import errno
    out = eval(run_python(program).stdout)  # noqa: S307 - our own program's dict
    assert out.pop("clone3") == errno.ENOSYS  # glibc then falls back to clone, whose namespace flags are filtered
    assert out.pop("thread") == 1 and out.pop("fork") == 7
    assert out == dict.fromkeys(out, errno.EPERM), out


# --- 4. one memory budget per run -----------------------------------------------------------------

SLACK_MB = 384  # what else on the host may allocate while a case runs, plus the sampling's lag


@pytest.mark.parametrize("case", ["forked_memory_hogs", "memfd_hog"])
def test_a_run_cannot_take_more_memory_than_its_budget(tasks, case):
    """4 forked processes × 400 MB, each under its own address-space limit; 2 processes × 56 memfds × 16 MB,
    which no process limit counts: without a budget per run the host lost 1.6 GB and 1.8 GB."""
    limits = SandboxLimits(timeout_s=8.0)
    drop, verdict = hostile.peak_drop_mb(lambda: grade(tasks[hostile.TARGET].tests, hostile.source(case), limits))
    assert verdict.reward == 0.0
    assert drop <= getattr(limits, "run_memory_mb", 512) + SLACK_MB, f"host memory fell by {drop:.0f} MB"
    assert getattr(verdict, "memory_exceeded", False) and verdict.wall_s < 4.0  # killed as a whole, at once


@pytest.mark.parametrize("case", ["forked_memory_hogs", "memfd_hog"])
def test_without_a_cgroup_the_watchdog_bounds_the_run_and_says_so(tasks, case, caplog):
    from lopd.envs.code import cgroup
    cgroup.warn_watchdog.cache_clear()
    limits = SandboxLimits(timeout_s=8.0, cgroup=False)
    with caplog.at_level(logging.WARNING):
        drop, verdict = hostile.peak_drop_mb(lambda: grade(tasks[hostile.TARGET].tests, hostile.source(case), limits))
    assert verdict.reward == 0.0 and drop <= limits.run_memory_mb + SLACK_MB, f"host memory fell by {drop:.0f} MB"
    if case == "memfd_hog":  # pages no process maps would escape the watchdog's sum: memfds are denied instead
        denied = run_python("import os\ntry:\n    os.memfd_create('x')\nexcept PermissionError:\n    print('denied')\n",
                            limits=limits)
        assert denied.stdout.strip() == "denied"
    else:
        assert verdict.memory_exceeded
    assert any("NO cgroup" in r.getMessage() and "watchdog" in r.getMessage() for r in caplog.records)


# --- 5. a uid per concurrent run, across processes ------------------------------------------------

UID_PROGRAM = "import os, time\nprint(os.getuid(), flush=True)\ntime.sleep({})\n"


def test_two_processes_never_grade_under_one_uid():
    """Data-parallel ranks grade at once: each process's runs must hold uids no other process holds."""
    mine: list[str] = []
    t = threading.Thread(target=lambda: mine.append(run_python(UID_PROGRAM.format(6.0), timeout_s=10.0).stdout))
    t.start()  # this process's run holds its uid for 6 s; the other process's 2 s run falls inside it
    other = subprocess.run([sys.executable, "-c", "from lopd.envs.code import run_python\n"
                            f"print(run_python({UID_PROGRAM.format(2.0)!r}, timeout_s=10.0).stdout.strip())"],
                           capture_output=True, text=True, timeout=60)
    t.join()
    theirs = other.stdout.strip()
    assert mine and theirs and mine[0].strip() != theirs, (mine, theirs, other.stderr[-500:])


HOLD_14 = textwrap.dedent("""
    import os, time
    for _ in range(13):
        if os.fork() == 0:
            time.sleep(6)
            os._exit(0)
    time.sleep(6)
""")
THREADS = textwrap.dedent("""
    import threading
    done = []
    threads = [threading.Thread(target=done.append, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(len(done))
""")


def run_of_14(limits, deadline_s: float = 20.0) -> tuple[int, list[int]]:
    """The pool uid whose run holds HOLD_14's 14 processes, once there is one, and those pids (other test
    processes' runs, going on at the same time, hold other uids)."""
    from lopd.envs.code.uids import processes_of
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for uid in range(limits.uid_base, limits.uid_base + limits.uid_slots):
            if len(pids := processes_of(uid)) >= 14:
                return uid, pids
        time.sleep(0.02)
    raise AssertionError("the other process's run did not start")


def test_a_threaded_run_is_not_starved_by_another_process_s_runs():
    """Another process's run holds 14 processes of the pool: this process's threaded run must still
    start its 8 threads (it scored 0, "can't start new thread", when both shared one uid)."""
    limits = SandboxLimits()
    other = subprocess.Popen([sys.executable, "-c", "from lopd.envs.code import run_python\n"
                              f"run_python({HOLD_14!r}, timeout_s=8.0)"])
    try:
        run_of_14(limits)
        result = run_python(THREADS, timeout_s=2.0)
        assert result.stdout.strip() == "8", result.stderr[-300:]
        assert result.wall_s < 2.0
    finally:
        other.kill()
        other.wait()


def test_no_run_outlives_its_grader():
    """A trainer killed mid-grade: its run's processes die with it (nothing else would enforce the run's
    timeout), and the next process to start removes the dead run's cgroup."""
    from lopd.envs.code import cgroup
    from lopd.envs.code.uids import processes_of
    limits = SandboxLimits()
    grader = subprocess.Popen([sys.executable, "-c", "from lopd.envs.code import run_python\n"
                               f"run_python({HOLD_14!r}, timeout_s=60.0)"])
    uid, run_pids = run_of_14(limits)
    grader.kill()
    grader.wait()
    deadline = time.monotonic() + 5
    while set(run_pids) & set(processes_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not set(run_pids) & set(processes_of(uid))
    if cgroup.cgroup_unavailable_reason() is None:
        parents = cgroup._layout().parents.values()
        cgroup._layout.cache_clear()
        cgroup._layout()  # what a new process does first
        assert not [d for p in parents for d in p.glob(f"run-{grader.pid}-*")]
