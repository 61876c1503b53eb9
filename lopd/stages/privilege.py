"""Stage `privilege`: what experiences shown as *text* give the frozen base, before any latent is trained.

LOPD's teacher is the base with retrieved experiences in its prompt (as latents). If experiences
shown in plain text do not help the base, no composer will make latents that do. So, on dev
tasks, for the base with each teacher context:

- ``none``: the student's own prompt;
- ``framing``: the teacher's framing sentence with nothing in it;
- ``retrieved_text``: the ``retrieval.n_ret`` retrieved bank entries, observation-lite;
- ``random_text``: ``n_ret`` random bank entries;
- ``oracle_text``: ``n_ret`` scripted-expert successes on other train tasks of the same app;

this stage measures sampled success (``rollout.temperature``) overall and per app group, and
the NLL per action token of successful dev trajectories, split by token kind
(``lopd.policy.token_kinds``: copied, convention, other): ``nll`` on the scripted expert's (every
dev task, so every app, once), ``nll_own`` on the base's own successful ``none`` rollouts
(which it already finds likely: they were sampled from it and selected for success). Writes
``metrics/privilege.json`` as ``{"success": {context: rate}, "nll": {context: nats}, ...}``.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Sequence

import torch

from lopd import layout
from lopd.config import Params
from lopd.envs.registry import get_environment
from lopd.latent.teacher import teacher_logprobs, text_teacher_batch
from lopd.latent.teacher_rollout import ContextEnv

log = logging.getLogger(__name__)

CONTEXTS = ("none", "framing", "retrieved_text", "random_text", "oracle_text")


def oracle_experiences(p: Params, task, k: int, rng: random.Random) -> list[str]:
    """``k`` scripted-expert successes on other train tasks of ``task``'s app, observation-lite (none without an expert)."""
    from lopd.policy.engine import split_tasks

    env = get_environment(p)
    if env.expert is None:
        return []
    pool = [t for t in split_tasks(p, "train") if t.family == task.family and t.app == task.app]
    out = []
    for t in rng.sample(pool, min(k, len(pool))):
        ep = env.play(t, env.expert())
        out.append(env.lite_text(t.text, ep["actions"], ep["shorts"]))
    return out


def context_texts(p: Params, tasks: Sequence, retriever, bank) -> dict[str, dict[str, str | None]]:
    """Per context, per task id: the text in the framing sentence (None: no framing at all)."""
    k, rng = p.retrieval.n_ret, random.Random(p.seed + 7)
    lite = bank["lite_text"].tolist()
    retrieved = retriever.retrieve_batch(list(tasks), k)
    join = "\n\n".join
    return {
        "none": {t.task_id: None for t in tasks},
        "framing": {t.task_id: "" for t in tasks},
        "retrieved_text": {t.task_id: join(h["lite_text"] for h in hits) for t, hits in zip(tasks, retrieved)},
        "random_text": {t.task_id: join(rng.sample(lite, min(k, len(lite)))) for t in tasks},
        "oracle_text": {t.task_id: join(oracle_experiences(p, t, k, rng)) for t in tasks},
    }


@torch.no_grad()
def context_logp(model, tokenizer, episodes, texts: Sequence[str | None], ids_BT, mask_BT) -> torch.Tensor:
    """``log π(a_t | s_t, context)`` at the episodes' action tokens (student layout), ``texts[i]`` in episode i's framing."""
    batch = text_teacher_batch(tokenizer, episodes, texts)
    device = next(model.parameters()).device
    no_latents = torch.zeros(len(episodes), 0, model.config.hidden_size, device=device)
    return teacher_logprobs(model, batch.to(device), no_latents, ids_BT.to(device), mask_BT.to(device)).token_logp_BT


def nll_by_kind(p: Params, model, tokenizer, episodes, trajs, texts: dict[str, dict[str, str | None]], batch: int = 16) -> dict:
    """NLL per action token of ``episodes`` under each context: overall and per token kind.

    ``trajs[i]``: anything with the ``actions`` and ``observations`` texts of ``episodes[i]``.
    """
    from lopd.policy.token_kinds import KINDS, action_token_kinds
    from lopd.train.episodes import student_batch

    convention_start = get_environment(p).convention_start
    sums = {c: {k: 0.0 for k in ("all", *KINDS)} for c in texts}
    counts = {k: 0 for k in ("all", *KINDS)}
    for i in range(0, len(episodes), batch):
        eps, trs = episodes[i : i + batch], trajs[i : i + batch]
        ids_BT, _, mask_BT = student_batch(eps, tokenizer.pad_token_id)
        kind_BT = {k: torch.zeros_like(mask_BT) for k in KINDS}
        for b, (e, tr) in enumerate(zip(eps, trs)):
            for t, kind in enumerate(action_token_kinds(tokenizer, e.task, e.token_ids, e.action_mask, tr.actions, tr.observations,
                                                        convention_start)):
                if kind is not None:
                    kind_BT[kind][b, t] = True
        masks = {"all": mask_BT, **kind_BT}
        for k, m in masks.items():
            counts[k] += int(m.sum())
        for c, by_task in texts.items():
            logp_BT = context_logp(model, tokenizer, eps, [by_task[e.task.task_id] for e in eps], ids_BT, mask_BT).cpu()
            for k, m in masks.items():
                sums[c][k] -= float(logp_BT[m].sum())
    return {"nll": {c: s["all"] / max(1, counts["all"]) for c, s in sums.items()},
            "nll_by_kind": {c: {k: s[k] / max(1, counts[k]) for k in KINDS} for c, s in sums.items()},
            "nll_tokens": counts}


def measure(p: Params, model, tokenizer, retriever, bank) -> dict:
    """Success and NLL of the base under every context on ``privilege.dev_tasks`` dev tasks."""
    from lopd.policy.engine import make_engine, split_tasks, success_by_group
    from lopd.policy.probe import expert_episodes
    from lopd.train.episodes import from_expert, to_episodes
    from lopd.train.onpolicy import derive_seed

    env = get_environment(p)
    tasks = split_tasks(p, "dev", p.privilege.dev_tasks)
    texts = context_texts(p, tasks, retriever, bank)
    engine = make_engine(p, model, tokenizer)
    success, by_group, none_trajs = {}, {}, None
    for c in CONTEXTS:
        engine.make_env = lambda task, c=c: ContextEnv(env.make_env(task), texts[c][task.task_id])
        trajs = engine.run(tasks, p.privilege.samples_per_task, seed=derive_seed(p.seed, "privilege"), id_prefix=f"priv-{c}", progress=False)
        success[c] = sum(t.success for t in trajs) / len(trajs)
        by_group[c] = success_by_group(p, tasks, trajs)
        none_trajs = trajs if c == "none" else none_trajs
        log.info("privilege %s: dev success %.3f%s", c, success[c], "".join(f", {env.groups[g]} {v}" for g, v in by_group[c].items()))
    expert = [e for e in expert_episodes(tokenizer, tasks, env) if e.success] if env.expert else []
    nll = nll_by_kind(p, model, tokenizer, [from_expert(tokenizer, e) for e in expert], expert, texts)
    wins = [t for t in none_trajs if t.success]
    own = nll_by_kind(p, model, tokenizer, to_episodes(p, tasks, wins), wins, texts) if wins else {"nll": {}, "nll_by_kind": {}, "nll_tokens": {}}
    return {"success": success, "success_by_group": by_group, **nll, **{f"{k}_own": v for k, v in own.items()},
            "n_dev_tasks": len(tasks), "samples_per_task": p.privilege.samples_per_task,
            "n_nll_trajectories": len(expert), "n_nll_own_trajectories": len(wins)}


def run(p: Params) -> dict:
    """Measure the text privilege of the base; writes ``metrics/privilege.json``."""
    import mlflow

    from lopd.io import write_json
    from lopd.memory.bank import read_bank
    from lopd.memory.retrieval import open_retriever
    from lopd.ops.tracking import stage_run
    from lopd.policy.modeling import load_policy

    t0 = time.perf_counter()
    bank = read_bank(layout.bank_dir(p))
    retriever = open_retriever(p)
    with stage_run(p, "privilege"):
        model, tokenizer = load_policy(layout.policy_path(p), p.model.dtype)
        metrics = measure(p, model, tokenizer, retriever, bank)
        metrics["wall_s"] = time.perf_counter() - t0
        mlflow.log_metrics({f"success_{c}": v for c, v in metrics["success"].items()})
        mlflow.log_metrics({f"nll_{c}": v for c, v in metrics["nll"].items()})
        mlflow.log_metrics({f"nll_{c}_{k}": v for c, d in metrics["nll_by_kind"].items() for k, v in d.items()})
        write_json(layout.metrics_path(p, "privilege"), {"params": p.flat(), **metrics})
    log.info("privilege: success %s; NLL per action token %s", {c: round(v, 3) for c, v in metrics["success"].items()},
             {c: round(v, 4) for c, v in metrics["nll"].items()})
    return metrics
