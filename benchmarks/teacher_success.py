"""Benchmark: the teacher as a policy — success of the frozen base with latents against text.

The distillation signal is only as good as the teacher. On the same dev tasks, one sample each,
the same sampling seed, this rolls out the frozen base

- with its own prompt (``none``),
- with the ``n_ret`` retrieved experiences as *text* in the teacher's framing (``retrieved_text``,
  the ``privilege`` stage's context and OPSD's teacher),
- with the latents of the cold-start composer φ0 (``models/composer``), and
- with the latents of each ``--composer`` given (e.g. LOPD's final φ of a sweep seed,
  ``runs/sweep/seed0/models/checkpoints/distill/lopd/composer``),

and prints success overall and per app group (pre-training apps / new apps), with the mean
reward. ``--out`` writes the table as JSON.

    .venv/bin/python benchmarks/teacher_success.py [--profile demo] [--tasks 200] [--composer DIR ...] [--out F]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from lopd import layout
from lopd.config import load_params
from lopd.envs.toolworld import ToolWorldEnv
from lopd.io import write_json
from lopd.latent.composer import Composer
from lopd.latent.teacher_rollout import LatentBackend, LatentContextEnv, first_prompt
from lopd.memory.retrieval import open_retriever
from lopd.policy.engine import make_engine, split_tasks, success_by_group
from lopd.policy.modeling import load_policy
from lopd.policy.rollout import RolloutEngine
from lopd.stages.privilege import ContextEnv
from lopd.train.onpolicy import derive_seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--tasks", type=int, default=200, help="dev tasks, one sample each")
    ap.add_argument("--composer", action="append", default=[], metavar="DIR", help="another composer's directory (repeatable)")
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
    seed = derive_seed(p.seed, "teacher-success")

    def env(task):
        return ToolWorldEnv(task, p.env.max_turns, p.env.success_threshold)

    def score(trajs) -> dict:
        return {"success": sum(t.success for t in trajs) / len(trajs), "reward": sum(t.reward for t in trajs) / len(trajs),
                **{f"success_{g}": v for g, v in success_by_group(p, tasks, trajs).items()}}

    rows = {}
    engine = make_engine(p, base, tok)
    engine.make_env = env
    rows["none"] = score(engine.run(tasks, 1, seed=seed, progress=False))
    engine.make_env = lambda task: ContextEnv(env(task), "\n\n".join(exps[task.task_id]))
    rows["retrieved_text"] = score(engine.run(tasks, 1, seed=seed, progress=False))

    for name, path in [("latents_phi0", layout.composer_dir(p)), *((f"latents:{d}", Path(d)) for d in a.composer)]:
        backbone, _ = load_policy(layout.policy_path(p), p.model.dtype)
        composer = Composer.load(backbone, tok, path).eval()
        n_latents = p.retrieval.n_ret * p.composer.num_latents
        backend = LatentBackend(base, tok, p.rollout.temperature, p.rollout.top_p)
        with torch.no_grad():
            for i in range(0, len(tasks), 32):
                chunk = tasks[i : i + 32]
                lat_BLD = composer([t.text for t in chunk], [exps[t.task_id] for t in chunk])
                for t, lat_LD in zip(chunk, lat_BLD):
                    backend.register(first_prompt(tok, LatentContextEnv(env(t), n_latents)), lat_LD)
        latent_engine = RolloutEngine(backend, tok, make_env=lambda task: LatentContextEnv(env(task), n_latents),
                                      max_new_tokens=p.rollout.max_new_tokens, batch_size=p.rollout.batch_size,
                                      max_seq_len=engine.max_seq_len)
        rows[name] = score(latent_engine.run(tasks, 1, seed=seed, progress=False))
        print(f"  {name}: done", flush=True)

    print(f"teacher success on {len(tasks)} dev tasks (one sample each, temperature {p.rollout.temperature}, same seed):")
    print(f"| teacher context | success | pre-training apps | new apps | mean reward |\n|---|---|---|---|---|")
    for name, r in rows.items():
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"| {name} | {fmt(r['success'])} | {fmt(r['success_pretrain'])} | {fmt(r['success_new'])} | {fmt(r['reward'])} |")
    if a.out:
        write_json(a.out, {"tasks": len(tasks), "rows": rows})


if __name__ == "__main__":
    main()
