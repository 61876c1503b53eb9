"""What one step of any environment's episode returns, and the loop that plays an agent to the end.

Shared by every environment (ToolWorld, code, BFCL, a user's own): ``make_env(task).step(action)``
returns a :class:`StepResult`; :func:`run_episode` plays a scripted agent (``act(task, history)``)
through one episode and returns what the bank, the collectors and the tests read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

History = list[tuple[str, str | None]]  # (action, observation) per turn


@dataclass
class StepResult:
    """What one assistant action produced."""

    observation: str | None
    reward: float
    done: bool
    info: dict  # ``short``: the result in a few words (observation-lite); on the last step ``success``


class Agent(Protocol):
    def act(self, task: Any, history: History) -> str: ...


def run_episode(env, agent: Agent, task: Any = None) -> dict:
    """Play ``agent`` in ``env`` (a fresh episode of ``task``, default ``env.task``) until it is done."""
    task = env.task if task is None else task
    history: History = []
    shorts: list[str] = []
    while True:
        action = agent.act(task, history)
        result = env.step(action)
        history.append((action, result.observation))
        shorts.append(result.info.get("short", ""))
        if result.done:
            break
    return {"actions": [a for a, _ in history], "observations": [o for _, o in history], "shorts": shorts,
            "reward": result.reward, "success": bool(result.info.get("success", False)), "n_turns": len(history)}
