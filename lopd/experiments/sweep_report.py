"""A sweep's report: efficiency per seed, curves as mean ± std over seeds, ablation rows.

It reads only what sweeps wrote: ``metrics/<name>.json`` (seeds, methods, aggregate, MLflow parent
run) and each seed's ``runs/<name>/seed<k>/metrics/distill.json`` (dev curves and per-step
history). It adds to the main sweep's ``metrics/sweep.json``:

- ``efficiency``: ``rollouts_to_grpo_final_frac`` and ``wall_to_grpo_final_ratio`` (see
  :func:`lopd.stages.distill.efficiency`) as ``{n, mean, std, ci_low, ci_high, per_seed}``, with the
  seeds in which LOPD never reached GRPO's final dev success under ``not_reached``;
- ``ablations``: each ablation sweep's name, the params it changed, its aggregate, and LOPD's
  final Δ, KL and β per seed;

writes ``metrics/plots/*.png`` and appends the ablation rows, the efficiency and the interval
comparisons to ``metrics/sweep.md``. Everything is logged to the main sweep's MLflow parent run.
``lopd sweep-report --ablation margin0 --ablation frozen ...`` rebuilds it at any time;
``lopd sweep`` builds it (without ablations) when it ends.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from lopd.config import Params
from lopd.experiments.sweep import now_ms
from lopd.experiments.tables import aggregate, aggregate_table, csv_table, markdown_table, seed_rows
from lopd.io import atomic_path, read_json, write_json
from lopd.stages.distill import efficiency, plot_decisions

log = logging.getLogger(__name__)

EFFICIENCY_KEYS = ("rollouts_to_grpo_final_frac", "wall_to_grpo_final_ratio")
DYNAMICS = (("beta", "β (dual variable)"), ("delta", "Δ: trajectory margin (nats)"), ("kl", "KL(π_S ‖ π_T) per token"),
            ("margin_violation", "margin violation m − Δ"))
COLORS = {"lopd": "C0", "opsd": "C1", "grpo": "C2", "sft": "C3", "vanilla": "gray"}
IGNORED_PARAM_PREFIXES = ("paths.", "tracking.", "distill.methods", "sweep.")
FINAL_WINDOW = 10  # "at the end" = the last 10 steps of each seed (one step's Δ is noisy)


# ----------------------------------------------------------------------------- reading sweeps


def sweep_dir(sweep_json: Path, sweep: Mapping) -> Path:
    """``runs/<name>`` of a sweep whose tables are ``<root>/metrics/<name>.json``."""
    return sweep_json.parent.parent / "runs" / sweep.get("name", "sweep")


def seed_details(sweep_json: Path) -> tuple[dict, dict[int, dict]]:
    """The sweep's record and, per seed, ``details`` of its ``metrics/distill.json`` (method → curve, history, ...).

    The record's ``per_seed`` and ``aggregate`` are recomputed from the seeds' ``distill.json``
    and ``evaluate.json`` with :data:`lopd.experiments.tables.METRICS`, so a metric added there reaches
    sweeps that ran before it.
    """
    sweep = read_json(sweep_json)
    out, per_seed = {}, {}
    seed_dirs = sweep.get("seed_dirs", {})  # seeds joined from another sweep (``join``) live under its runs/<name>
    for k in sweep["seeds"]:
        seed_root = sweep_json.parent.parent / seed_dirs[str(k)] if str(k) in seed_dirs else sweep_dir(sweep_json, sweep) / f"seed{k}"
        metrics = seed_root / "metrics"
        for name in ("distill.json", "evaluate.json"):
            if not (metrics / name).exists():
                raise FileNotFoundError(f"sweep report: {metrics / name} is missing; the sweep {sweep_json} did not finish seed {k}")
        distilled, evaluated = read_json(metrics / "distill.json"), read_json(metrics / "evaluate.json")
        out[int(k)] = distilled["details"]
        for m, metrics in seed_rows(sweep["methods"], distilled, evaluated).items():
            per_seed.setdefault(m, {})[int(k)] = metrics
    sweep["per_seed"] = {m: {str(k): v for k, v in by.items()} for m, by in per_seed.items()}
    sweep["aggregate"] = aggregate_table(per_seed, sweep["ci"])
    return sweep, out


# ----------------------------------------------------------------------------- numbers


def efficiency_summary(details: Mapping[int, Mapping], ci: float) -> dict:
    """Per seed :func:`lopd.stages.distill.efficiency` → ``{key: {n, mean, std, ci_low, ci_high, per_seed}}`` + ``not_reached``."""
    per_seed = {k: efficiency(d) for k, d in details.items()}
    out: dict = {"target": "GRPO's final dev success (same seed)", "not_reached": [k for k, e in per_seed.items() if e["grpo_final_reached"] is False]}
    for key in EFFICIENCY_KEYS:
        vals = {k: e[key] for k, e in per_seed.items() if e[key] is not None}
        if vals:
            out[key] = {**aggregate(list(vals.values()), ci), "per_seed": {str(k): v for k, v in vals.items()}}
    out["per_seed"] = {str(k): e for k, e in per_seed.items()}
    return out


def dynamics_final(details: Mapping[int, Mapping], ci: float, method: str = "lopd") -> dict:
    """β, Δ, KL and margin violation of ``method`` at the end, over seeds: each seed's mean over its last
    :data:`FINAL_WINDOW` steps (``values``, aggregated) and its lowest step there (``min_per_seed``)."""
    out = {}
    for key, _ in DYNAMICS:
        vals, lows = [], []
        for d in details.values():
            tail = [h.get(key) for h in (d.get(method, {}).get("history") or [])[-FINAL_WINDOW:]]
            tail = [v for v in tail if v is not None]
            if tail:
                vals.append(sum(tail) / len(tail))
                lows.append(min(tail))
        if vals:
            out[key] = {**aggregate(vals, ci), "values": vals, "min_per_seed": lows}
    return out


def stacked(details: Mapping[int, Mapping], method: str, series: str, x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x_P, y_SP)``: ``series`` (``curve`` or ``history``) of ``method`` over seeds, aligned by index.

    Every seed evaluates at the same steps, so point i is the same step in each seed; x is the
    mean over seeds (identical for generations, the mean wall-clock for seconds).
    """
    rows = [d[method][series] for d in details.values() if d.get(method, {}).get(series)]
    n = min(len(r) for r in rows)
    xs = np.array([[pt[x] for pt in r[:n]] for r in rows], dtype=float)
    ys = np.array([[np.nan if pt.get(y) is None else pt[y] for pt in r[:n]] for r in rows], dtype=float)
    return xs.mean(axis=0), ys


def intervals_separate(a: Mapping, b: Mapping) -> bool | None:
    """Whether two aggregates' t-intervals are disjoint (None when either has no interval)."""
    if None in (a.get("ci_low"), a.get("ci_high"), b.get("ci_low"), b.get("ci_high")):
        return None
    return a["ci_low"] > b["ci_high"] or b["ci_low"] > a["ci_high"]


def changed_params(main: Mapping[str, str], other: Mapping[str, str]) -> dict[str, str]:
    """The params an ablation sweep changed relative to the main one (MLflow's logged params).

    Only keys both runs logged: a key one of them lacks was added or renamed by the code between
    the two runs (e.g. ``env.families`` → ``toolworld.families``), not set by the ablation.
    """
    return {k: v for k, v in sorted(other.items())
            if k in main and main[k] != v and not k.startswith(IGNORED_PARAM_PREFIXES)}


# ----------------------------------------------------------------------------- plots


def _band(ax, x, ys, label, color, marker="o"):
    mean, std = np.nanmean(ys, axis=0), np.nanstd(ys, axis=0, ddof=1) if len(ys) > 1 else np.zeros(ys.shape[1])
    ax.plot(x, mean, marker=marker, ms=3, label=label, color=color)
    ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=color)


def plot_dev_curves(details: Mapping[int, Mapping], methods: Sequence[str], x: str, path: Path) -> Path:
    """Dev success and reward against ``x`` (``rollouts_cum`` or ``train_wall_s``), mean ± 1 std over seeds."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, y in zip(axes, ("dev_success", "dev_reward")):
        for m in methods:
            if m == "vanilla":
                base = [d["vanilla"]["curve"][0][y] for d in details.values() if "vanilla" in d]
                if base:
                    ax.axhline(float(np.mean(base)), ls="--", c=COLORS["vanilla"], label="vanilla (base)")
                continue
            xs, ys = stacked(details, m, "curve", x, y)
            _band(ax, xs, ys, m, COLORS.get(m))
        xlabel = "generations (cumulative rollouts)" if x == "rollouts_cum" else "training wall-clock (s, mean over seeds)"
        ax.set(xlabel=xlabel, ylabel=y.replace("_", " "), title=f"{y.replace('_', ' ')}: mean ± 1 std over {len(details)} seeds")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def plot_dynamics(runs: Mapping[str, Mapping[int, Mapping]], path: Path, keys: Sequence[str] | None = None,
                  method_of: Mapping[str, str] | None = None) -> Path:
    """β, Δ, KL and margin violation over steps, one line (mean ± 1 std over seeds) per run label.

    ``method_of``: the method each label plots (default lopd), e.g. OPSD's Δ and KL beside LOPD's.
    """
    import matplotlib.pyplot as plt

    panels = [(k, t) for k, t in DYNAMICS if keys is None or k in keys]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (key, title) in zip(np.atleast_1d(axes), panels):
        for i, (label, details) in enumerate(runs.items()):
            method = (method_of or {}).get(label, "lopd")
            if not any(key in (d.get(method, {}).get("history") or [{}])[0] for d in details.values()):
                continue  # OPSD has no β or margin
            xs, ys = stacked(details, method, "history", "step", key)
            _band(ax, xs, ys, label, f"C{i}", marker=".")
        ax.axhline(0.0, c="k", lw=0.5)
        ax.set(xlabel="step", title=title)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- markdown


def _f(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _cell(a: Mapping | None) -> str:
    return "—" if not a else f"{_f(a['mean'])} ± {_f(a['std'])} [{_f(a['ci_low'])}, {_f(a['ci_high'])}]"


HEADLINE = (("test_success_rate", "test success"), ("test_mean_reward", "test reward"), ("test_success_pretrain", "pre-training apps"),
            ("test_success_new", "new apps"), ("final_dev_success", "final dev success"), ("rollouts", "generations"))


def headline_table(sweep: Mapping) -> str:
    """The comparison at a glance: ``mean ± std [CI]`` of the numbers that decide it."""
    agg, ci = sweep["aggregate"], sweep["ci"]
    lines = [f"## Headline: mean ± std [{ci:.0%} t-interval] over seeds {', '.join(map(str, sweep['seeds']))}", "",
             "| method | " + " | ".join(t for _, t in HEADLINE) + " |", "|---|" + "---|" * len(HEADLINE)]
    for m, row in agg.items():
        cells = [(f"{row[k]['mean']:.0f}" if k == "rollouts" and k in row else _cell(row.get(k))) for k, _ in HEADLINE]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n## Every metric\n\n"


def report_markdown(sweep: Mapping, eff: Mapping, dyn: Mapping, ablations: Sequence[Mapping]) -> str:
    agg, ci = sweep["aggregate"], sweep["ci"]
    lines = ["", "## Efficiency (LOPD against GRPO, per seed)", "",
             f"Target: {eff['target']}. Never reached: {eff['not_reached'] or 'none'} (counted as 1.0 and flagged).", "",
             "| number | mean ± std [CI] | per seed |", "|---|---|---|"]
    for key in EFFICIENCY_KEYS:
        a = eff.get(key)
        per = ", ".join(f"seed{k}: {_f(v)}" for k, v in (a or {}).get("per_seed", {}).items())
        lines.append(f"| {key} | {_cell(a)} | {per} |")
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


# ----------------------------------------------------------------------------- the report


def _mlflow_params(uri: str, sweep: Mapping, sweep_json: Path | None = None) -> dict[str, str]:
    """The params a sweep's parent run logged: in the main store, else in the store under the sweep's own root
    (an ablation run with another ``paths.root`` logs there)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uris = [uri] + ([f"sqlite:///{sweep_json.parent.parent.resolve() / 'mlruns' / 'mlflow.db'}"] if sweep_json else [])
    for u in dict.fromkeys(uris):
        try:
            return dict(MlflowClient(u).get_run(sweep["parent_run_id"]).data.params)
        except MlflowException:
            continue
    raise FileNotFoundError(f"sweep report: the MLflow parent run {sweep['parent_run_id']} of {sweep_json} is in none of {', '.join(uris)}")


def join(p: Params, name: str, others: Sequence[str]) -> dict:
    """Fold the seeds of the sweeps ``others`` into ``metrics/<name>.json``: one sweep's seeds run as
    several processes or on several machines (``lopd sweep --seeds 3,4 --name sweep-b``).

    Each must have run the same methods with the same params (MLflow's logged params, seeds aside)
    and seeds the main sweep does not have; its seeds keep their folders (``runs/<other>/seed<k>``)
    and its parent run is recorded under ``joined``. The file is rewritten atomically, after every check.
    """
    from lopd.ops.tracking import tracking_uri

    root, uri = p.root(), tracking_uri(p)
    sweep_json = root / "metrics" / f"{name}.json"
    if not sweep_json.exists():
        raise FileNotFoundError(f"sweep report: no {sweep_json}; run `lopd sweep` first")
    sweep = read_json(sweep_json)
    main_params = _mlflow_params(uri, sweep)
    for other in others:
        path = _ablation_path(root, other)
        if not path.exists():
            raise FileNotFoundError(f"sweep report: --join {other}: no {path}; run `lopd sweep --name {other}` first")
        rec = read_json(path)
        dirs = {str(k): str((sweep_dir(path, rec) / f"seed{k}").relative_to(root)) for k in rec["seeds"]}
        if all(sweep.get("seed_dirs", {}).get(k) == d for k, d in dirs.items()):
            continue  # joined already (a report run again)
        if sorted(rec["methods"]) != sorted(sweep["methods"]):
            raise ValueError(f"sweep report: --join {other} ran methods {rec['methods']}, {name} {sweep['methods']}; join sweeps of the same methods")
        clash = sorted(set(map(int, rec["seeds"])) & set(map(int, sweep["seeds"])))
        if clash:
            raise ValueError(f"sweep report: --join {other} ran seeds {clash} that {name} already has")
        changed = changed_params(main_params, _mlflow_params(uri, rec, path))
        if changed:
            raise ValueError(f"sweep report: --join {other} ran other params ({', '.join(f'{k}={v}' for k, v in changed.items())}); "
                             "an ablation goes in with --ablation")
        sweep.setdefault("seed_dirs", {}).update(dirs)
        sweep["seeds"] = sorted(set(map(int, sweep["seeds"])) | set(map(int, rec["seeds"])))
        sweep.setdefault("joined", []).append({"name": rec["name"], "seeds": rec["seeds"], "parent_run_id": rec["parent_run_id"]})
    write_json(sweep_json, sweep)
    return sweep


def _ablation_path(root: Path, ref: str) -> Path:
    """``margin0`` → ``<root>/metrics/margin0.json``; a path to a sweep's json is taken as it is."""
    return Path(ref) if ref.endswith(".json") else root / "metrics" / f"{ref}.json"


def build(p: Params, ablations: Sequence[str] = (), name: str = "sweep", log_to_mlflow: bool = True) -> dict:
    """Add ``efficiency`` (and ``ablations``) to ``<paths.root>/metrics/<name>.json``; write plots and markdown; log them.

    ``ablations``: sweep names under the same root (``margin0``) or paths to their ``.json``.
    """
    import matplotlib

    from lopd.ops.tracking import tracking_uri

    matplotlib.use("Agg")
    root, uri = p.root(), tracking_uri(p)
    sweep_json = root / "metrics" / f"{name}.json"
    if not sweep_json.exists():
        raise FileNotFoundError(f"sweep report: no {sweep_json}; run `lopd sweep` first")
    sweep, details = seed_details(sweep_json)
    sweep.pop("tracking_uri", None)  # written by older sweeps: a machine's absolute path has no place in metrics/
    ci = sweep["ci"]
    eff = efficiency_summary(details, ci) if {"lopd", "grpo"} <= set(sweep["methods"]) else {"target": "n/a (needs lopd and grpo)", "not_reached": []}
    dyn = dynamics_final(details, ci) if "lopd" in sweep["methods"] else {}
    main_params = _mlflow_params(uri, sweep) if ablations else {}

    plots_dir = root / "metrics" / "plots" / ("" if name == "sweep" else name)  # an ablation's own plots never replace the main ones
    plots = [plot_dev_curves(details, sweep["methods"], "rollouts_cum", plots_dir / "dev_vs_rollouts.png"),
             plot_dev_curves(details, sweep["methods"], "train_wall_s", plots_dir / "dev_vs_wall.png")]
    if "lopd" in sweep["methods"]:
        plots.append(plot_dynamics({"lopd": details}, plots_dir / "lopd_dynamics.png"))
    if {"lopd", "opsd"} <= set(sweep["methods"]):  # the teacher's signal: latent privilege against text privilege
        plots.append(plot_dynamics({"lopd (latents)": details, "opsd (text)": details}, plots_dir / "teacher_signal.png",
                                   keys=("delta", "kl"), method_of={"opsd (text)": "opsd"}))
    plots += [x for x in (plot_decisions(details, plots_dir / "decisions.png"),) if x is not None]  # None: no decisions recorded

    abl_records, abl_details = [], {}
    per_seed_main = {m: {int(k): v for k, v in by.items()} for m, by in sweep["per_seed"].items()}
    for ref in ablations:
        path = _ablation_path(root, ref)
        ab, ab_details = seed_details(path)
        if not set(ab["seeds"]) <= set(sweep["seeds"]):
            raise ValueError(f"sweep report: ablation {path} ran seeds {ab['seeds']}, the main sweep {sweep['seeds']}; "
                             "use the main sweep's seeds or a subset of them")
        subset = sorted(int(k) for k in ab["seeds"])
        if subset != sorted(int(k) for k in sweep["seeds"]) and not any(r.get("seeds") == subset and r["name"] == "main" for r in abl_records):
            # the main run over the ablation's seeds only, so that the rows compare like with like
            abl_records.append({"name": "main", "seeds": subset, "changed": {}, "source": str(sweep_json.name),
                                "aggregate": aggregate_table({"lopd": {k: per_seed_main["lopd"][k] for k in subset}}, ci),
                                "dynamics_final": dynamics_final({k: details[k] for k in subset}, ci), "parent_run_id": sweep.get("parent_run_id")})
        abl_details[ab["name"]] = ab_details
        abl_records.append({"name": ab["name"], "source": str(path.relative_to(root)) if path.is_relative_to(root) else path.name,
                            "changed": changed_params(main_params, _mlflow_params(uri, ab, path)), "aggregate": ab["aggregate"],
                            "dynamics_final": dynamics_final(ab_details, ci), "parent_run_id": ab["parent_run_id"], "seeds": subset})
    if abl_details:
        plots.append(plot_dynamics({"lopd (main)": details, **abl_details}, plots_dir / "ablation_dynamics.png", keys=("delta", "kl", "beta")))

    sweep = {**sweep, "efficiency": eff, "lopd_dynamics_final": dyn, "ablations": abl_records,
             "plots": [str(p.relative_to(root)) for p in plots]}
    write_json(sweep_json, sweep)
    per_seed = {m: {int(k): v for k, v in by.items()} for m, by in sweep["per_seed"].items()}
    with atomic_path(root / "metrics" / f"{name}.csv") as tmp:
        tmp.write_text(csv_table(sweep["aggregate"], per_seed, sweep["seeds"]))
    md_path = root / "metrics" / f"{name}.md"
    with atomic_path(md_path) as tmp:
        tmp.write_text(headline_table(sweep) + markdown_table(sweep["aggregate"], sweep["seeds"], ci) + report_markdown(sweep, eff, dyn, abl_records))
    if log_to_mlflow:
        _log(uri, sweep, sweep_json, md_path, plots)
    log.info("sweep report: %s, %d plots in %s", md_path, len(plots), plots_dir)
    return sweep


def _log(uri: str, sweep: Mapping, sweep_json: Path, md_path: Path, plots: Sequence[Path]) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client, run_id = MlflowClient(uri), sweep["parent_run_id"]
    metrics = [Metric(f"efficiency/{k}/{f}", float(sweep["efficiency"][k][f]), now_ms(), 0)
               for k in EFFICIENCY_KEYS if k in sweep["efficiency"] for f in ("mean", "std", "ci_low", "ci_high")
               if sweep["efficiency"][k][f] is not None]
    for ab in sweep["ablations"]:
        for metric, a in ab["aggregate"].get("lopd", {}).items():
            metrics += [Metric(f"ablation/{ab['name']}/{metric}/{f}", float(a[f]), now_ms(), 0) for f in ("mean", "ci_low", "ci_high") if a[f] is not None]
    client.log_batch(run_id, metrics=metrics)
    for path in plots:
        client.log_artifact(run_id, str(path), "plots")
    client.log_artifact(run_id, str(sweep_json))
    client.log_artifact(run_id, str(md_path))
