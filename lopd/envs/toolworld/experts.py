"""Scripted and noisy experts for ToolWorld, and a helper that plays an episode.

The expert re-derives its plan from the history at every turn (what earlier tool results
showed, which calls succeeded), so it recovers from any earlier mistake it can recover from.
"""

from __future__ import annotations

import random
from typing import Sequence

from .families import REGISTRY
from .families.base import ID_RE, Done, Step, typo_id
from lopd.envs.episode import History
from lopd.envs.protocol import format_tool_call, load_observation, parse_action
from .tasks import Task

# How mistakes split: mechanical slips the tools reject (the expert recovers), premature
# final answers (e.g. a skipped confirmation), and the family's own misconceptions.
SLIP_SHARE, QUIT_SHARE = 0.15, 0.3


def observed(history: History) -> Done:
    """Successful ``(tool_call, result)`` pairs in a history."""
    done = []
    for action, observation in history:
        call, _ = parse_action(action)
        result = load_observation(observation)
        if call is not None and result is not None:
            done.append((call, result))
    return done


def render(step: Step) -> str:
    return step if isinstance(step, str) else format_tool_call(*step)


class ScriptedExpert:
    """Solves every task by following the family's plan from what it has observed."""

    def act(self, task: Task, history: History) -> str:
        return render(REGISTRY[task.family].next_step(task.goal, task.conventions, observed(history)))


class NoisyExpert:
    """The expert, except that each decision is a realistic mistake with probability ``error_rate``.

    Mistakes are slips (malformed JSON, a typo'd id; the tools reject them and the expert
    recovers), a premature final answer, or misconceptions: acting as if one of the app's
    conventions were the other option (wrong format, a skipped or needless check or commit). Deterministic in
    ``(seed, task_id, turn)``, so it does not depend on the order episodes are played in.
    """

    def __init__(self, error_rate: float, seed: int) -> None:
        self.error_rate = error_rate
        self.seed = seed

    def act(self, task: Task, history: History) -> str:
        family = REGISTRY[task.family]
        done = observed(history)
        step = family.next_step(task.goal, task.conventions, done)
        rng = random.Random(f"{self.seed}/{task.task_id}/{len(history)}")
        if rng.random() >= self.error_rate:
            return render(step)
        options = family.mistakes(task.goal, task.conventions, done, step, rng)
        if isinstance(step, str):
            return rng.choice(options) if options else step
        kind = rng.random()
        if kind < SLIP_SHARE:
            return self._slip(step, rng)
        if kind < SLIP_SHARE + QUIT_SHARE or not options:
            return "Done."
        return rng.choice(options)

    @staticmethod
    def _slip(step: tuple[str, dict], rng: random.Random) -> str:
        """A mechanical slip the tools reject: malformed JSON or a typo'd id."""
        name, args = step
        ids = [k for k, v in args.items() if isinstance(v, str) and ID_RE.match(v)]
        if ids and rng.random() < 0.5:
            return format_tool_call(name, {**args, ids[0]: typo_id(args[ids[0]], rng)})
        return render(step)[: -len("}</tool_call>")] + "</tool_call>"


def convention_start(task: Task, actions: Sequence[str], observations: Sequence[str | None], i: int) -> int | None:
    """Character offset in ``actions[i]`` from which a flipped convention would change it (None: it would not,
    or the action is not the plan's): where the convention tokens start (``lopd.policy.token_kinds``)."""
    fam = REGISTRY[task.family]
    done = observed(list(zip(actions[:i], observations[:i])))
    plan = render(fam.next_step(task.goal, task.conventions, done))
    if actions[i].strip() != plan:
        return None
    starts = []
    for key, (a, b) in fam.options.items():
        flipped = {**task.conventions, key: b if task.conventions[key] == a else a}
        other = render(fam.next_step(task.goal, flipped, done))
        if other != plan:
            starts.append(next((k for k, (x, y) in enumerate(zip(plan, other)) if x != y), min(len(plan), len(other))))
    return min(starts) if starts else None


# The decisions an app's hidden conventions set, by the name a report gives them (prereq = whether to check first).
DECISION_KINDS = {"format": "format", "prereq": "check", "commit": "commit"}


def decision_alternatives(task: Task, actions: Sequence[str], observations: Sequence[str | None], i: int) -> dict[str, tuple[str, str]]:
    """At turn ``i`` (after the first ``i`` actions and observations), every decision a convention sets there:
    ``{kind: (right, wrong)}``, the plan's next action under the app's conventions and under that one convention
    flipped, for each convention whose flip changes it (``format``, ``check``, ``commit``; none at a lookup).
    ``actions[i]`` itself is not read: the same pair serves an expert's turn and a student's."""
    fam = REGISTRY[task.family]
    done = observed(list(zip(actions[:i], observations[:i])))
    plan = render(fam.next_step(task.goal, task.conventions, done))
    out = {}
    for key, (a, b) in fam.options.items():
        other = render(fam.next_step(task.goal, {**task.conventions, key: b if task.conventions[key] == a else a}, done))
        if other != plan:
            out[DECISION_KINDS[key]] = (plan, other)
    return out
