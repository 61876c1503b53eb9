"""ToolWorld: small multi-turn tool-calling apps (banking, calendar, shop, smart home), each with hidden conventions."""

from .apps import NEW, PRETRAIN, SYNTHETIC_APPS, app_group, entity_words, pretrain_apps, random_conventions
from .env import StepResult, ToolWorldEnv, format_tool_call, parse_action, system_prompt
from lopd.envs.episode import run_episode
from .experts import NoisyExpert, ScriptedExpert
from .tasks import FAMILIES, Task, make_tasks

__all__ = ["FAMILIES", "NEW", "PRETRAIN", "SYNTHETIC_APPS", "app_group", "entity_words", "pretrain_apps",
           "random_conventions", "system_prompt", "NoisyExpert", "ScriptedExpert", "StepResult", "Task", "ToolWorldEnv",
           "format_tool_call", "make_tasks", "parse_action", "run_episode"]
