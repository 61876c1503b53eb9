"""The ToolWorld environment: one multi-turn tool-calling episode over a family's backend."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from .families import REGISTRY
from .families.base import ID_RE, ToolError
from .protocol import dump, error_observation, format_tool_call, parse_action
from .tasks import Task

__all__ = ["StepResult", "ToolWorldEnv", "format_tool_call", "parse_action"]

SHORT_MAX = 60


@dataclass
class StepResult:
    """What one assistant action produced."""

    observation: str | None
    reward: float
    done: bool
    info: dict


def _clip(text: str) -> str:
    return text if len(text) <= SHORT_MAX else text[: SHORT_MAX - 3] + "..."


def _ids_in(obj: object) -> list[str]:
    """Id-like strings in a tool result, in order."""
    if isinstance(obj, str):
        return [obj] if ID_RE.match(obj) else []
    if isinstance(obj, dict):
        return [i for v in obj.values() for i in _ids_in(v)]
    if isinstance(obj, list):
        return [i for v in obj for i in _ids_in(v)]
    return []


def _short_ok(name: str, result: dict) -> str:
    """``ok find_account acc_482,acc_123`` or ``ok get_balance acc_482 balance_cents=1250``."""
    scalars = [f"{k}={v}" for k, v in result.items() if isinstance(v, (str, int, float)) and v not in _ids_in(v)]
    return _clip(" ".join(["ok", name, ",".join(_ids_in(result))] + scalars).replace("  ", " "))


class ToolWorldEnv:
    """A task's app backend behind the tool-call protocol; reward = checklist fraction at the end."""

    def __init__(self, task: Task, max_turns: int = 8, success_threshold: float = 0.8) -> None:
        self.task = task
        self.family = REGISTRY[task.family]
        self.backend = self.family.make_backend(task.goal, random.Random(task.seed))
        self.max_turns = max_turns
        self.success_threshold = success_threshold
        self.turns = 0
        self.done = False

    def system_prompt(self) -> str:
        tools = "\n".join(t.signature() for t in self.family.tools)
        return (f"You are a {self.family.name} assistant. Tools:\n{tools}\nRules: {self.family.rules}\n"
                'Call one tool per turn: <tool_call>{"name": ..., "arguments": {...}}</tool_call>. '
                "Reply in plain text when finished.")

    def initial_observation(self) -> list[dict]:
        return [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": self.task.text}]

    def _run_tool(self, call: dict) -> tuple[str, str | None, str]:
        """Execute a parsed call: ``(observation, error, short)``."""
        tool = self.family.tool(call["name"])
        error = f"unknown tool {call['name']}" if tool is None else tool.validate(call["arguments"])
        if error is None:
            try:
                result = self.backend.call(call["name"], call["arguments"])
            except ToolError as exc:
                error = str(exc)
            else:
                return dump(result), None, _short_ok(call["name"], result)
        return error_observation(error), error, _clip(f"error: {error}")

    def step(self, action: str) -> StepResult:
        """Play one assistant action; the episode ends on a final answer or at ``max_turns``."""
        if self.done:
            raise RuntimeError("episode is over")
        self.turns += 1
        call, error = parse_action(action)
        if call is None and error is None:
            self.backend.final_answer = action.strip()
            observation, short = None, _clip(f"final: {json.dumps(action.strip())[1:-1]}")
            self.done = True
        elif call is None:
            observation, short = error_observation(error), _clip(f"error: {error}")
        else:
            observation, error, short = self._run_tool(call)
        self.done = self.done or self.turns >= self.max_turns
        info: dict = {"tool_call": call, "error": error, "short": short}
        reward = 0.0
        if self.done:
            checks = self.family.checks(self.backend, self.task.goal)
            reward = sum(checks.values()) / len(checks)
            info.update(checks=checks, success=reward >= self.success_threshold)
        return StepResult(observation, reward, self.done, info)
