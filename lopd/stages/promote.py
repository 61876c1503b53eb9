"""Stage `promote`: every trained student becomes a registered version; the gate decides which one serves.

1. **Register.** Each trained method of ``distill.methods`` (not vanilla, the untrained base) is
   logged to MLflow as a pyfunc model (``lopd.policy.served``) and registered as a version of
   ``registry.model_name`` (``lopd.ops.registry``), tagged with its lineage (:func:`lineage`) and a
   model card. A checkpoint registered before is not logged again.
2. **Choose.** The challenger is ``registry.challenger`` (``best``: this run's best student on
   distill's last dev evaluation, the same dev tasks and seed for every method; those figures are
   the versions' ``dev_*`` tags).
3. **Decide.** The challenger plays the first ``registry.dev_tasks`` dev tasks once, with the gate's
   seed (never a test task). With no champion yet, it becomes the first. Otherwise the champion plays
   the same tasks with the same seed and ``lopd.ops.gate.decide`` compares them (McNemar, paired): the
   alias moves only when the gain's interval clears ``registry.min_gain`` and no app group falls by
   more than ``registry.max_regression``.
4. **Record.** The decision goes on the challenger's version (``gate.*`` tags and its description),
   into ``metrics/promotion.json`` (the latest decision and the history) and the stage's MLflow run,
   and is printed.

:func:`manual` (``lopd promote --version N --reason "..."``) moves the alias by hand (a rollback)
and records it the same way.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Sequence

from lopd import layout
from lopd.config import Params, ParamsError
from lopd.io import read_json, write_json
from lopd.ops import registry
from lopd.ops.gate import decide
from lopd.stages.evaluate import wilson_interval

log = logging.getLogger(__name__)

GATE_SEED = "gate"


def trained_methods(p: Params) -> list[str]:
    """The methods of ``distill.methods`` that train a student (vanilla is the base itself)."""
    return [m for m in dict.fromkeys(p.distill.methods) if m != "vanilla"]


def dev_outcomes(p: Params, path, tasks: Sequence) -> dict[str, bool]:
    """task id -> solved, for one sample per dev task with the gate's seed (the same for every policy)."""
    from lopd.policy.engine import make_engine
    from lopd.policy.modeling import load_policy
    from lopd.train.onpolicy import derive_seed

    model, tok = load_policy(path, p.model.dtype)
    trajs = make_engine(p, model, tok).run(tasks, 1, seed=derive_seed(p.seed, GATE_SEED), id_prefix="gate", progress=False)
    return {t.task_id: bool(t.success) for t in trajs}


def dev_figures(p: Params, outcomes: dict[str, bool], groups: dict[str, str]) -> dict:
    """Success with its Wilson interval (at ``registry.ci``), overall and per report group."""
    wins, n = sum(outcomes.values()), len(outcomes)
    out = {"dev_success": wins / n, "dev_success_ci": list(wilson_interval(wins, n, p.registry.ci)), "dev_tasks": n}
    for g in sorted(set(groups.values())):
        got = [outcomes[t] for t, tg in groups.items() if tg == g and t in outcomes]
        out[f"dev_success_{g}"] = sum(got) / len(got) if got else None
    return out


def distill_figures(p: Params, record: dict | None) -> dict | None:
    """A student's dev figures from distill's last dev evaluation (the same ``distill.eval_dev_tasks`` dev tasks and
    seed for every method), with a Wilson interval at ``evaluate.ci``; None when distill recorded none."""
    if not record or record.get("final_dev_success") is None:
        return None
    n = min(p.distill.eval_dev_tasks, p.env.n_dev)
    wins = round(record["final_dev_success"] * n)
    return {"dev_success": record["final_dev_success"], "dev_success_ci": list(wilson_interval(wins, n, p.evaluate.ci)), "dev_tasks": n,
            "dev_success_pretrain": record.get("final_dev_success_pretrain"), "dev_success_new": record.get("final_dev_success_new"),
            "dev_source": "distill"}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def lineage(p: Params, method: str, dev: dict, distill: dict, evaluate: dict, run_id: str) -> dict[str, str]:
    """A version's lineage tags: training run, code, params, bank, environment, base, method, seed, dev and test figures."""
    from lopd.memory.bank import read_bank, round_numbers
    from lopd.ops.tracking import run_tags

    bank = layout.bank_dir(p)
    rounds = round_numbers(bank) if bank.is_dir() else []
    tags = {k: v for k, v in run_tags(p).items() if k in ("git_commit", "git_dirty", "params_hash", "bank_dvc_hash", "bank_dvc_source", "profile")}
    tags.update(method=method, seed=p.seed, training_run_id=distill.get("run_id") or "unknown", promote_run_id=run_id,
                bank_rounds=len(rounds), bank_size=len(read_bank(bank)) if rounds else 0, env=p.env.name, env_task_seed=p.env.task_seed,
                base_checkpoint_sha=registry.checkpoint_sha(layout.policy_path(p)), init=p.distill.init)
    if p.env.name == "toolworld":
        tags["world_seed"] = p.toolworld.world_seed
    if p.distill.init == "champion":
        marker = layout.champion_dir(p) / registry.MARKER
        tags["init_version"] = read_json(marker)["version"] if marker.exists() else "unknown"
    tags.update({k: v for k, v in dev.items() if v is not None})
    test = evaluate.get(method)
    if test:
        tags.update(test_success=test["success_rate"], test_success_ci=test["success_ci"], test_mean_reward=test["mean_reward"],
                    test_reward_ci=test["reward_ci"], test_episodes=test["n_episodes"], evaluate_ci=test["ci"])
        tags.update({f"test_success_{g}": v for g, v in test.get("success_by_group", {}).items() if v is not None})
    return {k: _fmt(v) for k, v in tags.items()}


def model_card(p: Params, method: str, tags: dict[str, str]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(tags.items()))
    return (f"# {registry.model_name(p)}: the {method} student\n\n"
            f"A Qwen3-architecture policy post-trained by the LOPD pipeline ({method}) on `{p.env.name}`, from "
            f"{'the registered champion' if p.distill.init == 'champion' else 'the base policy'}. A plain Hugging Face "
            "checkpoint (`AutoModelForCausalLM`, its tokenizer and chat template); it plays without retrieval or latents.\n\n"
            "Dev figures (`dev_*`) come from distill's last dev evaluation (one sample per task); the gate's own in `gate.*`; "
            "test figures from `lopd evaluate`.\n\n"
            f"| lineage | value |\n|---|---|\n{rows}\n")


def _read(p: Params, stage: str) -> dict:
    path = layout.metrics_path(p, stage)
    return read_json(path) if path.exists() else {}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def record(p: Params, decision: dict) -> dict:
    """Put ``decision`` on its version (tags, description), in ``metrics/promotion.json``, and print it."""
    version = decision["challenger"]["version"]
    tags = {"gate.verdict": decision["verdict"], "gate.reason": decision["reason"][:4900], "gate.decided_at": decision["at"],
            "gate.champion_before": decision["champion_before"] or "none", "gate.champion_after": decision["champion_after"]}
    fig = decision.get("figures")
    if fig:
        o = fig["overall"]
        tags.update({"gate.diff": _fmt(o["diff"]), "gate.ci": _fmt([o["ci_low"], o["ci_high"]]), "gate.p_value": _fmt(o["p_value"]),
                     "gate.n_tasks": o["n"], "gate.challenger_dev": _fmt(o["challenger"]), "gate.champion_dev": _fmt(o["champion"]),
                     **{f"gate.diff_{g}": _fmt(s["diff"]) for g, s in fig["groups"].items()}})
    registry.set_tags(p, version, tags)
    mv = registry.get_version(p, version)
    head = (mv.description or "").split("\n\nGate ")[0]
    registry.describe(p, version, f"{head}\n\nGate {decision['at']}: {decision['verdict']}. {decision['reason']}")
    path = layout.metrics_path(p, "promotion")
    old = read_json(path) if path.exists() else {}
    # A first champion means a registry without one (a fresh project): a history in the file (e.g. the one
    # committed with the demo's metrics) belongs to another registry and is not carried on.
    carried = decision["champion_before"] is not None and old.get("model") == registry.model_name(p)
    history = (old.get("history", []) if carried else []) + [decision]
    write_json(path, {"model": registry.model_name(p), "champion_version": decision["champion_after"], "decision": decision,
                      "history": history})
    line = f"promote: {registry.model_name(p)} v{version} ({decision['challenger'].get('method', '?')}): {decision['reason']} -> champion v{decision['champion_after']}"
    print(line, flush=True)
    return {**decision, "line": line}


def run(p: Params) -> dict:
    """Register the trained students, gate the challenger against the champion, record the decision."""
    import mlflow

    from lopd.ops.tracking import stage_run
    from lopd.policy.engine import environment, split_tasks
    from lopd.policy.served import PolicyModel, signature

    methods = trained_methods(p)
    paths = {m: layout.student_dir(p, m) for m in methods}
    missing = [f"{m} ({paths[m]})" for m in methods if not (paths[m] / "config.json").exists()]
    if not methods or missing:
        raise FileNotFoundError(f"promote: no trained student for {', '.join(missing) or 'any method'}: run `lopd distill` "
                                "(distill.methods names the methods to register)")
    if p.registry.challenger != "best" and p.registry.challenger not in methods:
        raise ParamsError(f"params: registry.challenger = {p.registry.challenger} is not trained in this run "
                          f"(distill.methods = {p.distill.methods}): add it there or set registry.challenger=best")
    distill, evaluate = _read(p, "distill").get("details", {}), _read(p, "evaluate")
    tasks = split_tasks(p, "dev", p.registry.dev_tasks)
    groups = environment(p).group_of(tasks)
    with stage_run(p, "promote") as run_:
        outcomes, figures, versions = {}, {}, {}
        for m in methods:
            figures[m] = distill_figures(p, distill.get(m))
            if figures[m] is None:  # no dev record from distill: measure it on the gate's tasks
                outcomes[m] = dev_outcomes(p, paths[m], tasks)
                figures[m] = {**dev_figures(p, outcomes[m], groups), "dev_source": "gate"}
            tags = lineage(p, m, figures[m], distill.get(m, {}), evaluate, run_.info.run_id)
            versions[m] = registry.register(p, paths[m], PolicyModel(), artifact_name=f"student-{m}", card=model_card(p, m, tags),
                                            tags=tags, description=f"{m} student of run {tags['training_run_id']} ({p.env.name}, seed {p.seed})",
                                            signature=signature()).version
            log.info("promote: %s is %s v%s, dev success %.3f", m, registry.model_name(p), versions[m], figures[m]["dev_success"])
        name = p.registry.challenger
        if name == "best":  # on the dev evaluation every student had (distill's, same tasks and seed for all)
            name = max(methods, key=lambda m: (figures[m]["dev_success"], -methods.index(m)))
        if name not in outcomes:
            outcomes[name] = dev_outcomes(p, paths[name], tasks)
        challenger = {"method": name, "version": int(versions[name]), **dev_figures(p, outcomes[name], groups)}  # the gate's tasks
        champ = registry.champion(p)
        base = {"at": _now(), "challenger": challenger, "candidates": {m: {"version": int(versions[m]), **figures[m]} for m in methods},
                "champion_before": int(champ.version) if champ else None}
        if champ is None:
            registry.set_champion(p, challenger["version"])
            decision = {**base, "verdict": "first_champion", "promoted": True, "champion_after": challenger["version"],
                        "reason": f"no champion yet: the best student on dev ({name}, dev success {challenger['dev_success']:.3f} "
                                  f"on the gate's {challenger['dev_tasks']} tasks) becomes the first", "figures": None}
        elif int(champ.version) == challenger["version"]:
            decision = {**base, "verdict": "already_champion", "promoted": False, "champion_after": challenger["version"], "figures": None,
                        "reason": f"the challenger is the champion's own checkpoint (v{champ.version}): nothing to decide"}
        else:
            champ_out = dev_outcomes(p, registry.fetch_champion(p), tasks)
            d = decide(outcomes[name], champ_out, groups, ci=p.registry.ci, min_gain=p.registry.min_gain, max_regression=p.registry.max_regression)
            if d.promoted:
                registry.set_champion(p, challenger["version"])
            decision = {**base, "verdict": "promoted" if d.promoted else "rejected", "promoted": d.promoted,
                        "champion_after": challenger["version"] if d.promoted else int(champ.version), "reason": d.reason,
                        "figures": d.as_dict(), "champion_dev": dev_figures(p, champ_out, groups)}
        mlflow.log_metrics({"promoted": float(decision["promoted"]), "champion_version": float(decision["champion_after"]),
                            "challenger_dev_success": challenger["dev_success"],
                            **({"gate_diff": decision["figures"]["overall"]["diff"], "gate_ci_low": decision["figures"]["overall"]["ci_low"],
                                "gate_ci_high": decision["figures"]["overall"]["ci_high"]} if decision["figures"] else {})})
        mlflow.set_tags({"gate.verdict": decision["verdict"], "registered_model": registry.model_name(p)})
        return record(p, decision)


def manual(p: Params, version: int, reason: str) -> dict:
    """Move the alias ``champion`` to ``version`` by hand (a rollback), recorded like a gate decision."""
    if not reason.strip():
        raise registry.RegistryError("lopd promote --version N needs --reason \"...\": why the alias moves by hand is recorded")
    mv = registry.get_version(p, version)
    champ = registry.champion(p)
    registry.set_champion(p, version)
    decision = {"at": _now(), "verdict": "manual", "promoted": True, "figures": None,
                "challenger": {"method": mv.tags.get("method", "?"), "version": int(version)},
                "champion_before": int(champ.version) if champ else None, "champion_after": int(version),
                "reason": f"moved by hand: {reason.strip()}"}
    return record(p, decision)
