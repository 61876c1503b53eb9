"""The code environment: write a function, read the test results, repair it, for a few turns.

One episode is one HumanEval task. Each action is an assistant message; its last ```python
block is the attempt (a message without one is a failed turn, and the feedback says so). The
attempt runs in the sandbox on every test of the task (:func:`~.grading.grade`) and the
observation is the test feedback in the style LiveCodeBench's self-repair uses:
``3/7 passed; f([3, 1]) returned 4, expected 1`` (at most two failures, each cut short, and the
last exception line). The episode ends when every test passes or at ``max_turns``.

reward = the fraction of tests the step's attempt passed (0 for a turn without code); the
trainers read the final step's, so it is the last attempt's. ``info`` of every step has
``short`` (``5/7 passed``, for the observation-lite bank), ``checks`` (test name → passed) and
``code``; the final step adds ``success`` (all pass) and ``truncated`` (cut at the turn limit).

reward and ``short`` count the held-out tests only, and the feedback spells out only the
docstring examples' failures (:mod:`.checks`: a value the feedback shows can be copied back, so
it must not be one that success needs). An exception while grading fails that step with reward
0 and a logged reason; it never stops the rollout batch. Only :class:`~.sandbox.SandboxUnavailable`
(a machine that cannot isolate, a configuration error) propagates.
"""

from __future__ import annotations

import re

from lopd.envs.episode import StepResult

from .grading import grade, grader_error
from .sandbox import SandboxLimits, SandboxUnavailable
from .tasks import CodeTask

__all__ = ["NO_CODE", "SYSTEM_PROMPT", "CodeEnv", "StepResult", "bank_entry", "extract_code", "observation_lite"]

SYSTEM_PROMPT = ("You are an expert Python programmer. Answer with the complete function in one ```python block. "
                 "After each attempt you are shown the test results; fix the code until every test passes.")
NO_CODE = "no ```python block found: answer with the complete function in one ```python block"
CODE_RE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.S | re.I)


def extract_code(action: str) -> str | None:
    """The last ```python block of a message (```py and ```python3 count too), or None."""
    blocks = CODE_RE.findall(action)
    return blocks[-1] if blocks else None


class CodeEnv:
    """A HumanEval task behind a run-the-tests loop; reward = the last attempt's passed fraction."""

    def __init__(self, task: CodeTask, max_turns: int = 4, limits: SandboxLimits | None = None) -> None:
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"CodeEnv max_turns must be an int >= 1, got {max_turns!r}")
        self.task = task
        self.max_turns = max_turns
        self.limits = limits or SandboxLimits()
        self.turns = 0
        self.done = False

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def initial_observation(self) -> list[dict]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.task.text}]

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("episode is over")
        self.turns += 1
        code = extract_code(action)
        info: dict = {"code": code}
        if code is None:
            observation, reward, success = NO_CODE, 0.0, False
            info.update(short="no code block", checks={name: False for name in self.task.tests.names}, error=None,
                        timed_out=False)
        else:
            try:
                verdict = grade(self.task.tests, code, self.limits)
            except SandboxUnavailable:
                raise
            except Exception as exc:  # noqa: BLE001 - one attempt fails with reward 0, the batch goes on
                verdict = grader_error(self.task.tests, exc)
            observation, reward, success = verdict.feedback(), verdict.reward, verdict.success
            info.update(short=verdict.short(), checks=verdict.checks, error=verdict.last_error,
                        timed_out=verdict.timed_out)
        self.done = success or self.turns >= self.max_turns
        if self.done:
            info.update(success=success, truncated=not success)
        return StepResult(observation, reward, self.done, info)


def _lite_step(action: str, short: str) -> str:
    code = extract_code(action)
    return f"```python\n{code.strip()}\n``` -> {short}" if code is not None else f"(no code block) -> {short}"


def observation_lite(task_text: str, actions: list[str], shorts: list[str]) -> str:
    """A trajectory as the experience bank keeps it: the task, then each attempt's code and its short result."""
    return "\n".join([f"Task: {task_text}", *(_lite_step(a, s) for a, s in zip(actions, shorts))])


def bank_entry(traj: dict) -> str | None:
    """The bank's text for a played episode (:func:`~.experts.run_episode`), or None unless it succeeded.

    Only the final, passing attempt is kept: a bank entry is read as an example to copy, and a
    failed attempt in it would be copied too.
    """
    if not traj.get("success"):
        return None
    return observation_lite(traj["task_text"], traj["actions"][-1:], traj["shorts"][-1:])
