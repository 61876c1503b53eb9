"""ToolWorld's observation-lite text (spec step 1): the task plus each action with its short result.

The bank stores it, retrieval embeds it, the composer reads it, and the bootstrap shows it to
the base in the teacher's framing sentence (the environment's ``lite_text``).
"""

from __future__ import annotations

from lopd.envs.protocol import parse_action


def lite_step(action: str, short: str) -> str:
    """One observation-lite line: the action as the agent wrote it and its short result
    (``<tool_call>{...}</tool_call> -> ok pm_37``), or ``answer: text``.

    The call keeps its exact text so that a model reading an experience sees the same tokens
    it would write (a format convention is then a plain copy); only the observation is cut.
    """
    call, err = parse_action(action)
    if call is None and err is None:
        return f"answer: {action.strip()}"
    return f"{action.strip()} -> {short}"


def lite_text(task_text: str, actions: list[str], shorts: list[str]) -> str:
    return "\n".join([f"Task: {task_text}", *(lite_step(a, s) for a, s in zip(actions, shorts))])
