"""Data-parallel distill under DeepSpeed ZeRO on 2 CPU ranks (gloo) against one process.

The helpers of ``lopd.train.parallel`` are checked against closed forms in one process; the
launches (``torch.distributed.run``, ``tests/train/dist_entry.py``) train every method on a test
project whose student meets the scripted expert's successes, so rewards, advantages, bank rounds
and the composer's update are all non-trivial.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from lopd import layout
from lopd.config import ParamsError
from lopd.train.parallel import DataParallel
from lopd.train.updater import deepspeed_config
from tests.train.test_distill import REPO, build_project, with_params

deepspeed = pytest.importorskip("deepspeed", reason="deepspeed is not installed (make install puts it in .venv)")

METHODS = "distill.methods=[lopd,opsd,grpo,sft]"
# world 1: there the tiny model's GRPO groups do not all tie (world 0's do, and a zero loss would prove nothing)
COMMON = (METHODS, "rollout.rng=trajectory", "env.max_turns=3", "distill.rounds=2", "distill.eval_dev_tasks=4", "toolworld.world_seed=1")
FIRST_STEP = {"lopd": ("kl", "delta", "student_grad_norm", "composer_grad_norm"), "opsd": ("kl", "delta", "student_grad_norm"),
              "grpo": ("loss", "grad_norm"), "sft": ("loss", "grad_norm")}
# A base at init std 0.2 (tests.helpers.tiny_model): the teacher's context moves its next-token distribution
# by a KL of 0.04-0.06 nats per token and Δ of 0.07-0.47 (at the default 0.02: KL ~2e-6, rounding noise).
INIT_STD = 0.2
SUBSTANTIVE = 1e-3  # every compared KL and |Δ| must be at least this, or the comparison would be of noise
# Tolerances from float32 summation order. Two ranks sum the same per-token terms in another order (each rank
# its own block, then the all-reduce) and pad their batches to other lengths, so matmuls block differently.
# float32's unit roundoff is 6e-8; a sum of n terms reordered differs by at most ~n·6e-8 relative, and
# a batch holds n ≲ 10^3 action tokens (× 21 top-M bins): ≤ 6e-5, so step 0 gets 1e-4. Step 1 starts from
# weights updated by Adam from those gradients; Adam divides each entry by its own √v, so an entry whose
# gradient is near zero can carry a larger relative difference into the weights: 10× looser, 1e-3.
# Measured on this setup: ≤ 2.3e-6 relative at both steps, for every key, ZeRO-2 and ZeRO-3.
RTOL_STEP0, RTOL_LATER = 1e-4, 1e-3


def assert_substantive(method: str, history: list[dict]) -> None:
    for h in history:
        for key in {"kl", "delta"} & set(FIRST_STEP[method]):
            assert abs(h[key]) >= SUBSTANTIVE, (method, key, h["step"], h[key])


def assert_history_matches(method: str, ref: list[dict], got: list[dict]) -> None:
    """``got``'s per-step KL, Δ, losses and gradient norms equal the one-process ``ref``'s within float32 reordering."""
    assert_substantive(method, ref)  # a comparison of noise, or of zeros only, would prove nothing
    assert len(got) == len(ref)
    for key in FIRST_STEP[method]:
        assert any(h[key] != 0.0 for h in ref), (method, key)
        for a, b in zip(ref, got):  # abs: GRPO's step 0 has all-equal rewards, so loss = grad = 0 exactly
            rtol = RTOL_STEP0 if a["step"] == 0 else RTOL_LATER
            assert b[key] == pytest.approx(a[key], rel=rtol, abs=1e-12), (method, key, a["step"])


def test_split_gather_and_weights_in_one_process():
    dp = DataParallel()
    assert dp.split([1, 2, 3]) == [1, 2, 3] and dp.gather([4]) == [4]
    assert dp.weight(7) == 1.0 and dp.weight(0) == 0.0 and dp.average(0.25, 1.0) == 0.25
    blocks = [DataParallel(r, 3).split(list(range(8))) for r in range(3)]
    assert blocks == [[0, 1, 2], [3, 4, 5], [6, 7]]  # contiguous, sizes differ by at most one, rank order = order


def test_deepspeed_config_takes_lr_clip_and_batch_from_params():
    template = json.loads((REPO / "infra/deepspeed/zero3.json").read_text())
    cfg = deepspeed_config(template, lr=3e-4, grad_clip=0.5, batch=32, world=4, bf16=False, max_stage=2)
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (32, 8, 1)
    assert cfg["optimizer"]["params"]["lr"] == 3e-4 and cfg["gradient_clipping"] == 0.5 and cfg["bf16"]["enabled"] is False
    assert cfg["zero_optimization"]["stage"] == 2  # capped (the composer's engine)
    assert template["optimizer"]["params"]["lr"] == "auto"  # the template is not touched
    with pytest.raises(ParamsError, match=r"'auto' at \['scheduler.params.warmup'\]"):
        deepspeed_config({**template, "scheduler": {"params": {"warmup": "auto"}}}, lr=1.0, grad_clip=1.0, batch=4, world=2, bf16=False)


def test_launch_checks_fail_before_any_compute(tmp_path):
    from lopd.stages.distill import check_parallel

    p = with_params(build_project(tmp_path), "distill.engine=deepspeed", "distill.zero_config=infra/deepspeed/zero9.json")
    with pytest.raises(ParamsError, match=r"zero_config = 'infra/deepspeed/zero9.json' is not a file"):
        check_parallel(p, ["lopd"], 1)
    p = with_params(p, "distill.engine=deepspeed")
    with pytest.raises(ParamsError, match=r"tasks per step \{'grpo': 2\}: every rank needs a task"):
        check_parallel(p, ["lopd", "grpo"], 4)
    with pytest.raises(ParamsError, match="distill.engine = 'single' runs one process, but 2 were launched"):
        check_parallel(with_params(p, "distill.engine=single"), ["lopd"], 2)


def test_nproc_needs_the_deepspeed_engine(tmp_path, capsys):
    from lopd.cli import main

    assert main(["distill", "--profile", "smoke", "--set", f"paths.root={tmp_path}", "--nproc", "2"]) == 2
    assert "distill.engine = 'single' runs one process: add --set distill.engine=deepspeed" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing launched, nothing written


def launch(root, nproc: int, *overrides: str, stop_after: int | None = None, resume: bool = False) -> dict:
    out = root / f"out-{nproc}-{stop_after}-{resume}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "tests.train.dist_entry",
           str(root), str(out), *(["--stop-after", str(stop_after)] if stop_after else []), *(["--resume"] if resume else []), *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _students(p, methods=("lopd", "opsd", "grpo", "sft")):
    return {m: load_file(layout.student_dir(p, m) / "model.safetensors") for m in methods}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    p = build_project(tmp_path_factory.mktemp("dp1"), *COMMON, init_std=INIT_STD)
    return p, launch(p.root(), 1, *COMMON)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every method on 2 ranks under ZeRO-2: compared with one process below, and the straight run that a
    killed and resumed 2-rank run must equal (built once for both: a 2-rank launch is the costly part)."""
    p = build_project(tmp_path_factory.mktemp("zero2"), *COMMON, init_std=INIT_STD)
    return p, launch(p.root(), 2, *COMMON, "distill.engine=deepspeed")


def test_zero2_on_two_ranks_matches_one_process(one_process, two_ranks):
    p1, single = one_process
    p2, double = two_ranks
    for method in FIRST_STEP:
        a, b = single["details"][method], double["details"][method]
        assert a["rollouts"] == b["rollouts"] == 8  # the global budget: 2 steps × 4
        assert_history_matches(method, a["history"], b["history"])
        # the same rollouts (rollout.rng: trajectory): identical rewards and dev curves
        assert [h["reward_mean"] for h in a["history"]] == [h["reward_mean"] for h in b["history"]]
        assert [c["dev_success"] for c in a["curve"]] == [c["dev_success"] for c in b["curve"]]
    assert any(h["reward_mean"] > 0 for h in single["details"]["grpo"]["history"])
    s1, s2 = _students(p1), _students(p2)
    for m in s1:
        for k in s1[m]:
            torch.testing.assert_close(s2[m][k], s1[m][k], atol=1e-5, rtol=1e-4)
    # rank 0 alone wrote the outputs, and each rank's ZeRO partition is in the checkpoint
    assert (p2.root() / "metrics" / "distill.json").exists()
    zero = layout.checkpoint_dir(p2, "lopd") / "zero-student" / "zero"
    assert sorted(f.name for f in zero.glob("*optim_states.pt")) == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]


def test_zero3_on_two_ranks_completes_and_matches(one_process, tmp_path):
    p1, single = one_process
    p3 = build_project(tmp_path / "zero3", *COMMON, init_std=INIT_STD)
    out = launch(p3.root(), 2, *COMMON, "distill.engine=deepspeed", "distill.zero_config=infra/deepspeed/zero3.json")
    for method in ("lopd", "grpo"):
        assert out["details"][method]["rollouts"] == 8 and out["details"][method]["steps"] == 2
        assert_history_matches(method, single["details"][method]["history"], out["details"][method]["history"])
    s1, s3 = _students(p1, ("lopd",)), _students(p3, ("lopd",))  # the gathered ZeRO-3 weights, a plain HF checkpoint
    for k in s1["lopd"]:
        torch.testing.assert_close(s3["lopd"][k], s1["lopd"][k], atol=1e-5, rtol=1e-4)


def test_resume_under_deepspeed_continues_the_two_rank_run(two_ranks, tmp_path):
    """Killed after step 1 of 2 (checkpoint at step 1) and resumed on 2 ranks = one straight 2-rank run.

    The straight run is ``two_ranks``: the same params and base with OPSD and GRPO between LOPD and SFT. Each
    method trains from its own seeds (``derive_seed(seed, method, ...)``), its own copy of the bank and its
    own optimiser, so the methods run beside it change none of its numbers, and this test checks that too."""
    straight, o1 = two_ranks
    extra = (*COMMON, "distill.methods=[lopd,sft]", "distill.engine=deepspeed")
    resumed = build_project(tmp_path / "resumed", *extra, init_std=INIT_STD)
    assert launch(resumed.root(), 2, *extra, stop_after=1) == {"stopped_after": 1, "method": "lopd"}
    o2 = launch(resumed.root(), 2, *extra, "distill.resume=true", resume=True)
    for m in ("lopd", "sft"):
        h1, h2 = o1["details"][m]["history"], o2["details"][m]["history"]
        untimed = lambda h: {k: v for k, v in h.items() if k != "train_wall_s"}  # noqa: E731
        assert [h["step"] for h in h2] == [0, 1]  # step 0 from the checkpoint, step 1 trained after the resume
        assert_substantive(m, h1)
        for a, b in zip(h1, h2):  # the same ranks, shapes and order: equal up to the checkpoint's round trip
            assert untimed(b) == pytest.approx(untimed(a), rel=1e-6)
    s1, s2 = _students(straight, ("lopd", "sft")), _students(resumed, ("lopd", "sft"))
    for m in s1:
        for k in s1[m]:
            torch.testing.assert_close(s2[m][k], s1[m][k], atol=1e-6, rtol=1e-6)
