"""ToolWorld: a family of small multi-turn tool-calling environments (banking, calendar, shop, smart home)."""

from .env import StepResult, ToolWorldEnv, format_tool_call, parse_action
from .experts import NoisyExpert, ScriptedExpert, run_episode
from .tasks import FAMILIES, Task, make_tasks

__all__ = ["FAMILIES", "NoisyExpert", "ScriptedExpert", "StepResult", "Task", "ToolWorldEnv",
           "format_tool_call", "make_tasks", "parse_action", "run_episode"]
