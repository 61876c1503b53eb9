"""Stage `evaluate`: every method's student on the TEST split (never used for tuning), with intervals.

For vanilla (the base) and each method of ``distill.methods``: ``evaluate.samples_per_task``
sampled rollouts (rollout temperature / top-p) on the first ``evaluate.n_tasks`` test tasks,
the same seed for every method (common random numbers), then

- ``success_rate`` with a Wilson score interval over the n = tasks × samples episodes;
- ``mean_reward`` with a Student-t interval over the per-task mean rewards (a task's samples
  are correlated, so the task is the independent unit), cut to the reward range [0, 1];
- ``reward_diff_vs_vanilla``: the paired (same task) difference of per-task mean rewards, t interval;
- behaviour, as the paper reports it: ``tool_calls_per_turn`` (``<tool_call>`` openings per
  assistant turn, pooled over all turns; a well-behaved ToolWorld agent makes exactly one or
  answers), ``turns`` (assistant turns per episode), ``first_response_tokens`` (tokens the
  policy generated in its first turn), ``repeated_calls`` (tool calls per episode identical to
  an earlier call of the same episode: same name and arguments, or the same raw text when the
  call does not parse).

Each BFCL category named in ``evaluate.benchmarks`` (``bfcl_multi_turn_base`` …) evaluates every
student there too (``lopd.envs.bfcl``, one sample per entry): success (every turn passes, BFCL's
accuracy) and reward (turns passed), under ``benchmarks.<name>.<method>`` in ``evaluate.json``. A model
whose context cannot hold the category's prompts gets one line saying so instead of a score.

``humaneval`` in ``evaluate.benchmarks`` gives every student's pass@1 over all 164 HumanEval problems
(``evaluate.samples_per_task`` samples each, one attempt, the unbiased estimator), under
``benchmarks.humaneval.<method>``; without the code sandbox it says why instead of a score.

The test split and its report groups are ``env.name``'s (``lopd.envs.registry``). Beside the methods,
under ``chance`` (environments that have one: ToolWorld's ``lopd.envs.toolworld.chance``): the policies
that learn nothing on the same test tasks, and for each figure (success overall and per app group,
mean reward) the best of them. A method's figure means something only above that row.

Writes ``metrics/evaluate.json`` and the table ``metrics/evaluate.md``; logs both to MLflow.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from typing import Sequence

from lopd import layout
from lopd.config import Params
from lopd.io import atomic_path, write_json

log = logging.getLogger(__name__)

CALL_OPEN = "<tool_call>"


# ----------------------------------------------------------------------------- intervals


def wilson_interval(successes: int, n: int, ci: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion at confidence ``ci``; (0, 1) when n = 0."""
    from scipy.stats import norm

    if n == 0:
        return 0.0, 1.0
    z = float(norm.ppf(0.5 + ci / 2))
    phat = successes / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    # The bounds are exactly 0 / 1 at 0 / n successes; say so rather than leave a 1e-17 rounding residue.
    return (0.0 if successes == 0 else centre - half), (1.0 if successes == n else centre + half)


def t_interval(values: Sequence[float], ci: float, bounds: tuple[float, float] | None = None) -> tuple[float, float | None, float | None]:
    """(mean, low, high): Student-t interval of the mean, cut to ``bounds`` (the values' range) when given.

    No interval (None) below two values.
    """
    from scipy.stats import t

    n = len(values)
    if n == 0:
        return float("nan"), None, None
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(t.ppf(0.5 + ci / 2, n - 1)) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    if bounds is not None:
        lo, hi = max(bounds[0], lo), min(bounds[1], hi)
    return mean, lo, hi


# ----------------------------------------------------------------------------- behaviour


def first_response_tokens(action_mask: Sequence[int]) -> int:
    """Length of the first run of action tokens: what the policy generated in its first turn."""
    n, started = 0, False
    for m in action_mask:
        if m:
            n, started = n + 1, True
        elif started:
            break
    return n


def call_key(action: str) -> str | None:
    """Identity of the tool call in an action (None when the action makes no call)."""
    from lopd.envs.protocol import parse_action

    if CALL_OPEN not in action:
        return None
    call, _ = parse_action(action)
    if call is None:
        return "raw:" + action.strip()
    return call["name"] + " " + json.dumps(call["arguments"], sort_keys=True, separators=(",", ":"))


def repeated_calls(actions: Sequence[str]) -> int:
    """Tool calls identical to an earlier call of the same episode."""
    keys = [k for k in map(call_key, actions) if k is not None]
    return len(keys) - len(set(keys))


def behaviour(trajs: Sequence) -> dict[str, float]:
    """Tool calls per turn (pooled), and per-episode means of turns, first-response tokens, repeated calls."""
    turns = sum(len(t.actions) for t in trajs)
    n = max(1, len(trajs))
    return {
        "tool_calls_per_turn": sum(a.count(CALL_OPEN) for t in trajs for a in t.actions) / max(1, turns),
        "turns": turns / n,
        "first_response_tokens": sum(first_response_tokens(t.action_mask) for t in trajs) / n,
        "repeated_calls": sum(repeated_calls(t.actions) for t in trajs) / n,
    }


def per_task_reward(trajs: Sequence) -> dict[str, float]:
    by_task: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(float(t.reward))
    return {k: sum(v) / len(v) for k, v in by_task.items()}


def summarize(trajs: Sequence, ci: float, groups: dict[str, str] | None = None, names: Sequence[str] | None = None) -> dict:
    """Success (Wilson), mean reward (t over per-task means) and behaviour of one method's test episodes.

    ``groups``: task id -> report group (ToolWorld: pre-training or new app); success is also given per group,
    for each of ``names`` (default: the groups present, sorted).
    """
    wins = sum(bool(t.success) for t in trajs)
    lo, hi = wilson_interval(wins, len(trajs), ci)
    tasks = per_task_reward(trajs)
    mean_r, r_lo, r_hi = t_interval(list(tasks.values()), ci, bounds=(0.0, 1.0))  # rewards lie in [0, 1]
    by_family: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        by_family[t.family].append(bool(t.success))
    return {
        "success_rate": wins / max(1, len(trajs)),
        "success_ci": [lo, hi],
        "mean_reward": mean_r,
        "reward_ci": [r_lo, r_hi],
        **behaviour(trajs),
        "n_episodes": len(trajs),
        "n_tasks": len(tasks),
        "ci": ci,
        "success_by_family": {f: sum(v) / len(v) for f, v in sorted(by_family.items())},
        **({"success_by_group": _by_group(trajs, groups, names), "failed_checks_by_group": failed_checks(trajs, groups, names)} if groups else {}),
    }


def failed_checks(trajs: Sequence, groups: dict[str, str], names: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Where the errors are: per app group, the share of its *failed* episodes in which each
    checklist item failed (``entity``, ``value`` = the app's format, ``committed``, ``single``),
    and ``n_failed``. An episode can fail several items."""
    out: dict[str, dict[str, float]] = {}
    for g in names or sorted(set(groups.values())):
        failed = [t for t in trajs if groups[t.task_id] == g and not t.success and t.checks]
        items = sorted({k for t in failed for k in t.checks})
        out[g] = {"n_failed": float(len(failed)), **{k: sum(not t.checks.get(k, False) for t in failed) / len(failed) for k in items}}
    return out


def _by_group(trajs: Sequence, groups: dict[str, str], names: Sequence[str] | None = None) -> dict[str, float | None]:
    wins: dict[str, list[bool]] = {g: [] for g in names or sorted(set(groups.values()))}
    for t in trajs:
        wins[groups[t.task_id]].append(bool(t.success))
    return {g: (sum(v) / len(v) if v else None) for g, v in wins.items()}


def paired_diff(trajs: Sequence, reference: Sequence, ci: float) -> dict:
    """Per-task mean reward of ``trajs`` minus ``reference``'s on the same tasks: mean and t interval."""
    a, b = per_task_reward(trajs), per_task_reward(reference)
    diffs = [a[k] - b[k] for k in a if k in b]
    mean, lo, hi = t_interval(diffs, ci, bounds=(-1.0, 1.0))
    return {"mean": mean, "ci": [lo, hi]}


def markdown_table(results: dict, chance: dict | None = None, labels: dict[str, str] | None = None) -> str:
    """One row per method: success and reward with their intervals, then behaviour; the chance
    row (best policy that learns nothing, figure by figure) first. ``labels``: report group -> column
    header (the environment's ``groups``; default: the groups the results hold, by name)."""
    def iv(lo, hi) -> str:
        return "n/a" if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"

    ci = next(iter(results.values()))["ci"] if results else 0.95
    if labels is None:
        labels = {g: g for r in results.values() for g in r.get("success_by_group", {})}
    group_cols = "".join(f" {label} |" for label in labels.values())
    lines = [
        f"| method | success | {ci:.0%} CI |{group_cols} mean reward | {ci:.0%} CI | Δ reward vs vanilla | tool calls / turn | turns | first response tokens | repeated calls |",
        "|---|---|---|" + "---|" * len(labels) + "---|---|---|---|---|---|---|",
    ]

    def rate(v) -> str:
        return "—" if v is None else f"{v:.3f}"

    if chance is not None:
        groups = chance["success_by_group"]
        lines.append(f"| chance | {chance['success_rate']:.3f} | — |" + "".join(f" {rate(groups.get(g))} |" for g in labels)
                     + f" {chance['mean_reward']:.3f} | — | — | — | — | — | — |")
    for m, r in results.items():
        diff = r.get("reward_diff_vs_vanilla")
        d = "—" if diff is None else f"{diff['mean']:+.3f} {iv(*diff['ci'])}"
        lines.append(
            f"| {m} | {r['success_rate']:.3f} | {iv(*r['success_ci'])} |" + "".join(f" {rate(r.get('success_by_group', {}).get(g))} |" for g in labels)
            + f" {r['mean_reward']:.3f} | {iv(*r['reward_ci'])} | {d} "
            f"| {r['tool_calls_per_turn']:.2f} | {r['turns']:.2f} | {r['first_response_tokens']:.1f} | {r['repeated_calls']:.2f} |"
        )
    checks = [(m, g, c) for m, r in results.items() for g, c in r.get("failed_checks_by_group", {}).items()]
    if checks:
        items = sorted({k for _, _, c in checks for k in c if k != "n_failed"})
        lines += ["", "Where the errors are: of each method's failed episodes per app group, the share failing each checklist item.", "",
                  "| method | apps | failed episodes | " + " | ".join(items) + " |", "|---|---|---|" + "---|" * len(items)]
        for m, g, c in checks:
            lines.append(f"| {m} | {g} | {int(c['n_failed'])} | " + " | ".join(rate(c.get(k)) for k in items) + " |")
    if chance is not None:
        lines += ["", "chance: for each figure, the best of the policies that learn nothing (`lopd.envs.toolworld.chance`: "
                  "fixed guesses of the app's conventions, or rules that set them from the check's errors), on the same test tasks: "
                  + ", ".join(f"{f} {n}" for f, n in chance["best"].items()) + "."]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- BFCL multi-turn


def bfcl_prompt_tokens(tokenizer, tasks: Sequence, make_env) -> list[int]:
    """Tokens of each task's first prompt (system + tools + first user turn) in ``tokenizer``'s chat template."""
    from lopd.policy.chat import encode, render_prompt

    return [len(encode(tokenizer, render_prompt(tokenizer, make_env(t).initial_observation()))) for t in tasks]


def evaluate_bfcl(p: Params, benchmark: str, model, tokenizer, seed: int, warned: set[str] | None = None) -> dict:
    """One student on one BFCL category: success (every turn passes) and reward (turns passed), or why it cannot run.

    A model whose context cannot hold the category's prompts gets ``status = "skipped_context"`` and one
    line naming the tokens needed and the model's limit: not a crash, not a silent zero. ``warned`` holds
    the lines already logged in this run (one line per benchmark and context, not one per student).
    """
    from lopd.envs.registry import get_environment
    from lopd.policy.engine import make_engine

    env = get_environment(p.model_copy(update={"bfcl": p.bfcl.model_copy(update={"category": benchmark})}), "bfcl_multi_turn")
    tasks = env.tasks("test", p.evaluate.bfcl_n_tasks)
    lengths = sorted(bfcl_prompt_tokens(tokenizer, tasks, env.make_env))
    context = getattr(model.config, "max_position_embeddings", None)
    info = {"n_tasks": len(tasks), "prompt_tokens_median": lengths[len(lengths) // 2], "prompt_tokens_max": lengths[-1], "context": context}
    if context is not None and lengths[-1] + p.rollout.max_new_tokens > context:
        line = (f"{benchmark}: not evaluated: its first prompts need up to {lengths[-1]} tokens (median {info['prompt_tokens_median']}) "
                f"plus rollout.max_new_tokens = {p.rollout.max_new_tokens}, over this model's context of {context} tokens "
                "(config.max_position_embeddings); evaluate a checkpoint with a longer context (model.path)")
        if warned is None or line not in warned:
            log.warning(line)
        if warned is not None:
            warned.add(line)
        return {**info, "status": "skipped_context", "reason": line}
    trajs = make_engine(p, model, tokenizer, make_env=env.make_env).run(tasks, 1, seed=seed, id_prefix=benchmark)
    succ, rew = [float(t.success) for t in trajs], [float(t.reward) for t in trajs]
    s_mean, s_lo, s_hi = t_interval(succ, p.evaluate.ci, bounds=(0.0, 1.0))
    r_mean, r_lo, r_hi = t_interval(rew, p.evaluate.ci, bounds=(0.0, 1.0))
    return {**info, "status": "ok", "success_rate": s_mean, "success_ci": [s_lo, s_hi], "mean_reward": r_mean, "reward_ci": [r_lo, r_hi],
            "truncated": sum(t.truncated for t in trajs)}


def bfcl_table(benchmarks: dict) -> str:
    """One row per (benchmark, method): BFCL accuracy and turn reward, or the reason it was not run."""
    lines = ["", "BFCL multi-turn (success = every turn passes, BFCL's accuracy; reward = share of turns passed).", "",
             "| benchmark | method | success | CI | reward | prompt tokens (median / max) | context | note |", "|---|---|---|---|---|---|---|---|"]
    for name, by_method in benchmarks.items():
        for m, r in by_method.items():
            ok = r["status"] == "ok"
            cell = (lambda v: f"{v:.3f}") if ok else (lambda v: "—")
            ci = f"[{r['success_ci'][0]:.3f}, {r['success_ci'][1]:.3f}]" if ok and r["success_ci"][0] is not None else "—"
            lines.append(f"| {name} | {m} | {cell(r.get('success_rate'))} | {ci} | {cell(r.get('mean_reward'))} "
                         f"| {r['prompt_tokens_median']} / {r['prompt_tokens_max']} | {r['context']} | {'' if ok else 'not run: context'} |")
    reasons = dict.fromkeys(r["reason"] for by in benchmarks.values() for r in by.values() if r["status"] != "ok")
    return "\n".join(lines + [""] + [f"- {line}" for line in reasons]) + "\n"


# ----------------------------------------------------------------------------- the stage


def benchmark_tables(benchmarks: dict) -> str:
    """The tables of the extra benchmarks: BFCL's categories together, then HumanEval."""
    from lopd.stages.humaneval import humaneval_table

    bfcl = {b: r for b, r in benchmarks.items() if b != "humaneval"}
    return (bfcl_table(bfcl) if bfcl else "") + (humaneval_table(benchmarks["humaneval"]) if "humaneval" in benchmarks else "")


def evaluated_methods(p: Params) -> list[str]:
    """Vanilla first (the reference), then ``distill.methods`` in order."""
    return list(dict.fromkeys(["vanilla", *p.distill.methods]))


def run(p: Params) -> dict:
    """Roll out every method's student on the test split; write ``metrics/evaluate.json`` and ``.md``."""
    import mlflow

    from lopd.ops.tracking import stage_run
    from lopd.policy.engine import environment, make_engine, split_tasks
    from lopd.policy.modeling import load_policy
    from lopd.stages.humaneval import evaluate_humaneval
    from lopd.train.onpolicy import derive_seed

    methods = evaluated_methods(p)
    paths = {m: layout.student_dir(p, m) for m in methods}
    missing = [f"{m} ({paths[m]})" for m in methods if not (paths[m] / "config.json").exists()]
    if missing:
        raise FileNotFoundError(f"evaluate: no student for {', '.join(missing)}: run `lopd distill` for those methods "
                                "or drop them from distill.methods")
    env = environment(p)
    tasks = split_tasks(p, "test", p.evaluate.n_tasks)
    groups, names = env.group_of(tasks), list(env.groups)
    k, ci = p.evaluate.samples_per_task, p.evaluate.ci
    results, trajs_by_method = {}, {}
    extra = [b for b in p.evaluate.benchmarks if b != "toolworld"]
    benchmarks: dict[str, dict] = {b: {} for b in extra}
    warned: set[str] = set()
    with stage_run(p, "evaluate"):
        for m in methods:
            model, tok = load_policy(paths[m], p.model.dtype)
            trajs = make_engine(p, model, tok).run(tasks, k, seed=derive_seed(p.seed, "test"), id_prefix=f"test-{m}")
            trajs_by_method[m], results[m] = trajs, summarize(trajs, ci, groups, names)
            if m != "vanilla":
                results[m]["reward_diff_vs_vanilla"] = paired_diff(trajs, trajs_by_method["vanilla"], ci)
            log.info("evaluate %s: success %.3f, reward %.3f", m, results[m]["success_rate"], results[m]["mean_reward"])
            for b in extra:  # the same student on each requested benchmark
                run_benchmark = evaluate_humaneval if b == "humaneval" else evaluate_bfcl
                benchmarks[b][m] = run_benchmark(p, b, model, tok, seed=derive_seed(p.seed, b), warned=warned)
            del model
        chance = env.chance(tasks, groups) if env.chance else None  # the same tasks, no learning
        if chance is not None:
            log.info("evaluate chance: success %.3f%s", chance["success_rate"],
                     "".join(f", {env.groups[g]} {v}" for g, v in chance["success_by_group"].items()))
        table = markdown_table(results, chance, dict(env.groups)) + (benchmark_tables(benchmarks) if extra else "")
        if chance is not None:
            results["chance"] = chance
        if extra:  # under each benchmark's name; the top-level keys stay the methods' results on env.name's test split
            results["benchmarks"] = benchmarks
            mlflow.log_metrics({f"{b}_{m}_{key}": float(r[key]) for b, by in benchmarks.items() for m, r in by.items()
                                for key in ("success_rate", "mean_reward", "pass_at_1") if r["status"] == "ok" and key in r})
        write_json(layout.metrics_path(p, "evaluate"), results)
        with atomic_path(layout.metrics_path(p, "evaluate").with_suffix(".md")) as tmp:
            tmp.write_text(table)
        for m, r in results.items():
            if m == "benchmarks":
                continue
            mlflow.log_metrics({f"{m}_{key}": float(v) for key, v in r.items() if isinstance(v, (int, float)) and v == v})
            mlflow.log_metrics({f"{m}_success_{g}": float(v) for g, v in r.get("success_by_group", {}).items() if v is not None})
        mlflow.log_text(table, "evaluate.md")
    return results
