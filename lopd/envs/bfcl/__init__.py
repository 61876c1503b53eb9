"""BFCL v4 multi-turn as an environment: the benchmark's tasks, function docs and executable backends,
played through the same ``initial_observation()`` / ``step()`` interface as ToolWorld.

The data and backend classes come from the installed ``bfcl-eval`` package (never copied here). Model
output is never passed to ``eval``/``exec``: :mod:`lopd.envs.bfcl.sandbox` parses each call (JSON, or
``ast`` for BFCL's python-style ground truth) and dispatches only listed methods with literal arguments.
"""

from lopd.envs.bfcl.data import CATEGORIES, BFCLTask, load_tasks
from lopd.envs.bfcl.env import BFCLEnv

__all__ = ["CATEGORIES", "BFCLTask", "BFCLEnv", "load_tasks"]
