"""Stage `collect`: base-policy rollouts on train tasks → ``data/rollouts/``, successes → ``data/bank/``.

Bank entries are "observation-lite" (spec step 1): the task text plus each action with a short
result; verbose observations are dropped. Collect writes round 0 of ``data/bank``; the rounds
``lopd ingest`` appended after it are kept (from ``data/ingest/rounds`` when DVC removed the bank
first). Both frames pass their Great Expectations suite before anything is written, and each
directory is replaced atomically, so a failed run never leaves a partial dataset behind.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import pandas as pd

from lopd import layout
from lopd.config import Params
from lopd.io import atomic_path, write_json
from lopd.memory.bank import bank_frame, expert_top_up
from lopd.policy.engine import app_group, environment, make_engine, split_tasks, success_by_group, train_tasks_by_id
from lopd.policy.rollout import Trajectory

log = logging.getLogger(__name__)

ROLLOUTS_FILE = "rollouts.parquet"


def full_text(tokenizer, traj: Trajectory) -> str:
    """The whole trajectory as the policy saw it (for the observation-lite size comparison)."""
    return tokenizer.decode(traj.token_ids, skip_special_tokens=False)


def rollouts_frame(trajs: list[Trajectory], tasks_by_id: dict, policy: str, round_: int) -> pd.DataFrame:
    rows = []
    for t in trajs:
        rows.append(
            {
                "rollout_id": t.rollout_id,
                "task_id": t.task_id,
                "family": t.family,
                "split": tasks_by_id[t.task_id].split,
                "sample_idx": t.sample_idx,
                "reward": float(t.reward),
                "success": bool(t.success),
                "n_turns": len(t.actions),
                "n_gen_tokens": t.n_gen_tokens,
                "n_tokens": len(t.token_ids),
                "prompt_len": t.prompt_len,
                "truncated": t.truncated,
                "actions_text": "\n".join(t.actions),
                "turns_json": json.dumps(
                    [{"action": a, "observation": o, "short": s} for a, o, s in zip(t.actions, t.observations + [None], t.shorts)]
                ),
                "token_ids": t.token_ids,
                "action_mask": t.action_mask,
                "logprobs": t.logprobs,
                "policy": policy,
                "round": round_,
            }
        )
    return pd.DataFrame(rows)




def run(p: Params) -> dict:
    """Roll out the base policy on train tasks; validate; write rollouts, bank and metrics."""
    import mlflow

    from lopd.ops.tracking import stage_run
    from lopd.ops.validation import validate_bank, validate_rollouts
    from lopd.policy.modeling import load_policy

    path = layout.policy_path(p)
    with stage_run(p, "collect"):
        model, tokenizer = load_policy(path, p.model.dtype)
        tasks = split_tasks(p, "train", p.collect.n_tasks)
        tasks_by_id = {t.task_id: t for t in tasks}
        engine = make_engine(p, model, tokenizer)
        t0 = time.perf_counter()
        trajs = engine.run(tasks, p.collect.samples_per_task, seed=p.seed, id_prefix="c0")
        rollout_s = time.perf_counter() - t0
        policy = Path(path).name if p.model.path else "base"
        rollouts = rollouts_frame(trajs, tasks_by_id, policy, round_=0)
        bank = bank_frame(trajs, tasks_by_id, policy, round_=0, lite_text=environment(p).lite_text)
        n_policy_bank = len(bank)
        bank = expert_top_up(p, bank, round_=0)  # no-op unless bank.expert_top_up > 0
        validate_rollouts(rollouts, p.env.success_threshold)  # before anything is written
        dev_test = {t.task_id for s in ("dev", "test") for t in split_tasks(p, s)}
        if len(bank):
            validate_bank(bank, p.env.success_threshold, forbidden_task_ids=dev_test)
        else:
            log.warning("no successful rollout: the bank is empty (cold start will need successes)")

        with atomic_path(layout.rollouts_dir(p)) as tmp:
            tmp.mkdir()
            rollouts.to_parquet(tmp / ROLLOUTS_FILE, index=False)
        # rounds `lopd ingest` appended (in the bank, or its own copies when DVC removed the bank before this
        # stage): experience from deployment outlives a re-collect
        kept = {f.name: f for d in (layout.ingest_dir(p) / "rounds", layout.bank_dir(p)) for f in sorted(d.glob("round-*.parquet"))
                if f.name != "round-000.parquet"}
        with atomic_path(layout.bank_dir(p)) as tmp:
            tmp.mkdir()
            bank.to_parquet(tmp / "round-000.parquet", index=False)
            for name, f in kept.items():
                shutil.copy2(f, tmp / name)
        if kept:
            log.info("collect: kept %d ingested bank round(s) beside the new round 0", len(kept))

        full_chars = [len(full_text(tokenizer, t)) for t in trajs if t.success]
        train = train_tasks_by_id(p)  # top-up entries may come from train tasks beyond collect.n_tasks
        metrics = {
            "n_rollouts": len(trajs),
            "success_rate": float(rollouts["success"].mean()),
            "mean_reward": float(rollouts["reward"].mean()),
            "n_bank": len(bank),
            "n_bank_expert": len(bank) - n_policy_bank,
            "gen_tokens_per_s": engine.stats.gen_tokens_per_s,
            "gen_tokens": engine.stats.gen_tokens,
            "rollout_s": rollout_s,
            "mean_turns": float(rollouts["n_turns"].mean()),
            "truncated": int(rollouts["truncated"].sum()),
            "success_by_family": rollouts.groupby("family")["success"].mean().round(4).to_dict(),
            "success_by_group": success_by_group(p, tasks, trajs),
            "bank_by_group": {g: int(sum(app_group(p, train[t]) == g for t in bank["task_id"])) for g in environment(p).groups},
            "bank_lite_chars_mean": float(bank["lite_text"].str.len().mean()) if len(bank) else 0.0,
            "bank_full_chars_mean": sum(full_chars) / len(full_chars) if full_chars else 0.0,
        }
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        write_json(layout.metrics_path(p, "collect"), metrics)
    log.info("collect: %d rollouts, success %.3f, bank %d", len(trajs), metrics["success_rate"], len(bank))
    return metrics
