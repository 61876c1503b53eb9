"""Benchmark: one LOPD step split into its phases, beside one OPSD and one GRPO step at the same generations.

LOPD: rollout (``batch_tasks`` tasks × 1) / retrieval / teacher scoring (composer + teacher
forward, no grad) / student update (forward + KL backward + Adam) / composer update (composer
and teacher forward with grad + Lagrangian backward + Adam). OPSD (text privilege): the same
phases without the composer: its teacher scoring is the base's forward over the experiences
written as text (a longer prompt than LOPD's n_ret × K latents). GRPO: rollout (``batch_tasks / G``
of the same step's tasks × G) / policy update (π_old recompute + ``grpo.updates_per_batch``
clipped-ratio steps). Same step index, so the same tasks; the first step of each method is a
warm-up and is not timed. On a shared CPU, read the ratios rather than the absolute times.

    .venv/bin/python benchmarks/step_cost.py [--profile demo] [--steps 2] [--set k=v ...]

With ``distill.composer_every = k`` the timed steps are rounded up to whole cycles of k, so the
composer update's share is its amortised cost.

Needs ``models/base``, ``models/composer`` and ``data/index`` (``lopd bootstrap``, ``collect``,
``index``, ``cold-start``); writes nothing (LOPD runs without a bank of its own here).
"""

from __future__ import annotations

import argparse

import torch

from lopd import layout
from lopd.config import load_params
from lopd.policy.engine import make_engine, split_tasks
from lopd.policy.modeling import load_policy
from lopd.stages.distill import _check_inputs
from lopd.train.episodes import Timer
from lopd.train.loop import make_trainer
from lopd.train.onpolicy import derive_seed, step_tasks

LOPD_PHASES = ("rollout", "retrieval", "teacher_scoring", "student_update", "composer_update")
GRPO_PHASES = ("rollout", "policy_update")
METHODS = {"lopd": LOPD_PHASES, "opsd": LOPD_PHASES[:-1], "grpo": GRPO_PHASES}


def time_steps(p, trainer, steps: int) -> tuple[dict[str, float], int]:
    """ms per step of each phase over ``steps`` timed steps (after one warm-up), and generated tokens per step."""
    engine = make_engine(p, trainer.student, trainer.tokenizer)
    train = split_tasks(p, "train")
    tokens = 0
    for step in range(steps + 1):
        if step == 1:
            trainer.timer, tokens = Timer(), 0  # drop the warm-up step
        tasks = step_tasks(p, train, step, trainer.tasks_per_step)
        with trainer.timer("rollout"):
            trajs = engine.run(tasks, trainer.samples_per_task, seed=derive_seed(p.seed, "bench", step), progress=False)
        trainer.step(step, tasks, trajs)
        trainer.timer.steps += 1
        tokens += engine.stats.gen_tokens
    return trainer.timer.per_step_ms(), tokens // max(1, steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per method (after one warm-up step)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    p = load_params(a.params, a.profile, a.overrides)
    _check_inputs(p, list(METHODS))
    k = p.distill.composer_every
    steps = -(-a.steps // k) * k  # whole cycles: after the warm-up step 0, steps 1..n hold n/k composer updates

    rows = {}
    for method, phases in METHODS.items():
        student, tok = load_policy(layout.policy_path(p), p.model.dtype)
        trainer = make_trainer(p, method, student, tok, rounds=False)
        ms, tokens = time_steps(p, trainer, steps)
        rows[method] = ({ph: ms.get(ph, 0.0) for ph in phases}, tokens)
        del student, trainer

    d = p.distill
    print(f"model: {layout.policy_path(p)}  batch: {d.batch_tasks} generations/step  G: {p.grpo.group_size}  "
          f"n_ret×K: {p.retrieval.n_ret}×{p.composer.num_latents}  top-M: {d.top_m}  composer frozen: {p.composer.frozen}  "
          f"composer every {k} steps  threads: {torch.get_num_threads()}  timed steps: {steps} (shared CPU: compare ratios)")
    print(f"{'phase':18s}" + "".join(f"{m.upper() + ' ms/step':>15s}{'share':>7s}" for m in METHODS))
    totals = {m: sum(r[0].values()) for m, r in rows.items()}
    for ph in dict.fromkeys(LOPD_PHASES + GRPO_PHASES):
        cells = []
        for m in METHODS:
            v = rows[m][0].get(ph)
            cells.append(f"{v:>15.1f}{v / totals[m]:>7.0%}" if v is not None else f"{'—':>15s}{'':>7s}")
        print(f"{ph:18s}{''.join(cells)}")
    print(f"{'total':18s}" + "".join(f"{totals[m]:>15.1f}{'':>7s}" for m in METHODS))
    print("generated tokens/step: " + ", ".join(f"{m.upper()} {rows[m][1]}" for m in METHODS) + "; "
          f"LOPD/GRPO step time {totals['lopd'] / max(totals['grpo'], 1e-9):.2f}x; "
          f"LOPD/OPSD {totals['lopd'] / max(totals['opsd'], 1e-9):.2f}x; "
          f"LOPD training overhead over its rollout {(totals['lopd'] - rows['lopd'][0]['rollout']) / max(rows['lopd'][0]['rollout'], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
