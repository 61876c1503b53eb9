"""Benchmark: what experiences give the frozen base as text, and what the latent slots cost it.

Runs the ``privilege`` stage (``lopd.stages.privilege``: sampled dev success and NLL per action token
with no context, the framing sentence, retrieved / random / oracle experiences as text; writes
``metrics/privilege.json``) and prints its tables, then the NLL of the same scripted-expert dev
trajectories with ``n_ret·K`` latent slots in the framing: zero vectors, and an untrained
composer's latents of the retrieved experiences (what cold start starts from).

Needs ``models/base``, ``data/bank`` and ``data/index`` (``lopd bootstrap``, ``collect``, ``index``).

    .venv/bin/python benchmarks/privilege_ceiling.py [--profile demo] [--set k=v ...]
"""

from __future__ import annotations

import argparse

import torch

from lopd import layout
from lopd.config import load_params
from lopd.envs.registry import get_environment
from lopd.latent.composer import Composer
from lopd.latent.teacher import teacher_logprobs
from lopd.memory.retrieval import open_retriever
from lopd.policy.engine import split_tasks
from lopd.policy.modeling import load_policy
from lopd.policy.probe import expert_episodes
from lopd.stages.cold_start import n_latents
from lopd.stages.privilege import CONTEXTS
from lopd.stages.privilege import run as privilege_run
from lopd.train.episodes import from_expert, student_batch, teacher_batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    p = load_params(a.params, a.profile, a.overrides)
    torch.manual_seed(p.seed)

    m = privilege_run(p)
    print(f"{m['n_dev_tasks']} dev tasks; NLL on {m['n_nll_trajectories']} scripted-expert successes "
          f"({m['nll_tokens']['all']} action tokens: {m['nll_tokens']['copied']} copied, "
          f"{m['nll_tokens']['convention']} convention, {m['nll_tokens']['other']} other)")
    print(f"{'context':16s} {'success':>8s} {'pre-train':>9s} {'new':>6s} {'nll':>8s} {'copied':>8s} {'convent.':>8s} {'other':>8s} {'nll own':>8s}")
    for c in CONTEXTS:
        g, k = m["success_by_group"][c], m["nll_by_kind"][c]
        print(f"{c:16s} {m['success'][c]:8.3f} {g['pretrain']:9.3f} {g['new']:6.3f} {m['nll'][c]:8.4f} "
              f"{k['copied']:8.4f} {k['convention']:8.4f} {k['other']:8.4f} {m['nll_own'].get(c, float('nan')):8.4f}")

    # The latent slots the teacher gets instead of text, before cold start.
    model, tokenizer = load_policy(layout.policy_path(p), p.model.dtype)
    model.eval()
    tasks = split_tasks(p, "dev", p.privilege.dev_tasks)
    episodes = [from_expert(tokenizer, e) for e in expert_episodes(tokenizer, tasks, get_environment(p)) if e.success]
    retrieved = [[h["lite_text"] for h in hits] for hits in open_retriever(p).retrieve_batch([e.task for e in episodes], p.retrieval.n_ret)]
    ids_BT, _, mask_BT = student_batch(episodes, tokenizer.pad_token_id)
    L = n_latents(p)
    slots = teacher_batch(tokenizer, episodes, L, p.composer.placeholder)
    with torch.no_grad():
        composer = Composer.build(model, tokenizer, p.composer, seed=p.seed)
        rows = {f"{L} zero slots": torch.zeros(len(episodes), L, model.config.hidden_size),
                f"{L} untrained composer latents": composer([e.task.text for e in episodes], retrieved)}
        for name, latents in rows.items():
            logp_BT = teacher_logprobs(composer.backbone, slots, latents, ids_BT, mask_BT).token_logp_BT
            print(f"{name:34s} nll {-(logp_BT[mask_BT].mean().item()):.4f}")


if __name__ == "__main__":
    main()
