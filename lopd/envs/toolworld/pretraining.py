"""ToolWorld's pre-training corpus for the embedded base (``Environment.pretraining``; bootstrap trains on it).

Noisy-expert episodes on train tasks of the pre-training apps. A share
``bootstrap.experience_frac`` of them carry 1..``bootstrap.experience_max`` experiences in
the teacher's framing sentence: other successful demos of the *same app* (so the app's
conventions can be read off them), or, for a share ``bootstrap.fresh_app_frac`` of those, a
whole example at a synthetic app whose conventions are drawn fresh for it
(:func:`fresh_app_demo`). Why both: the teacher is this base with experiences where that
sentence's placeholder stands (``lopd.latent.teacher``), so the base must be at home with the
framing and must *use* what experiences show; on a fresh app nothing else predicts the
conventions. A share ``bootstrap.unseen_app_frac`` of all demos is set at a synthetic app with
fresh conventions and *no* experiences: that is where a new app without experiences stands,
and the base should act there (guess what it cannot know, read the errors), not stall.
"""

from __future__ import annotations

import random

import torch

from .apps import SYNTHETIC_APPS, pretrain_apps, random_conventions
from .env import ToolWorldEnv
from lopd.envs.episode import run_episode
from .experts import NoisyExpert, ScriptedExpert
from .families import REGISTRY
from .lite import lite_text
from .tasks import FAMILIES, Task, make_tasks

Demo = tuple[list[dict], list[str], list[str]]  # (initial messages, actions, observations)


def demo_tasks(p) -> list:
    """Train tasks on the pre-training apps only (``toolworld.pretrain_apps`` per family)."""
    tw = p.toolworld
    families = tw.families or FAMILIES
    apps = {f: pretrain_apps(f, tw.pretrain_apps) for f in families}
    return make_tasks("train", p.bootstrap.n_demos, seed=p.env.task_seed, families=families, apps=apps,
                      world_seed=tw.world_seed, tag="demo", pretrain_apps=tw.pretrain_apps)


def play(p, task, agent) -> tuple[Demo, str | None]:
    """An agent's episode on ``task`` as a demo, and its observation-lite text when it succeeded."""
    env = ToolWorldEnv(task, p.env.max_turns, p.env.success_threshold)
    messages = env.initial_observation()
    ep = run_episode(env, agent)
    return (messages, ep["actions"], ep["observations"]), (lite_text(task.text, ep["actions"], ep["shorts"]) if ep["success"] else None)


def demonstrations(p, frame) -> tuple[list[Demo], list[Demo], dict]:
    """The pre-training demonstrations, the same demos without experiences, and what they hold
    (see the module docstring). ``frame(demo, lites)``: ``demo`` with ``lites`` in the framing sentence."""
    expert = NoisyExpert(p.bootstrap.demo_error_rate, seed=p.seed)
    tasks = demo_tasks(p)
    played = [play(p, task, expert) for task in tasks]
    rng = random.Random(p.seed)
    by_app: dict[str, list[int]] = {}
    for i, (task, (_, lite)) in enumerate(zip(tasks, played)):
        if lite is not None:
            by_app.setdefault(task.app, []).append(i)
    demos, kinds = [], {"plain": 0, "same_app": 0, "fresh_app": 0, "unseen_app": 0, "distractors": 0}
    pool = [j for ids in by_app.values() for j in ids]  # every successful demo: the distractors' source
    for task, (demo, _) in zip(tasks, played):
        if rng.random() < p.bootstrap.unseen_app_frac:
            demos.append(fresh_app_demo(p, task.family, 0, expert, rng)[0])
            kinds["unseen_app"] += 1
            continue
        if rng.random() >= p.bootstrap.experience_frac:
            demos.append(demo)
            kinds["plain"] += 1
            continue
        n_exp = rng.randint(1, p.bootstrap.experience_max)
        if rng.random() < p.bootstrap.fresh_app_frac:
            demo, lites = fresh_app_demo(p, task.family, n_exp, expert, rng)
            kinds["fresh_app"] += 1
        else:
            peers = [j for j in by_app.get(task.app, []) if played[j][0] is not demo]
            lites = [played[j][1] for j in rng.sample(peers, min(len(peers), n_exp))]
            kinds["same_app" if lites else "plain"] += 1
        # Distractors (why): retrieval is not perfect and a random bank entry is almost never from
        # the task's app. A base that copies conventions from any experience is misled by them
        # (measured: 3 random experiences cut dev success on the pre-training apps from 0.79 to
        # 0.41), so some slots hold another app's success, and the target still follows its own app.
        others = [j for j in pool if tasks[j].app != task.app]
        for k in range(len(lites)):
            if others and rng.random() < p.bootstrap.distractor_frac:
                lites[k] = played[rng.choice(others)][1]
                kinds["distractors"] += 1
        demos.append(frame(demo, lites))
    return demos, [demo for demo, _ in played], {"n_demos": len(demos), "demo_success_rate": sum(lite is not None for _, lite in played) / len(played),
                   **{f"demos_{k}": v for k, v in kinds.items()}}


def fresh_app_demo(p, family: str, n_exp: int, expert, rng: random.Random) -> tuple[Demo, list[str]]:
    """A noisy-expert demo at a synthetic app with freshly drawn conventions, and ``n_exp`` (maybe 0)
    successful episodes of other tasks at that same app (observation-lite) to show it with."""
    fam, app = REGISTRY[family], rng.choice(SYNTHETIC_APPS)
    conventions = random_conventions(family, rng)

    def task(k: int):
        text, goal = fam.sample_goal(rng, app)
        return Task(f"fresh-{app}-{rng.getrandbits(32):08x}-{k}", family, "train", text, rng.getrandbits(32), goal, conventions)

    lites = []
    for k in range(8 * n_exp):  # noisy successes, as a bank holds; the scripted expert if they run short
        if len(lites) == n_exp:
            break
        lite = play(p, task(k + 1), expert if k < 4 * n_exp else ScriptedExpert())[1]
        if lite is not None:
            lites.append(lite)
    return play(p, task(0), expert)[0], lites


@torch.no_grad()
def unseen_apps_as_unknown(model, tokenizer, examples) -> list[str]:
    """Give every app name the demos never contain (the new apps) the mean embedding of the
    synthetic apps'; returns those names.

    Why: a token pre-training never shows keeps its random initial embedding, and the base reads
    it as nothing in particular, not as "an app I do not know". The synthetic apps are exactly
    that (their conventions were drawn fresh every time), so their mean is what a new app should
    look like. This uses no knowledge of the new apps' conventions. (Hugging Face initialises
    added tokens at the mean embedding for the same reason.)
    """
    seen = {i for ids, _ in examples for i in ids}
    ids = lambda names: [tokenizer.convert_tokens_to_ids(n) for n in names]  # noqa: E731
    apps = [a for fam in REGISTRY.values() for a in fam.apps]
    unseen = [a for a, i in zip(apps, ids(apps)) if i not in seen]
    if unseen:
        emb = model.get_input_embeddings().weight
        emb[ids(unseen)] = emb[ids(SYNTHETIC_APPS)].mean(0)
    return unseen
