"""``evaluate.benchmarks: [humaneval]``: a student's pass@1 over all 164 HumanEval problems.

Each problem gets ``evaluate.samples_per_task`` sampled answers, one attempt each (no test
feedback: the standard protocol), graded in the code sandbox; pass@1 is the mean over problems of
the unbiased estimator (:func:`lopd.envs.passk.humaneval_pass_at_k` with n = samples, c = passing).
Played through the registry's ``code`` environment, like any other. Without the sandbox, or when the
model's context cannot hold the prompts, the result is one line saying why instead of a score.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from lopd.envs.passk import humaneval_pass_at_k
from lopd.envs.registry import SPLITS, get_environment

log = logging.getLogger(__name__)


def _skip(line: str, status: str, warned: set[str] | None, **info) -> dict:
    if warned is None or line not in warned:
        log.warning(line)
    if warned is not None:
        warned.add(line)
    return {**info, "status": status, "reason": line}


def evaluate_humaneval(p, benchmark: str, model, tokenizer, seed: int, warned: set[str] | None = None) -> dict:
    """One student's HumanEval pass@1 (see the module docstring)."""
    from lopd.policy.chat import encode, render_prompt
    from lopd.policy.engine import make_engine

    one_attempt = p.model_copy(update={"env": p.env.model_copy(update={"max_turns": 1})})
    try:
        env = get_environment(one_attempt, "code")
    except ValueError as e:  # no sandbox here
        return _skip(f"{benchmark}: not evaluated: {e}", "skipped_sandbox", warned)
    tasks = [t for split in SPLITS for t in env.tasks(split, 1 << 20)]
    lengths = sorted(len(encode(tokenizer, render_prompt(tokenizer, env.make_env(t).initial_observation()))) for t in tasks)
    context = getattr(model.config, "max_position_embeddings", None)
    info = {"n_tasks": len(tasks), "samples_per_task": p.evaluate.samples_per_task, "prompt_tokens_max": lengths[-1], "context": context}
    if context is not None and lengths[-1] + p.rollout.max_new_tokens > context:
        return _skip(f"{benchmark}: not evaluated: its prompts need up to {lengths[-1]} tokens plus rollout.max_new_tokens = "
                     f"{p.rollout.max_new_tokens}, over this model's context of {context} tokens; evaluate a checkpoint with a "
                     "longer context (model.path)", "skipped_context", warned, **info)
    n = p.evaluate.samples_per_task
    trajs = make_engine(p, model, tokenizer, make_env=env.make_env).run(tasks, n, seed=seed, id_prefix=benchmark)
    passed: dict[str, int] = defaultdict(int)
    for t in trajs:
        passed[t.task_id] += bool(t.success)
    per_task = [humaneval_pass_at_k(n, passed[t.task_id], 1) for t in tasks]
    return {**info, "status": "ok", "pass_at_1": sum(per_task) / len(per_task),
            "mean_reward": sum(float(t.reward) for t in trajs) / len(trajs), "n_solved": sum(c > 0 for c in passed.values())}


def humaneval_table(by_method: dict) -> str:
    """One row per method: pass@1, or why it was not run."""
    lines = ["", "HumanEval (pass@1 over all 164 problems, unbiased estimator; one attempt per sample).", "",
             "| method | pass@1 | mean reward (tests passed) | problems solved at least once | note |", "|---|---|---|---|---|"]
    for m, r in by_method.items():
        ok = r["status"] == "ok"
        lines.append(f"| {m} | {r['pass_at_1']:.3f} | {r['mean_reward']:.3f} | {r['n_solved']} | |" if ok else f"| {m} | — | — | — | {r['status']} |")
    reasons = dict.fromkeys(r["reason"] for r in by_method.values() if r["status"] != "ok")
    return "\n".join(lines + [""] + [f"- {line}" for line in reasons]) + "\n"
