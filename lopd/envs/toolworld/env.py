"""The ToolWorld environment: one multi-turn tool-calling episode in one app of a family."""

from __future__ import annotations

import json
import random

from .families import REGISTRY
from .families.base import ToolError
from lopd.envs.episode import StepResult
from lopd.envs.protocol import dump, error_observation, format_tool_call, parse_action
from .tasks import Task

__all__ = ["StepResult", "ToolWorldEnv", "format_tool_call", "parse_action"]

SHORT_MAX = 60


def _clip(text: str) -> str:
    return text if len(text) <= SHORT_MAX else text[: SHORT_MAX - 3] + "..."


def _short_ok(result: dict) -> str:
    """A tool result in a few words for the observation-lite bank: ``ok py_37`` or ``ok pm_12 status=pending``."""
    parts = ["ok", str(result.get("id", ""))] + [f"{k}={json.dumps(v)[1:-1] if isinstance(v, str) else json.dumps(v)}"
                                                for k, v in result.items() if k != "id"]
    return _clip(" ".join(p for p in parts if p))


def system_prompt(family: str) -> str:
    """The tool signatures of a family, and nothing else: an app's conventions are never written down."""
    return "Tools: " + "; ".join(t.signature() for t in REGISTRY[family].tools)


class ToolWorldEnv:
    """A task's app backend behind the tool-call protocol; reward = checklist fraction at the end."""

    def __init__(self, task: Task, max_turns: int = 8, success_threshold: float = 0.8) -> None:
        if not task.conventions:
            raise ValueError(f"task {task.task_id} has no app conventions (build tasks with make_tasks)")
        self.task = task
        self.family = REGISTRY[task.family]
        self.backend = self.family.make_backend(task.goal, task.conventions, random.Random(task.seed))
        self.max_turns = max_turns
        self.success_threshold = success_threshold
        self.turns = 0
        self.done = False

    def system_prompt(self) -> str:
        return system_prompt(self.task.family)

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
                return dump(result), None, _short_ok(result)
        return error_observation(error), error, _clip(f"error: {error}")

    def step(self, action: str) -> StepResult:
        """Play one assistant action; the episode ends on a final answer or at ``max_turns``.

        The reward is the checklist fraction either way, but an episode cut at ``max_turns``
        before the agent gave its final answer is never a success: an agent that has not said it
        is done has not finished the task, whatever state the app happens to be in.
        """
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
            finished = self.backend.final_answer is not None
            info.update(checks=checks, truncated=not finished,
                        success=finished and reward >= self.success_threshold)
        return StepResult(observation, reward, self.done, info)
