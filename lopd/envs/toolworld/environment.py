"""ToolWorld as a registered environment (``env.name = toolworld``, the default).

Its own params live under ``toolworld:`` (families, world seed, pre-training apps); reports group
tasks by whether the embedded base was pre-trained on their app (``pretrain``) or not (``new``).
"""

from __future__ import annotations

from lopd.envs.registry import Environment, Pretraining

from .apps import NEW, PRETRAIN, app_group, entity_words, world_fingerprint
from .chance import chance_row
from .env import ToolWorldEnv
from .experts import ScriptedExpert, convention_start, decision_alternatives
from .lite import lite_text
from .pretraining import demonstrations, unseen_apps_as_unknown
from .tasks import make_tasks

GROUPS = {PRETRAIN: "pre-training apps", NEW: "new apps"}


def make(p) -> Environment:
    e, tw = p.env, p.toolworld

    def tasks(split: str, n: int) -> list:
        return make_tasks(split, n, seed=e.task_seed, families=tw.families, world_seed=tw.world_seed, pretrain_apps=tw.pretrain_apps)

    return Environment(
        name="toolworld",
        tasks=tasks,
        make_env=lambda task: ToolWorldEnv(task, max_turns=e.max_turns, success_threshold=e.success_threshold),
        lite_text=lite_text,
        success_threshold=e.success_threshold,
        groups=GROUPS,
        group=lambda task: app_group(task.family, task.app, tw.pretrain_apps),
        expert=ScriptedExpert,
        pretraining=Pretraining(demos=demonstrations, words=entity_words, finish=unseen_apps_as_unknown),
        chance=lambda tasks, groups: chance_row(tasks, groups, e.max_turns, e.success_threshold),
        convention_start=convention_start,
        fingerprint=world_fingerprint(tw.world_seed, tw.pretrain_apps),
        decisions=decision_alternatives,
    )
