"""Observation-lite text (spec step 1): the task plus each action with its short result.

The bank stores it, retrieval embeds it, the composer reads it, and the bootstrap shows it to
the base in the teacher's framing sentence.
"""

from __future__ import annotations

import json

from lopd.envs.toolworld import parse_action


def lite_step(action: str, short: str) -> str:
    """One observation-lite line: ``name {"arg": ...} -> short result`` or ``answer: text``."""
    call, err = parse_action(action)
    if call is not None:
        return f"{call['name']} {json.dumps(call['arguments'], separators=(',', ':'))} -> {short}"
    if err is not None:
        return f"invalid call -> {short}"
    return f"answer: {action.strip()}"


def lite_text(task_text: str, actions: list[str], shorts: list[str]) -> str:
    return "\n".join([f"Task: {task_text}", *(lite_step(a, s) for a, s in zip(actions, shorts))])
