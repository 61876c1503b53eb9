"""A sweep's markdown: the headline table (with which policy gives each chance figure), efficiency per
seed (degenerate seeds flagged), the interval comparisons and the ablation rows.

Pure functions over the record :func:`lopd.experiments.sweep_report.build` writes to ``metrics/<name>.json``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from lopd.experiments.tables import METRICS

EFFICIENCY_KEYS = ("rollouts_to_grpo_final_frac", "wall_to_grpo_final_ratio")
FINAL_WINDOW = 10  # "at the end" = the last 10 steps of each seed (one step's Δ is noisy)


def intervals_separate(a: Mapping, b: Mapping) -> bool | None:
    """Whether two aggregates' t-intervals are disjoint (None when either has no interval)."""
    if None in (a.get("ci_low"), a.get("ci_high"), b.get("ci_low"), b.get("ci_high")):
        return None
    return a["ci_low"] > b["ci_high"] or b["ci_low"] > a["ci_high"]


def _f(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _cell(a: Mapping | None) -> str:
    return "—" if not a else f"{_f(a['mean'])} ± {_f(a['std'])} [{_f(a['ci_low'])}, {_f(a['ci_high'])}]"


HEADLINE = (("test_success_rate", "test success"), ("test_mean_reward", "test reward"), ("test_success_pretrain", "pre-training apps"),
            ("test_success_new", "new apps"), ("final_dev_success", "final dev success"), ("rollouts", "generations"))


def headline_table(sweep: Mapping) -> str:
    """The comparison at a glance: ``mean ± std [CI]`` of the numbers that decide it, then which named
    policy gives each figure of the chance row."""
    agg, ci = sweep["aggregate"], sweep["ci"]
    lines = [f"## Headline: mean ± std [{ci:.0%} t-interval] over seeds {', '.join(map(str, sweep['seeds']))}", "",
             "| method | " + " | ".join(t for _, t in HEADLINE) + " |", "|---|" + "---|" * len(HEADLINE)]
    for m, row in agg.items():
        cells = [(f"{row[k]['mean']:.0f}" if k == "rollouts" and k in row else _cell(row.get(k))) for k, _ in HEADLINE]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += chance_lines(sweep.get("chance"))
    return "\n".join(lines) + "\n\n## Every metric\n\n"


def figure_label(figure: str) -> str:
    """A chance record's figure (``success_by_group.new``) → its headline column (``new apps``), else itself."""
    metric = next((name for name, (stage, key) in METRICS.items() if stage == "evaluate" and key == figure), None)
    return dict(HEADLINE).get(metric, figure)


def chance_lines(chance: Mapping | None) -> list[str]:
    """Which of the policies that learn nothing gives each chance figure (one line; per seed when the seeds differ)."""
    if not chance:
        return []

    def names(best: Mapping) -> str:
        return ", ".join(f"{figure_label(f)} `{n}`" for f, n in best.items())

    head = f"chance: for each figure, the best of {len(chance['policies'])} policies that learn nothing"
    if chance.get("best") is not None:
        return ["", f"{head}: {names(chance['best'])}."]
    return ["", f"{head}, per seed:"] + [f"- seed {k}: {names(v['best'])}" for k, v in chance["per_seed"].items()]


def report_markdown(sweep: Mapping, eff: Mapping, dyn: Mapping, ablations: Sequence[Mapping]) -> str:
    agg, ci = sweep["aggregate"], sweep["ci"]
    degenerate = [int(k) for k in eff.get("degenerate", [])]
    lines = ["", "## Efficiency (LOPD against GRPO, per seed)", "",
             (f"Target: {eff['target']}. Never reached: {eff['not_reached'] or 'none'} (counted as 1.0 and flagged). "
              f"Degenerate: {degenerate or 'none'} (GRPO ends no higher than the base starts, so LOPD reaches it at 0 generations)."), "",
             "| number | mean ± std [CI] | per seed | mean over the seeds that are not degenerate |", "|---|---|---|---|"]
    for key in EFFICIENCY_KEYS:
        a = eff.get(key)
        per = ", ".join(f"seed{k}: {_f(v)}" + (" (degenerate)" if int(k) in degenerate else "")
                        for k, v in (a or {}).get("per_seed", {}).items())
        other = (a or {}).get("other_seeds")
        rest = "— (no seed is degenerate)" if not degenerate else (
            f"{_cell(other)} (seeds {', '.join(map(str, other['seeds']))})" if other else "n/a (every seed is)")
        lines.append(f"| {key} | {_cell(a)} | {per} | {rest} |")
    lop = agg.get("lopd", {}).get("test_success_rate")
    if lop:
        lines += ["", f"## Do the {ci:.0%} intervals of test success separate?", ""]
        for m in ("chance", "grpo", "vanilla", "opsd", "sft"):
            other = agg.get(m, {}).get("test_success_rate")
            if other:
                sep = intervals_separate(lop, other)
                word = "n/a" if sep is None else ("yes" if sep else "no (they overlap)")
                lines.append(f"- lopd {_f(lop['mean'])} vs {m} {_f(other['mean'])}: {word}")
    all_seeds = sorted(int(k) for k in sweep["seeds"])

    def seeds_note(ab) -> str:
        seeds = ab.get("seeds") or all_seeds
        return "" if seeds == all_seeds else f", seeds {', '.join(map(str, seeds))}"

    rows = [("lopd (main)", sweep["aggregate"].get("lopd", {}), dyn)] + [
        (f"lopd · {ab['name']} ({', '.join(f'{k}={v}' for k, v in ab['changed'].items()) or 'same params'}{seeds_note(ab)})",
         ab["aggregate"].get("lopd", {}), ab["dynamics_final"]) for ab in ablations]
    if ablations:
        lines += ["", "## Ablations (LOPD; a row over fewer seeds has the main run over the same seeds beside it)", "",
                  f"| run | test success | test reward | final dev success | Δ, last {FINAL_WINDOW} steps | KL, last {FINAL_WINDOW} steps | β, last {FINAL_WINDOW} steps |",
                  "|---|---|---|---|---|---|---|"]
        for label, a, d in rows:
            lines.append(f"| {label} | {_cell(a.get('test_success_rate'))} | {_cell(a.get('test_mean_reward'))} | "
                         f"{_cell(a.get('final_dev_success'))} | {_cell(d.get('delta'))} | {_cell(d.get('kl'))} | {_cell(d.get('beta'))} |")
    return "\n".join(lines) + "\n"


