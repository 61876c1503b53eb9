"""The GPU device check: what of the pipeline runs on CUDA, and how fast, within the device's image.

The lent machine (one H200, no network) has torch, transformers, peft and accelerate, plus what
travels with the tree (at most 64 MiB). MLflow, faiss, Great Expectations, pandas and pyarrow do
not fit, so the stages themselves (which track, index and validate) cannot run there; this
check runs the GPU work of the pipeline through the same library code instead:

1. rollouts of the committed embedded base (``lopd/assets/base``) on ToolWorld dev tasks with the
   ``hf`` backend, demo params: generated tokens/s, bf16 (``model.dtype: auto``) and fp32;
2. a demo-scale GRPO update (``lopd.train.grpo.grpo_update``, 8 tasks × G = 8) on those rollouts:
   trained tokens/s (forward + backward + Adam);
3. the same update through ``distill.engine: deepspeed`` (ZeRO-2, one rank, nccl) when DeepSpeed
   imports, against the torch one in fp32: loss and gradient norm;
4. whether vLLM imports (it is not in the image; its contract test runs on CPU: ``make test-vllm``).

    python infra/gpu/check.py [--device cuda|cpu] [--tasks 32] [--out DIR]

``--device cpu`` gives the reference on the development machine (docs/scale.md). Writes
``gpu_check.json`` to ``--out`` (default ``$OUT`` or ``.``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from lopd.config import load_params  # noqa: E402
from lopd.policy.base_asset import ASSET_DIR  # noqa: E402
from lopd.policy.engine import make_engine, split_tasks  # noqa: E402
from lopd.policy.modeling import load_policy  # noqa: E402
from lopd.train.episodes import student_batch, to_episodes  # noqa: E402
from lopd.train.grpo import grpo_update  # noqa: E402
from lopd.train.updater import TorchAdam  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def rollouts(p, device: str, dtype: str, tasks, samples: int):
    model, tok = load_policy(ASSET_DIR, dtype, device)
    engine = make_engine(p, model, tok)
    engine.run(tasks[:2], 1, seed=1, progress=False)  # warm-up (kernels, allocator)
    sync(device)
    trajs = engine.run(tasks, samples, seed=0, progress=False)
    s = engine.stats
    return model, tok, trajs, {"dtype": str(model.dtype), "trajectories": s.n_trajectories, "gen_tokens": s.gen_tokens,
                               "wall_s": round(s.wall_s, 3), "gen_tokens_per_s": round(s.gen_tokens_per_s, 1),
                               "success": sum(t.success for t in trajs) / len(trajs)}


def grpo_step(p, model, tok, tasks, trajs, updater, g: int) -> dict:
    episodes = to_episodes(p, tasks, trajs)
    reward_NG = torch.tensor([t.reward for t in trajs], dtype=torch.float32).reshape(-1, g)
    _, attn_BT, _ = student_batch(episodes, tok.pad_token_id)
    device = next(model.parameters()).device.type
    sync(device)
    t0 = time.perf_counter()
    out = grpo_update(model, updater, episodes, reward_NG, clip_eps=p.grpo.clip_eps, updates=1, pad_id=tok.pad_token_id)
    sync(device)
    wall = time.perf_counter() - t0
    return {"loss": out["loss"], "grad_norm": out["grad_norm"], "tokens": int(attn_BT.sum()), "wall_s": round(wall, 3),
            "train_tokens_per_s": round(int(attn_BT.sum()) / wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tasks", type=int, default=32, help="dev tasks of the rollout measurement")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = args.device
    p = load_params(REPO / "params.yaml", "demo", ["rollout.rng=trajectory"])
    report: dict = {"device": torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu", "torch": torch.__version__,
                    "threads": torch.get_num_threads()}
    dev_tasks = split_tasks(p, "dev", args.tasks)
    for dtype in (["auto", "float32"] if dev.startswith("cuda") else ["float32"]):
        report[f"rollout_{dtype}"] = rollouts(p, dev, dtype, dev_tasks, 1)[3]
        print(f"rollouts ({dtype}):", report[f"rollout_{dtype}"], flush=True)

    g = p.grpo.group_size
    train = split_tasks(p, "train", p.distill.batch_tasks // g)
    model, tok, trajs, info = rollouts(p, dev, "float32", train, g)
    report["grpo_rollouts"] = info
    reference = copy.deepcopy(model)
    report["grpo_torch"] = grpo_step(p, model, tok, train, trajs, TorchAdam(model.parameters(), p.grpo.lr, p.distill.grad_clip), g)
    print("GRPO update (torch Adam):", report["grpo_torch"], flush=True)

    try:
        import deepspeed  # noqa: F401
    except ImportError as e:
        report["deepspeed"] = f"not importable: {e}"
    else:
        from lopd.train.parallel import init_data_parallel
        from lopd.train.updater import make_updater

        q = load_params(REPO / "params.yaml", "demo", ["distill.engine=deepspeed"])
        dp = init_data_parallel("deepspeed")
        upd = make_updater(q, reference, list(reference.parameters()), q.grpo.lr, dp)
        report["grpo_deepspeed_zero2"] = grpo_step(p, reference, tok, train, trajs, upd, g)
        a, b = report["grpo_torch"], report["grpo_deepspeed_zero2"]
        report["deepspeed_vs_torch_rel"] = {k: abs(a[k] - b[k]) / max(abs(a[k]), 1e-30) for k in ("loss", "grad_norm")}
    print("DeepSpeed:", report.get("deepspeed_vs_torch_rel", report.get("deepspeed")), flush=True)
    try:
        import vllm

        report["vllm"] = vllm.__version__
    except ImportError:
        report["vllm"] = "not in this image (contract test on CPU: make test-vllm)"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
