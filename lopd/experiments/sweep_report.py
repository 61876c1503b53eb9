"""A sweep's report: efficiency per seed, the chance row's policies, curves as mean ± std over seeds, ablation rows.

It reads only what sweeps wrote: ``metrics/<name>.json`` (seeds, methods, aggregate, MLflow parent
run) and each seed's ``runs/<name>/seed<k>/metrics/{distill,evaluate}.json`` (dev curves, per-step
history, the chance record). It adds to the main sweep's ``metrics/sweep.json``:

- ``efficiency``: ``rollouts_to_grpo_final_frac`` and ``wall_to_grpo_final_ratio`` (see
  :func:`lopd.stages.distill.efficiency`) as ``{n, mean, std, ci_low, ci_high, per_seed}``, with the
  seeds in which LOPD never reached GRPO's final dev success under ``not_reached``, the seeds where
  GRPO ends no higher than the base starts under ``degenerate``, and each figure over the other
  seeds as ``other_seeds``;
- ``chance``: which named policy of the environment's ``chance`` record gives each figure (``best``);
- ``ablations``: each ablation sweep's name, the params it changed, its aggregate, and LOPD's
  final Δ, KL and β per seed;

writes ``metrics/plots/*.png`` (:mod:`lopd.experiments.sweep_plots`) and ``metrics/sweep.md``
(:mod:`lopd.experiments.sweep_markdown`). Everything is logged to the main sweep's MLflow parent run.
``lopd sweep`` builds it with the profile's ``sweep.ablations`` (:mod:`lopd.experiments.headline`);
``lopd sweep-report --ablation margin0 --ablation frozen ...`` rebuilds it at any time.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence

from lopd.config import Params
from lopd.experiments.sweep import now_ms
from lopd.experiments.sweep_markdown import EFFICIENCY_KEYS, FINAL_WINDOW, headline_table, intervals_separate, report_markdown  # noqa: F401
from lopd.experiments.sweep_plots import DYNAMICS, plot_dev_curves, plot_dynamics
from lopd.experiments.tables import aggregate, aggregate_table, csv_table, markdown_table, seed_rows
from lopd.io import atomic_path, read_json, write_json
from lopd.stages.distill import efficiency, plot_decisions

log = logging.getLogger(__name__)

IGNORED_PARAM_PREFIXES = ("paths.", "tracking.", "distill.methods", "sweep.")


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
    out, per_seed, chance = {}, {}, {}
    seed_dirs = sweep.get("seed_dirs", {})  # seeds joined from another sweep (``join``) live under its runs/<name>
    for k in sweep["seeds"]:
        seed_root = sweep_json.parent.parent / seed_dirs[str(k)] if str(k) in seed_dirs else sweep_dir(sweep_json, sweep) / f"seed{k}"
        metrics = seed_root / "metrics"
        for name in ("distill.json", "evaluate.json"):
            if not (metrics / name).exists():
                raise FileNotFoundError(f"sweep report: {metrics / name} is missing; the sweep {sweep_json} did not finish seed {k}")
        distilled, evaluated = read_json(metrics / "distill.json"), read_json(metrics / "evaluate.json")
        out[int(k)] = distilled["details"]
        chance[int(k)] = evaluated
        for m, metrics in seed_rows(sweep["methods"], distilled, evaluated).items():
            per_seed.setdefault(m, {})[int(k)] = metrics
    sweep["per_seed"] = {m: {str(k): v for k, v in by.items()} for m, by in per_seed.items()}
    sweep["chance"] = chance_summary(chance)
    sweep["aggregate"] = aggregate_table(per_seed, sweep["ci"])
    return sweep, out


# ----------------------------------------------------------------------------- numbers


def base_start(seed_details: Mapping) -> float | None:
    """The dev success every method starts from in one seed: LOPD's dev point at 0 generations (the base's)."""
    curve = (seed_details.get("lopd") or {}).get("curve") or []
    return curve[0].get("dev_success") if curve and curve[0].get("rollouts_cum", 0) == 0 else None


def efficiency_summary(details: Mapping[int, Mapping], ci: float) -> dict:
    """Per seed :func:`lopd.stages.distill.efficiency` → ``{key: {n, mean, std, ci_low, ci_high, per_seed, other_seeds}}``
    + ``not_reached`` + ``degenerate``.

    A seed is ``degenerate`` when GRPO's final dev success is no higher than the base's own, where
    every method starts: LOPD "reaches" it at 0 generations, so its 0.0 says nothing of LOPD.
    ``other_seeds`` is the aggregate over the seeds that are not (absent when every seed is).
    """
    per_seed = {k: efficiency(d) for k, d in details.items()}
    starts = {k: base_start(d) for k, d in details.items()}
    degenerate = [k for k, e in per_seed.items() if e["grpo_final_dev_success"] is not None and starts[k] is not None
                  and e["grpo_final_dev_success"] <= starts[k]]
    out: dict = {"target": "GRPO's final dev success (same seed)", "not_reached": [k for k, e in per_seed.items() if e["grpo_final_reached"] is False],
                 "degenerate": degenerate, "base_dev_success": {str(k): v for k, v in starts.items()}}
    for key in EFFICIENCY_KEYS:
        vals = {k: e[key] for k, e in per_seed.items() if e[key] is not None}
        if vals:
            out[key] = {**aggregate(list(vals.values()), ci), "per_seed": {str(k): v for k, v in vals.items()}}
            rest = [v for k, v in vals.items() if k not in degenerate]
            if degenerate and rest:
                out[key]["other_seeds"] = {**aggregate(rest, ci), "seeds": [k for k in vals if k not in degenerate]}
    out["per_seed"] = {str(k): e for k, e in per_seed.items()}
    return out


def chance_summary(evaluated: Mapping[int, Mapping]) -> dict | None:
    """Which named policy gives each chance figure, per seed (``best`` of the environment's ``chance``
    record in each seed's ``evaluate.json``), and ``best`` itself when every seed agrees; None without one."""
    rows = {k: e["chance"] for k, e in evaluated.items() if isinstance(e.get("chance"), Mapping)}
    if not rows:
        return None
    per_seed = {str(k): {"best": dict(r.get("best") or {}), "n_tasks": r.get("n_tasks"), "policies": sorted(r.get("policies") or {})}
                for k, r in rows.items()}
    bests = [v["best"] for v in per_seed.values()]
    return {"best": bests[0] if all(b == bests[0] for b in bests) else None,
            "policies": sorted({n for v in per_seed.values() for n in v["policies"]}), "per_seed": per_seed}


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


def changed_params(main: Mapping[str, str], other: Mapping[str, str]) -> dict[str, str]:
    """The params an ablation sweep changed relative to the main one (MLflow's logged params).

    Only keys both runs logged: a key one of them lacks was added or renamed by the code between
    the two runs (e.g. ``env.families`` → ``toolworld.families``), not set by the ablation.
    """
    return {k: v for k, v in sorted(other.items())
            if k in main and main[k] != v and not k.startswith(IGNORED_PARAM_PREFIXES)}


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
