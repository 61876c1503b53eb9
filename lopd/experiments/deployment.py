"""A simulated deployment, week by week: the champion serves, its experience is ingested, a retrain from it meets the gate.

``lopd deploy-sim --weeks 4 --tasks-per-week 64`` (or the Prefect flow ``flows/deployment_flow.py``):

- **week 0**: when no version holds the alias ``champion`` yet, the whole pipeline runs once from
  the base (``distill.init: base``) and its gate makes the first champion;
- **each week k ≥ 1**: the champion plays ``tasks_per_week`` fresh train tasks as production traffic
  (tasks no earlier week and no ``collect`` played, one sample each, seeded by week); its
  trajectories are written as ``lopd ingest`` rows (``data/deployment/week-kk.jsonl``) and go through
  the ``ingest`` stage (validated; successes become a bank round); then the stages that read the
  grown bank re-run with ``distill.init: champion`` (:func:`needed_stages`: ``index`` when LOPD or OPSD
  retrieve, ``cold_start`` when LOPD trains, ``distill``; then ``evaluate``) and the ``promote`` gate decides.

Per week (``metrics/deployment.json``, under ``weeks``): ``champion_version`` after the decision,
``promoted``, ``verdict``, ``dev_success`` / ``dev_success_pretrain`` / ``dev_success_new`` (the
serving champion on the gate's dev tasks), ``gate`` (the difference and its interval when the gate
compared), ``bank_size``, ``generations`` (production episodes + the training budget of every
trained method, + collect's rollouts in week 0; dev and test measurements are not counted), ``traffic_success`` and ``wall_s``. One
MLflow parent run per simulation (``deployment-<profile>-seed<k>-<time>``, every stage run nested
under it) holds the per-week metrics (step = week), the json and the plot
``metrics/plots/deployment.png`` (dev success per app group against the week).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from lopd import layout
from lopd.config import Params, ParamsError
from lopd.io import atomic_path, read_json, write_json
from lopd.stages import STAGES

log = logging.getLogger(__name__)


def deployment_dir(p: Params) -> Path:
    """Where each week's production trajectories are written (the files ``ingest`` reads)."""
    return layout.data_dir(p) / "deployment"


def check(p: Params, weeks: int, tasks_per_week: int) -> None:
    """Every week's fresh train tasks exist (after the ones ``collect`` plays), before any compute."""
    if weeks < 1 or tasks_per_week < 1:
        raise ParamsError(f"deploy-sim: --weeks = {weeks} and --tasks-per-week = {tasks_per_week} must be >= 1")
    need = p.collect.n_tasks + weeks * tasks_per_week
    if need > p.env.n_train:
        raise ParamsError(f"params: env.n_train = {p.env.n_train} holds too few fresh train tasks: collect plays {p.collect.n_tasks}, "
                          f"{weeks} weeks × {tasks_per_week} need {weeks * tasks_per_week} more; raise env.n_train to {need} or "
                          "lower --weeks / --tasks-per-week")


def needed_stages(p: Params) -> list[str]:
    """What a retrain on the grown bank runs before the gate: the index when LOPD or OPSD retrieve from it, the cold
    start when LOPD trains (its composer refitted to the champion), then distill (privilege, a diagnostic, is skipped)."""
    methods = set(p.distill.methods)
    return [*(["index"] if methods & {"lopd", "opsd"} else []), *(["cold_start"] if "lopd" in methods else []), "distill"]


def production_traffic(p: Params, week: int, tasks_per_week: int) -> tuple[Path, dict]:
    """The champion plays this week's fresh train tasks; their rows (``lopd ingest``'s format) in a JSONL file."""
    from lopd.memory.experience import trajectory_row
    from lopd.ops.registry import champion, fetch_champion, model_name
    from lopd.policy.engine import environment, make_engine, split_tasks
    from lopd.policy.modeling import load_policy
    from lopd.train.onpolicy import derive_seed

    start = p.collect.n_tasks + (week - 1) * tasks_per_week
    tasks = list(split_tasks(p, "train"))[start:start + tasks_per_week]
    version = champion(p).version
    model, tok = load_policy(fetch_champion(p), p.model.dtype)
    trajs = make_engine(p, model, tok).run(tasks, 1, seed=derive_seed(p.seed, "deployment", week), id_prefix=f"week{week}", progress=False)
    env = environment(p)
    by_id = {t.task_id: t for t in tasks}
    rows = [trajectory_row(t, env.make_env(by_id[t.task_id]).initial_observation(), f"{model_name(p)}/{version}") for t in trajs]
    path = deployment_dir(p) / f"week-{week:02d}.jsonl"
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, {"traffic_tasks": len(trajs), "traffic_success": sum(t.success for t in trajs) / max(1, len(trajs))}


def _week_record(week: int, decision: dict, p: Params, t0: float, extra: dict) -> dict:
    from lopd.memory.bank import read_bank
    from lopd.train.onpolicy import rollout_budget

    serving = decision["challenger"] if decision["champion_after"] == decision["challenger"]["version"] else decision.get("champion_dev", {})
    fig = decision.get("figures")
    trained = [m for m in p.distill.methods if m != "vanilla"]
    return {"week": week, "champion_version": decision["champion_after"], "promoted": bool(decision["promoted"]),
            "verdict": decision["verdict"], "challenger_version": decision["challenger"]["version"],
            "dev_success": serving.get("dev_success"), "dev_success_pretrain": serving.get("dev_success_pretrain"),
            "dev_success_new": serving.get("dev_success_new"),
            "gate": {k: fig["overall"][k] for k in ("diff", "ci_low", "ci_high", "p_value", "n")} if fig else None,
            "bank_size": len(read_bank(layout.bank_dir(p))),
            "generations": extra.get("traffic_tasks", 0) + extra.get("collect_generations", 0) + rollout_budget(p) * len(trained),
            **extra, "wall_s": time.perf_counter() - t0}


def plot(weeks: list[dict], out: Path) -> Path:
    """Dev success (overall and per app group) of the serving champion against the week."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [w["week"] for w in weeks]
    for key, label in (("dev_success", "overall"), ("dev_success_pretrain", "pre-training apps"), ("dev_success_new", "new apps")):
        ys = [w.get(key) for w in weeks]
        if any(y is not None for y in ys):
            ax.plot(xs, ys, marker="o", label=label)
    for w in weeks:
        if w["promoted"] and w["week"]:
            ax.axvline(w["week"], ls=":", c="gray")
    ax.set(xlabel="week", ylabel="champion's dev success", title="Simulated deployment (dotted: a promotion)")
    ax.legend()
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return out


def run(p: Params, weeks: int, tasks_per_week: int, seed: int | None = None) -> dict:
    """The simulation (module docstring); returns what ``metrics/deployment.json`` holds.

    ``seed`` (default ``p.seed``) is the simulation's: every stage after ``bootstrap`` runs with it
    (the bank ``collect`` gathers, the training, the traffic, the gate's draws). ``bootstrap`` keeps
    ``p.seed``, so that seeds share one base, as a sweep's do (a committed base matches one seed). With a
    ``seed``, the files are ``metrics/deployment-seed<k>.json`` and ``metrics/plots/deployment-seed<k>.png``."""
    from mlflow.tracking import MlflowClient

    from lopd.ops.registry import champion
    from lopd.ops.tracking import pipeline_run, tracking_uri

    check(p, weeks, tasks_per_week)
    base_seed = p.seed
    if seed is not None:
        p = p.model_copy(update={"seed": seed})
    records = []
    with pipeline_run(p, "deployment") as parent:
        client = MlflowClient(tracking_uri(p))
        first = ["bootstrap", "collect", *needed_stages(p), "evaluate", "promote"]
        if champion(p) is None:  # week 0: the pipeline from the base makes the first champion
            t0 = time.perf_counter()
            base = p.model_copy(update={"distill": p.distill.model_copy(update={"init": "base"}),
                                        "ingest": p.ingest.model_copy(update={"files": []})})
            results = {name: STAGES[name](base.model_copy(update={"seed": base_seed}) if name == "bootstrap" else base)
                       for name in first}
            collected = p.collect.n_tasks * p.collect.samples_per_task
            records.append(_week_record(0, results["promote"], base, t0, {"collect_generations": collected}))
        retrain = [*needed_stages(p), "evaluate", "promote"]
        for week in range(1, weeks + 1):
            t0 = time.perf_counter()
            path, traffic = production_traffic(p, week, tasks_per_week)
            q = p.model_copy(update={"distill": p.distill.model_copy(update={"init": "champion"}),
                                     "ingest": p.ingest.model_copy(update={"files": [str(path)]})})
            ingested = STAGES["ingest"](q)
            q = q.model_copy(update={"ingest": q.ingest.model_copy(update={"files": []})})
            for name in retrain:
                result = STAGES[name](q)
            rec = _week_record(week, result, q, t0, {**traffic, "ingested": ingested["banked"]})
            records.append(rec)
            log.info("deployment week %d: champion v%s (%s), dev success %s, bank %d, %d generations, %.0f s", week,
                     rec["champion_version"], rec["verdict"], rec["dev_success"], rec["bank_size"], rec["generations"], rec["wall_s"])
        for r in records:
            for k in ("champion_version", "promoted", "dev_success", "dev_success_pretrain", "dev_success_new", "bank_size", "generations", "wall_s"):
                if r.get(k) is not None:
                    client.log_metric(parent, f"deployment_{k}", float(r[k]), step=r["week"])
        out = {"weeks": records, "tasks_per_week": tasks_per_week, "methods": [m for m in p.distill.methods if m != "vanilla"],
               "parent_run_id": parent}
        name = "deployment" if seed is None else f"deployment-seed{seed}"  # seeds of one project never overwrite each other
        path = layout.metrics_path(p, name)
        write_json(path, out)
        png = plot(records, p.root() / "metrics" / "plots" / f"{name}.png")
        client.log_artifact(parent, str(path))
        client.log_artifact(parent, str(png), "plots")
    return read_json(path)
