"""Scripted agents for BFCL: replay the ground truth (a correct agent) or a deliberately wrong variant."""

from __future__ import annotations

from lopd.envs.bfcl.data import BFCLTask
from lopd.envs.bfcl.env import BFCLEnv
from lopd.envs.bfcl.sandbox import parse_python_call
from lopd.envs.episode import StepResult
from lopd.envs.protocol import format_tool_call


def replay_actions(env: BFCLEnv, turn: int, drop_last: bool = False) -> list[str]:
    """Turn ``turn``'s ground-truth calls as one assistant message (a JSON ``<tool_call>`` per call), then a text answer.

    Positional arguments of BFCL's python-style ground truth are named from the method's signature, as a
    JSON tool call must pass them. ``drop_last`` leaves out the turn's last call.
    """
    calls = env.task.ground_truth[turn][:-1] if drop_last else env.task.ground_truth[turn]
    out = []
    for source in calls:
        name, args, kwargs = parse_python_call(source)
        out.append(format_tool_call(name, env.sandbox.keywords(name, args, kwargs)))
    return (["\n".join(out)] if out else []) + ["Done."]


def play(task: BFCLTask, drop_last: bool = False) -> StepResult:
    """One episode of the replay agent (``drop_last``: the wrong one); returns the final step."""
    env = BFCLEnv(task)
    result = None
    for turn in range(len(task.turns)):
        for action in replay_actions(env, turn, drop_last):
            result = env.step(action)
    return result
