"""Benchmark: the teacher as a policy — success of the frozen base with latents against text.

The distillation signal is only as good as the teacher. On the same dev tasks, one sample each,
the same sampling seed, this rolls out the frozen base

- with its own prompt (``none``),
- with the ``n_ret`` retrieved experiences as *text* in the teacher's framing (``retrieved_text``,
  the ``privilege`` stage's context and OPSD's teacher),
- with the latents of the cold-start composer φ0 (``models/composer``), and
- with the latents of each ``--composer`` given (e.g. LOPD's final φ of a sweep seed,
  ``runs/sweep/seed0/models/checkpoints/distill/lopd/composer``),
- with ``--ceiling last`` / ``--ceiling first``: "latents" that are the true token embeddings of
  each experience's last / first K tokens (``composer.num_latents``): what K latents per
  experience could give if they wrote tokens perfectly (the warm-up's target is ``last``),

and prints success overall and per app group (pre-training apps / new apps), with the mean
reward. ``--out`` writes the table as JSON.

    .venv/bin/python benchmarks/teacher_success.py [--profile demo] [--tasks 200] [--composer DIR ...] [--ceiling last] [--out F]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lopd import layout
from lopd.config import load_params
from lopd.io import write_json
from lopd.latent.composer import Composer
from lopd.latent.teacher_rollout import teacher_success
from lopd.memory.retrieval import open_retriever
from lopd.policy.engine import split_tasks
from lopd.policy.modeling import load_policy
from lopd.train.composer_warmup import TokenEmbeddingLatents
from lopd.train.onpolicy import derive_seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--tasks", type=int, default=200, help="dev tasks, one sample each")
    ap.add_argument("--composer", action="append", default=[], metavar="DIR", help="another composer's directory (repeatable)")
    ap.add_argument("--ceiling", action="append", default=[], choices=["last", "first"],
                    help="a row whose latents are the embeddings of each experience's last / first K tokens (repeatable)")
    ap.add_argument("--no-phi0", action="store_true", help="leave out the cold-start composer's row (e.g. before cold_start has run)")
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    p = load_params(a.params, a.profile, a.overrides)
    torch.manual_seed(p.seed)

    base, tok = load_policy(layout.policy_path(p), p.model.dtype)
    base.eval().requires_grad_(False)
    tasks = split_tasks(p, "dev", a.tasks)
    hits = open_retriever(p).retrieve_batch(list(tasks), p.retrieval.n_ret)
    exps = {t.task_id: [h["lite_text"] for h in hs] for t, hs in zip(tasks, hits)}
    composers = {}
    phi0 = [] if a.no_phi0 else [("latents_phi0", layout.composer_dir(p))]
    for name, path in [*phi0, *((f"latents:{d}", Path(d)) for d in a.composer)]:
        backbone, _ = load_policy(layout.policy_path(p), p.model.dtype)
        composers[name] = Composer.load(backbone, tok, path).eval()
    for end in a.ceiling:
        composers[f"ceiling_{end}{p.composer.num_latents}"] = TokenEmbeddingLatents(base, tok, p.composer.num_latents, end)
    # the seed metrics/cold_start.json's teacher_success uses: the two agree on the same composer
    rows = teacher_success(p, base, tok, tasks, exps, composers, seed=derive_seed(p.seed, "teacher-success"))

    print(f"teacher success on {len(tasks)} dev tasks (one sample each, temperature {p.rollout.temperature}, same seed):")
    print("| teacher context | success | pre-training apps | new apps | mean reward |\n|---|---|---|---|---|")
    for name, r in rows.items():
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"| {name} | {fmt(r['success'])} | {fmt(r['success_pretrain'])} | {fmt(r['success_new'])} | {fmt(r['reward'])} |")
    if a.out:
        write_json(a.out, {"tasks": len(tasks), "rows": rows})


if __name__ == "__main__":
    main()
