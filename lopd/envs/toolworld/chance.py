"""Policies that learn nothing: the chance row beside every success figure.

A success figure means something only beside what an agent gets without learning anything
about the apps. Each policy here sees what a student sees (the task text, the tool signatures,
its own history) and follows the family's plan under a *fixed guess* of the app's conventions:

* ``every_tool_once``: look up, check, act (the value as the task states it), commit, answer;
  a call that fails is not retried;
* ``ifcheck_<format>_<commit>_else_<format>_<commit>``: the 16 *check-conditioned rules*. Each
  reads the one convention the tools do reveal (a "check first" error means a check is
  required, a "not available here" error that it is not) and sets the two silent conventions
  from that one bit by a fixed rule: the format (``literal``: as the task states it, or the
  ``other`` option) and whether to commit, one choice when a check is required and one when it
  is not. Four of them make the same choice either way.

Under the conditional balance (``apps.py``), for each check setting every (format, commit) pair
is held by the same number of apps of a group, so each rule is right at one app in four of each
group, and the tasks take the apps in turn: each scores about a quarter everywhere (the mean
reward of such a policy is about 0.75: reward alone says little). The best of them, figure by
figure, is the chance row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

from .apps import NEW, PRETRAIN
from .env import ToolWorldEnv
from lopd.envs.episode import History, run_episode
from .experts import observed, render
from .families import REGISTRY
from lopd.envs.protocol import parse_action
from .tasks import Task


def tool_error(observation: str | None) -> str:
    """The error message of a failed call's observation ('' for anything else)."""
    try:
        obj = json.loads(observation or "")
    except json.JSONDecodeError:
        return ""
    return str(obj.get("error", "")) if isinstance(obj, dict) else ""


@dataclass(frozen=True)
class BlindPolicy:
    """The family's plan under guessed conventions; ``adapt_prereq`` reads the check's errors.

    ``format`` / ``commit`` are the guesses while no check is believed required; once one is,
    ``format_if_check`` / ``commit_if_check`` (the same guesses when None).
    """

    format: str  # "literal" or "other"
    commit: str  # "required" or "auto"
    prereq: str = "none"  # the first guess, or the only one without adapt_prereq
    adapt_prereq: bool = True
    once: bool = False  # every planned tool once: a failed call is not retried
    format_if_check: str | None = None
    commit_if_check: str | None = None

    def believed(self, task: Task, history: History) -> dict[str, str]:
        fam = REGISTRY[task.family]
        guess = {"prereq": self.prereq}
        tried = set()
        for action, observation in history:
            call, _ = parse_action(action)
            tried.add(call["name"] if call else None)
            error = tool_error(observation)
            if self.adapt_prereq and fam.prereq_error in error:
                guess["prereq"] = "required"
            elif self.adapt_prereq and "not available here" in error:
                guess["prereq"] = "none"
        check = guess["prereq"] == "required"
        fmt = (self.format_if_check or self.format) if check else self.format
        guess["format"] = fam.literal_format if fmt == "literal" else next(f for f in fam.formats if f != fam.literal_format)
        guess["commit"] = (self.commit_if_check or self.commit) if check else self.commit
        if self.once:  # a step once tried is done with, whatever the tool answered
            guess["prereq"] = "none" if fam.role("prereq").name in tried else guess["prereq"]
            guess["commit"] = "auto" if fam.role("commit").name in tried else guess["commit"]
        return guess

    def act(self, task: Task, history: History) -> str:
        return render(REGISTRY[task.family].next_step(task.goal, self.believed(task, history), observed(history)))


def chance_policies() -> dict[str, BlindPolicy]:
    """The fixed set of non-learning policies, by name."""
    out = {"every_tool_once": BlindPolicy("literal", "required", prereq="required", adapt_prereq=False, once=True)}
    pairs = [(fmt, commit, word) for fmt in ("literal", "other") for commit, word in (("required", "commit"), ("auto", "nocommit"))]
    for fmt_c, commit_c, word_c in pairs:  # the choice when a check is required
        for fmt, commit, word in pairs:  # ... and when it is not
            out[f"ifcheck_{fmt_c}_{word_c}_else_{fmt}_{word}"] = BlindPolicy(fmt, commit, format_if_check=fmt_c, commit_if_check=commit_c)
    return out


def play_blind(tasks: list[Task], max_turns: int, success_threshold: float) -> dict[str, list[dict]]:
    """Every chance policy's episode on each task: ``{policy: [run_episode's record per task]}``.
    Policies and backends are deterministic, so one episode per task stands for every sample of it."""
    return {name: [run_episode(ToolWorldEnv(task, max_turns, success_threshold), policy) for task in tasks]
            for name, policy in chance_policies().items()}


def chance_row(tasks: Sequence[Task], groups: Mapping[str, str], max_turns: int, success_threshold: float) -> dict:
    """The chance row on ``tasks``: each policy's success (overall, and per app group as ``groups``
    maps task ids) and mean reward, and for every figure the best of them (``best`` names which)."""
    tasks = list(tasks)
    names = (PRETRAIN, NEW)
    policies = {}
    for name, episodes in play_blind(tasks, max_turns, success_threshold).items():
        wins = [bool(ep["success"]) for ep in episodes]
        by_group = {g: [w for w, t in zip(wins, tasks) if groups[t.task_id] == g] for g in names}
        policies[name] = {"success_rate": sum(wins) / max(1, len(wins)),
                          "success_by_group": {g: (sum(v) / len(v) if v else None) for g, v in by_group.items()},
                          "mean_reward": sum(ep["reward"] for ep in episodes) / max(1, len(episodes))}

    def best(get) -> str:
        return max(policies, key=lambda n: get(policies[n]))

    top = {"success_rate": best(lambda r: r["success_rate"]), "mean_reward": best(lambda r: r["mean_reward"]),
           **{f"success_by_group.{g}": best(lambda r, g=g: r["success_by_group"][g] or 0.0) for g in names}}
    return {"success_rate": policies[top["success_rate"]]["success_rate"],
            "success_by_group": {g: policies[top[f"success_by_group.{g}"]]["success_by_group"][g] for g in names},
            "mean_reward": policies[top["mean_reward"]]["mean_reward"],
            "n_tasks": len(tasks), "best": top, "policies": policies}
