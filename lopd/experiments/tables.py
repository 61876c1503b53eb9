"""What a sweep measures and how it reports it: the child metrics, mean ± std and t-intervals, tables.

Pure functions over ``{method: {seed: {metric: value}}}``; :mod:`lopd.experiments.sweep` runs the
seeds and :mod:`lopd.experiments.sweep_report` rebuilds the report from their files.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from typing import Mapping, Sequence

# child metric name -> (stage whose result holds it, key in that stage's per-method result)
METRICS: dict[str, tuple[str, str]] = {
    "final_dev_reward": ("distill", "final_dev_reward"),
    "final_dev_success": ("distill", "final_dev_success"),
    "rollouts": ("distill", "rollouts"),
    "test_success_rate": ("evaluate", "success_rate"),
    "test_mean_reward": ("evaluate", "mean_reward"),
    "test_success_pretrain": ("evaluate", "success_by_group.pretrain"),  # apps the base was pre-trained on
    "test_success_new": ("evaluate", "success_by_group.new"),
    "test_tool_calls_per_turn": ("evaluate", "tool_calls_per_turn"),
    "test_turns": ("evaluate", "turns"),
    "test_first_response_tokens": ("evaluate", "first_response_tokens"),
    "test_repeated_calls": ("evaluate", "repeated_calls"),
}


CHANCE = "chance"  # the row of the best policy that learns nothing (lopd.stages.evaluate.chance_row)


def seed_rows(methods: Sequence[str], distill: Mapping, evaluate: Mapping) -> dict[str, dict[str, float]]:
    """One seed's rows: the chance row (when ``evaluate`` has one), then each method's :func:`child_metrics`."""
    rows = [CHANCE] if CHANCE in evaluate else []
    return {m: child_metrics(m, distill, evaluate) for m in [*rows, *methods]}


def child_metrics(method: str, distill: Mapping, evaluate: Mapping) -> dict[str, float]:
    """A method's :data:`METRICS` from one seed's ``distill`` and ``evaluate`` results."""
    source = {"distill": distill.get(method, {}), "evaluate": evaluate.get(method, {})}
    out = {}
    for name, (stage, key) in METRICS.items():
        v = source[stage]
        for part in key.split("."):  # "success_by_group.new": a nested value
            v = v.get(part) if isinstance(v, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
            out[name] = float(v)
    return out


def aggregate(values: Sequence[float], ci: float) -> dict:
    """n, mean, sample std (n − 1) and the Student-t interval of the mean at confidence ``ci``.

    std and the interval are None below two values.
    """
    from lopd.stages.evaluate import t_interval

    vals = [float(v) for v in values]
    mean, lo, hi = t_interval(vals, ci)
    return {"n": len(vals), "mean": mean, "std": statistics.stdev(vals) if len(vals) > 1 else None, "ci_low": lo, "ci_high": hi}


def aggregate_table(per_seed: Mapping[str, Mapping[int, Mapping[str, float]]], ci: float) -> dict[str, dict[str, dict]]:
    """``{method: {seed: {metric: value}}}`` → ``{method: {metric: aggregate(...)}}`` over the seeds."""
    out: dict[str, dict[str, dict]] = {}
    for method, by_seed in per_seed.items():
        out[method] = {}
        for metric in METRICS:
            vals = [m[metric] for m in by_seed.values() if metric in m and m[metric] is not None]
            if vals:
                out[method][metric] = {**aggregate(vals, ci), "values": vals}
    return out


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def markdown_table(agg: Mapping[str, Mapping[str, dict]], seeds: Sequence[int], ci: float) -> str:
    """One row per method, one column per metric: ``mean ± std [ci_low, ci_high]``."""
    metrics = [m for m in METRICS if any(m in row for row in agg.values())]
    lines = [
        f"Mean ± sample std over seeds {', '.join(map(str, seeds))} (n = {len(seeds)}); "
        f"[{ci:.0%} Student-t interval of the mean].",
        "",
        "| method | " + " | ".join(metrics) + " |",
        "|---|" + "---|" * len(metrics),
    ]
    for method, row in agg.items():
        cells = []
        for m in metrics:
            a = row.get(m)
            cells.append("—" if a is None else f"{_fmt(a['mean'])} ± {_fmt(a['std'])} [{_fmt(a['ci_low'])}, {_fmt(a['ci_high'])}]")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("method", "metric", "n", "mean", "std", "ci_low", "ci_high")


def csv_table(agg: Mapping[str, Mapping[str, dict]], per_seed: Mapping[str, Mapping[int, Mapping[str, float]]], seeds: Sequence[int]) -> str:
    """Long format: one row per (method, metric) with the aggregate and each seed's value (``seed<k>``)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*CSV_FIELDS, *(f"seed{k}" for k in seeds)])
    for method, row in agg.items():
        for metric, a in row.items():
            vals = [per_seed[method].get(k, {}).get(metric) for k in seeds]
            w.writerow([method, metric, a["n"], *("" if a[f] is None else repr(float(a[f])) for f in CSV_FIELDS[3:]),
                        *("" if v is None else repr(float(v)) for v in vals)])
    return buf.getvalue()
