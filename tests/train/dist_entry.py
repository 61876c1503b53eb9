"""One ``distill`` run of a test project on every rank of a ``torch.distributed.run`` launch.

``python -m torch.distributed.run --nproc_per_node N -m tests.train.dist_entry ROOT OUT [--stop-after K] [--resume] [KEY=VALUE ...]``

Each rank gets the test doubles of ``tests/train/test_distill.py`` (fake embedder, no MLflow, the
scripted expert on the train tasks it solves, so rewards and advantages are not all zero) and runs
``lopd.stages.distill.run``; rank 0 writes the result to OUT as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

import mlflow

import lopd.memory.embed
import lopd.ops.tracking
import lopd.policy.engine
from lopd.config import load_params
from lopd.stages import distill
from tests.train.test_distill import OVERRIDES, REPO, ExpertForSolvable, FakeEmbedder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("out")
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_intermixed_args()

    p = load_params(REPO / "params.yaml", "smoke", [f"paths.root={args.root}", *OVERRIDES, *args.overrides])  # as with_params
    lopd.memory.embed.make_embedder = lambda p, device=None: FakeEmbedder()
    lopd.ops.tracking.stage_run = lambda *a, **k: contextlib.nullcontext()
    for fn in ("log_metrics", "log_metric", "log_artifact", "log_text"):
        setattr(mlflow, fn, lambda *a, **k: None)
    real = lopd.policy.engine.make_backend
    lopd.policy.engine.make_backend = lambda kind, model, tok, t, top_p: ExpertForSolvable(real(kind, model, tok, t, top_p), tok, p)

    if p.distill.engine == "deepspeed":
        # DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce kernel when a venv first launches it
        # (75-120 s on 2 cores, again for every new venv: the build hashes the venv's paths). Only tensor-parallel
        # inference calls it (TorchBackend.inference_all_reduce); ZeRO's training collectives go through
        # torch.distributed (gloo) either way, so not building it changes no number these tests compare.
        import importlib

        # by module name: the attribute deepspeed.comm.torch is the torch package (deepspeed.comm re-exports it)
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    out = distill.run(p, resume=args.resume, stop_after=args.stop_after)
    if int(os.environ.get("RANK", 0)) == 0:
        Path(args.out).write_text(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
