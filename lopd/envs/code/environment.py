"""The code domain as a registered environment (``env.name = code``): HumanEval's train/dev/test split.

Episodes are :class:`~.env.CodeEnv`'s (``env.max_turns`` attempts with test feedback); the bank keeps
only a success's final, passing attempt (:func:`~.env.bank_entry`'s rule); the scripted expert is
:class:`~.experts.CanonicalExpert`. No report grouping, no chance row, no convention tokens; the
embedded base is pre-trained on the expert's episodes of train tasks (bootstrap's default). Every
step runs the sandbox, so building the environment fails at once, with the reason, without it.
"""

from __future__ import annotations

from lopd.envs.registry import Environment

from .env import CodeEnv, observation_lite
from .experts import CanonicalExpert
from .sandbox import sandbox_unavailable_reason
from .tasks import load_tasks


def final_attempt_lite(task_text: str, actions: list[str], shorts: list[str]) -> str:
    """Observation-lite of a code trajectory: the task and its last attempt only (a failed attempt
    in an experience would be copied too)."""
    return observation_lite(task_text, actions[-1:], shorts[-1:])


def make(p) -> Environment:
    reason = sandbox_unavailable_reason()
    if reason is not None:
        raise ValueError(f"env.name = code needs the code sandbox, which is unavailable here: {reason}")
    e = p.env
    return Environment(
        name="code",
        tasks=lambda split, n: load_tasks(split)[:n],
        make_env=lambda task: CodeEnv(task, max_turns=e.max_turns),
        lite_text=final_attempt_lite,
        success_threshold=e.success_threshold,
        expert=CanonicalExpert,
    )
