"""Multi-seed sweeps: the statistics by hand, then a real 2 methods × 2 seeds sweep at the smoke
profile (shared stages run once into a temporary root, MLflow in a temporary sqlite store)."""

import csv
import io
import json
import math

import pytest

from lopd import layout
from lopd.cli import main
from lopd.config import ParamsError, load_params
from lopd.experiments import sweep, tables

# ----------------------------------------------------------------------------- statistics by hand

T975_DF1 = 12.706204736174707  # Student t, 97.5 % quantile, 1 degree of freedom (tables: 12.706)
T975_DF2 = 4.302652729749464  # 2 degrees of freedom (tables: 4.303)


def test_aggregate_three_values_by_hand():
    a = tables.aggregate([0.2, 0.4, 0.9], 0.95)
    # mean 0.5; deviations -0.3, -0.1, 0.4 → sum of squares 0.26, / (n-1) = 0.13
    sd = math.sqrt(0.13)
    half = T975_DF2 * sd / math.sqrt(3)
    assert a["n"] == 3
    assert a["mean"] == pytest.approx(0.5, abs=1e-12)
    assert a["std"] == pytest.approx(0.36055512754639896, abs=1e-12) == pytest.approx(sd)
    assert (a["ci_low"], a["ci_high"]) == (pytest.approx(0.5 - half, abs=1e-9), pytest.approx(0.5 + half, abs=1e-9))
    assert a["ci_low"] == pytest.approx(-0.3956686, abs=1e-6) and a["ci_high"] == pytest.approx(1.3956686, abs=1e-6)


def test_aggregate_two_values_and_one_value():
    a = tables.aggregate([1.0, 3.0], 0.95)
    # mean 2, std sqrt(2), half width t * sqrt(2) / sqrt(2) = t
    assert (a["mean"], a["std"]) == (pytest.approx(2.0), pytest.approx(math.sqrt(2)))
    assert (a["ci_low"], a["ci_high"]) == (pytest.approx(2 - T975_DF1, abs=1e-9), pytest.approx(2 + T975_DF1, abs=1e-9))
    one = tables.aggregate([0.7], 0.95)
    assert one == {"n": 1, "mean": 0.7, "std": None, "ci_low": None, "ci_high": None}
    wider = tables.aggregate([0.2, 0.4, 0.9], 0.99)
    assert wider["ci_high"] - wider["ci_low"] > 2 * T975_DF2 * math.sqrt(0.13) / math.sqrt(3)


def test_tables_carry_the_aggregate_and_every_seed():
    per_seed = {"lopd": {0: {"test_success_rate": 0.25, "rollouts": 8.0}, 1: {"test_success_rate": 0.75, "rollouts": 8.0}},
                "vanilla": {0: {"test_success_rate": 0.5, "rollouts": 0.0}, 1: {"test_success_rate": 0.5, "rollouts": 0.0}}}
    agg = tables.aggregate_table(per_seed, 0.95)
    assert agg["lopd"]["test_success_rate"]["mean"] == 0.5 and agg["lopd"]["test_success_rate"]["values"] == [0.25, 0.75]
    assert agg["vanilla"]["test_success_rate"]["std"] == 0.0
    rows = list(csv.DictReader(io.StringIO(sweep.csv_table(agg, per_seed, [0, 1]))))
    row = next(r for r in rows if (r["method"], r["metric"]) == ("lopd", "test_success_rate"))
    assert float(row["mean"]) == 0.5 and float(row["std"]) == pytest.approx(math.sqrt(0.125))
    assert (float(row["seed0"]), float(row["seed1"])) == (0.25, 0.75)
    assert float(row["ci_high"]) == pytest.approx(0.5 + T975_DF1 * math.sqrt(0.125) / math.sqrt(2))
    md = sweep.markdown_table(agg, [0, 1], 0.95)
    lopd_row = next(line for line in md.splitlines() if line.startswith("| lopd |"))
    assert "0.500 ± 0.354" in lopd_row and "95% Student-t" in md


def _details(lopd_success, grpo_success, wall=(1.0, 2.0)):
    """One seed's distill details: dev curves at 0, 8, 16 generations, LOPD's history of 2 steps."""
    def curve(vals, w):
        return [{"step": i, "rollouts_cum": 8 * i, "train_wall_s": w * i, "dev_success": v, "dev_reward": v} for i, v in enumerate(vals)]
    hist = [{"step": i, "beta": 0.1 * i, "delta": 0.02 * i, "kl": 0.5 - 0.1 * i, "margin_violation": 0.05 - 0.02 * i} for i in range(2)]
    return {"lopd": {"rollouts": 16, "train_wall_s": 2 * wall[1], "final_dev_success": lopd_success[-1], "curve": curve(lopd_success, wall[1]), "history": hist},
            "grpo": {"rollouts": 16, "train_wall_s": 2 * wall[0], "final_dev_success": grpo_success[-1], "curve": curve(grpo_success, wall[0])}}


def test_report_numbers_by_hand(tmp_path):
    from lopd.experiments import sweep_plots, sweep_report

    details = {0: _details([0.1, 0.3, 0.4], [0.1, 0.2, 0.3]),   # reaches 0.3 at 8 of 16 → 0.5; 2 s·1 / (2·1 s) = 1.0
               1: _details([0.1, 0.2, 0.25], [0.1, 0.2, 0.3])}  # never: flagged, 1.0; wall 2·2 / 2 = 2.0
    eff = sweep_report.efficiency_summary(details, 0.95)
    assert eff["rollouts_to_grpo_final_frac"]["per_seed"] == {"0": 0.5, "1": 1.0} and eff["not_reached"] == [1]
    assert eff["rollouts_to_grpo_final_frac"]["mean"] == pytest.approx(0.75)
    assert eff["rollouts_to_grpo_final_frac"]["std"] == pytest.approx(math.sqrt(0.125))
    assert eff["wall_to_grpo_final_ratio"]["per_seed"] == {"0": pytest.approx(1.0), "1": pytest.approx(2.0)}
    x, ys = sweep_plots.stacked(details, "lopd", "curve", "rollouts_cum", "dev_success")
    assert list(x) == [0, 8, 16] and ys.shape == (2, 3) and ys[1, 2] == 0.25
    dyn = sweep_report.dynamics_final(details, 0.95)
    assert dyn["beta"]["mean"] == pytest.approx(0.05) and dyn["kl"]["values"] == [pytest.approx(0.45)] * 2  # mean of the 2 steps
    assert sweep_report.intervals_separate({"ci_low": 0.5, "ci_high": 0.6}, {"ci_low": 0.1, "ci_high": 0.4}) is True
    assert sweep_report.intervals_separate({"ci_low": 0.3, "ci_high": 0.6}, {"ci_low": 0.1, "ci_high": 0.4}) is False
    assert sweep_report.intervals_separate({"ci_low": None, "ci_high": None}, {"ci_low": 0.1, "ci_high": 0.4}) is None
    main_p = {"distill.margin": "0.05", "paths.root": "a", "seed": "0", "composer.frozen": "False"}
    assert sweep_report.changed_params(main_p, {**main_p, "distill.margin": "0", "paths.root": "b"}) == {"distill.margin": "0"}
    # a key the main run never logged (added or renamed by later code) is no ablation's change
    assert sweep_report.changed_params(main_p, {**main_p, "toolworld.world_seed": "0"}) == {}
    png = sweep_plots.plot_dev_curves(details, ["lopd", "grpo"], "train_wall_s", tmp_path / "p" / "c.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    # seed 2: GRPO ends (0.2) below the base's start (0.3), so LOPD "reaches" it at 0 generations: degenerate
    eff = sweep_report.efficiency_summary({**details, 2: _details([0.3, 0.35, 0.4], [0.3, 0.25, 0.2])}, 0.95)
    assert eff["degenerate"] == [2] and eff["rollouts_to_grpo_final_frac"]["per_seed"]["2"] == 0.0
    assert eff["rollouts_to_grpo_final_frac"]["other_seeds"]["seeds"] == [0, 1]
    assert eff["rollouts_to_grpo_final_frac"]["other_seeds"]["mean"] == pytest.approx(0.75)
    assert eff["base_dev_success"] == {"0": 0.1, "1": 0.1, "2": 0.3}
    md = sweep_report.report_markdown({"aggregate": {}, "ci": 0.95, "seeds": [0, 1, 2]}, eff, {}, [])
    assert "seed2: 0.000 (degenerate)" in md and "0.750 ± 0.354" in md and "(seeds 0, 1)" in md
    assert sweep_report.efficiency_summary(details, 0.95)["degenerate"] == []


def test_chance_line_names_the_policy_of_each_figure():
    from lopd.experiments import sweep_markdown, sweep_report

    def ev(best):
        return {"chance": {"success_rate": 0.25, "best": best, "policies": {"every_tool_once": {}, "errors_a": {}, "errors_b": {}}}}

    same = {"success_rate": "errors_a", "success_by_group.new": "errors_b", "mean_reward": "every_tool_once"}
    chance = sweep_report.chance_summary({0: ev(same), 1: ev(same)})
    assert chance["best"] == same and chance["policies"] == ["errors_a", "errors_b", "every_tool_once"]
    assert sweep_markdown.chance_lines(chance)[-1] == (
        "chance: for each figure, the best of 3 policies that learn nothing: test success `errors_a`, new apps `errors_b`, "
        "test reward `every_tool_once`.")
    differ = sweep_report.chance_summary({0: ev(same), 1: ev({**same, "success_rate": "errors_b"})})
    assert differ["best"] is None and sweep_markdown.chance_lines(differ)[-1] == "- seed 1: test success `errors_b`, new apps `errors_b`, test reward `every_tool_once`"
    assert sweep_report.chance_summary({0: {}}) is None and sweep_markdown.chance_lines(None) == []


def test_bad_seeds_and_methods_fail_before_compute(repo, tmp_path, capsys):
    with pytest.raises(ParamsError, match="--methods"):
        sweep.parse_methods("lopd,ppo")
    with pytest.raises(ParamsError, match="each once"):
        sweep.parse_seeds("1,1")
    assert sweep.parse_seeds("0, 2") == [0, 2] and sweep.parse_methods(" grpo ,vanilla") == ["grpo", "vanilla"]
    rc = main(["sweep", "--params", str(repo / "params.yaml"), "--profile", "smoke", "--set", f"paths.root={tmp_path}",
               "--seeds", "0,x"])
    assert rc == 2 and "--seeds" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # an ablation that would change the shared outputs it reuses (the index reads retrieval.*): refused before any compute
    rc = main(["sweep", "--params", str(repo / "params.yaml"), "--profile", "smoke", "--set", f"paths.root={tmp_path}",
               "--set", "sweep.ablations=[{name: nret1, set: {retrieval.n_ret: 1}}]", "--seeds", "0", "--methods", "lopd"])
    err = capsys.readouterr().err
    assert rc == 2 and "sweep.ablations[0] (nret1).set: retrieval.n_ret changes what the shared index stage builds" in err
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- a real sweep

# Smaller still than the smoke profile, so the shared stages take seconds.
FAST = ["bootstrap.n_demos=32", "bootstrap.expert_check_tasks=8", "bootstrap.eval_dev_tasks=4", "env.n_dev=8",
        "collect.n_tasks=8", "bank.expert_top_up=16", "cold_start.eval_dev_tasks=8", "evaluate.n_tasks=8"]
SEEDS, METHODS = [0, 1], ["lopd", "grpo", "vanilla"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory, request):
    """``lopd sweep --seeds 0,1 --methods lopd,vanilla`` into an empty root: the shared stages run once there."""
    root = tmp_path_factory.mktemp("sweep")
    repo = request.config.rootpath
    overrides = [f"paths.root={root}", f"tracking.tracking_uri=sqlite:///{root}/store/mlflow.db", *FAST]
    sets = [a for o in overrides for a in ("--set", o)]
    rc = main(["-q", "sweep", "--params", str(repo / "params.yaml"), "--profile", "smoke", *sets,
               "--seeds", ",".join(map(str, SEEDS)), "--methods", ",".join(METHODS)])
    assert rc == 0
    p = load_params(repo / "params.yaml", "smoke", overrides)
    return p, json.loads((root / "metrics" / "sweep.json").read_text())


def _client(p):
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(p.tracking.tracking_uri)
    return MlflowClient(p.tracking.tracking_uri)


def _children(p, parent_id):
    import mlflow

    _client(p)
    return mlflow.search_runs(experiment_names=[p.tracking.experiment], output_format="list",
                              filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")


@pytest.mark.slow
def test_one_parent_with_one_child_per_method_and_seed(swept):
    p, result = swept
    client = _client(p)
    parent = client.get_run(result["parent_run_id"])
    assert parent.info.run_name == "sweep-smoke" and parent.info.status == "FINISHED"
    assert parent.data.tags["stage"] == "sweep" and "mlflow.parentRunId" not in parent.data.tags
    kids = _children(p, result["parent_run_id"])
    assert len(kids) == len(METHODS) * len(SEEDS) == 6
    got = {(r.data.tags["method"], int(r.data.tags["seed"])) for r in kids}
    assert got == {(m, k) for m in METHODS for k in SEEDS}
    for r in kids:
        assert r.info.run_name == f"sweep-{r.data.tags['method']}-seed{r.data.tags['seed']}"
        assert r.info.status == "FINISHED"
        assert set(r.data.metrics) == set(tables.METRICS)  # the same names in every child
    vanilla = [r for r in kids if r.data.tags["method"] == "vanilla"]
    assert all(r.data.metrics["rollouts"] == 0 for r in vanilla)  # the base, not trained
    lopd = [r for r in kids if r.data.tags["method"] == "lopd"]
    assert all(r.data.metrics["rollouts"] == p.distill.steps * p.distill.batch_tasks for r in lopd)


@pytest.mark.slow
def test_aggregate_artifact_equals_mean_and_std_of_the_children(swept, tmp_path):
    import mlflow
    import numpy as np
    from scipy import stats

    p, result = swept
    kids = _children(p, result["parent_run_id"])
    path = mlflow.artifacts.download_artifacts(run_id=result["parent_run_id"], artifact_path="sweep.csv", dst_path=str(tmp_path))
    rows = list(csv.DictReader(open(path)))
    chance = [r for r in rows if r["method"] == "chance"]  # no child run: the policies that learn nothing
    assert {r["metric"] for r in chance} == {"test_success_rate", "test_mean_reward", "test_success_pretrain", "test_success_new"}
    assert {(r["method"], r["metric"]) for r in rows if r not in chance} == {(m, k) for m in METHODS for k in tables.METRICS}
    parent = _client(p).get_run(result["parent_run_id"])
    for row in chance:
        evaluated = [json.loads((sweep.seed_root(p, k) / "metrics" / "evaluate.json").read_text())["chance"] for k in SEEDS]
        key = {"test_success_rate": "success_rate", "test_mean_reward": "mean_reward"}.get(row["metric"])
        vals = [e[key] if key else e["success_by_group"][row["metric"].removeprefix("test_success_")] for e in evaluated]
        assert [float(row[f"seed{k}"]) for k in SEEDS] == vals
        assert parent.data.metrics[f"chance/{row['metric']}/mean"] == pytest.approx(sum(vals) / len(vals), abs=1e-12)
    nonzero_std = 0
    for row in rows:
        if row in chance:
            continue
        vals = np.array([r.data.metrics[row["metric"]] for r in kids if r.data.tags["method"] == row["method"]])
        assert len(vals) == 2
        mean, std = vals.mean(), vals.std(ddof=1)
        half = stats.t.ppf(0.975, len(vals) - 1) * std / np.sqrt(len(vals))
        assert float(row["mean"]) == pytest.approx(mean, abs=1e-12)
        assert float(row["std"]) == pytest.approx(std, abs=1e-12)
        assert (float(row["ci_low"]), float(row["ci_high"])) == (pytest.approx(mean - half, abs=1e-9), pytest.approx(mean + half, abs=1e-9))
        assert parent.data.metrics[f"{row['method']}/{row['metric']}/mean"] == pytest.approx(mean, abs=1e-12)
        assert parent.data.metrics[f"{row['method']}/{row['metric']}/std"] == pytest.approx(std, abs=1e-12)
        nonzero_std += std > 0
    assert nonzero_std > 0  # the seeds did change something (else this test would prove little)
    md = mlflow.artifacts.download_artifacts(run_id=result["parent_run_id"], artifact_path="sweep.md", dst_path=str(tmp_path))
    assert open(md).read() == (p.root() / "metrics" / "sweep.md").read_text()
    assert open(path).read() == (p.root() / "metrics" / "sweep.csv").read_text()


@pytest.mark.slow
def test_each_seed_has_its_own_root_over_the_shared_inputs(swept):
    import mlflow

    p, result = swept
    assert result["shared_stages_run"] == ["bootstrap", "collect", "index", "cold_start"]  # lopd needs all four
    roots = [sweep.seed_root(p, k) for k in SEEDS]
    for k, r in zip(SEEDS, roots):
        assert (r / "models" / "student" / "config.json").exists()  # the seed's own student
        assert not (r / "models" / "student").is_symlink()
        assert (r / "models" / "base").is_symlink() and (r / "models" / "base").resolve() == layout.base_model_dir(p)
        assert (r / "data" / "bank").resolve() == layout.bank_dir(p)
        assert (r / "data" / "distill" / "bank").is_dir() and not (r / "data" / "distill" / "bank").is_symlink()
        ev = json.loads((r / "metrics" / "evaluate.json").read_text())
        assert set(ev) == {*METHODS, "chance"}
        assert ev["lopd"]["success_rate"] == result["per_seed"]["lopd"][str(k)]["test_success_rate"]
        assert ev["chance"]["success_rate"] == result["per_seed"]["chance"][str(k)]["test_success_rate"]
    assert roots[0] != roots[1]
    _client(p)
    runs = mlflow.search_runs(experiment_names=[p.tracking.experiment], output_format="list")
    boots = [r for r in runs if r.data.tags.get("stage") == "bootstrap"]
    assert len(boots) == 1 and boots[0].data.tags["sweep_run_id"] == result["parent_run_id"]  # shared: once
    # each method's distill run (its training curve) is nested under its (method, seed) child
    for m in METHODS:
        for k in SEEDS:
            child = result["children"][m][str(k)]
            nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == child]
            assert [r.info.run_name for r in nested] == [f"distill-{m}-seed{k}"]


@pytest.mark.slow
def test_every_run_carries_commit_params_hash_and_bank_hash(swept):
    import re

    import mlflow

    from lopd.ops.tracking import dvc_dir_hash

    p, _ = swept
    _client(p)
    runs = mlflow.search_runs(experiment_names=[p.tracking.experiment], output_format="list")
    bank_hash = dvc_dir_hash(layout.bank_dir(p))
    assert re.fullmatch(r"[0-9a-f]{32}\.dir", bank_hash)
    for r in runs:
        tags = r.data.tags
        assert re.fullmatch(r"[0-9a-f]{40}", tags["git_commit"]), tags  # the tests run inside the repo
        assert re.fullmatch(r"[0-9a-f]{12}", tags["params_hash"])
        # bootstrap runs before the bank exists; every later run reads (or, for collect, wrote) it
        want = "untracked" if tags["stage"] == "bootstrap" else bank_hash
        assert tags["bank_dvc_hash"] == want, (r.info.run_name, tags)
        assert tags["bank_dvc_source"] == ("untracked" if want == "untracked" else "computed")  # no dvc.lock here


def test_report_efficiency_is_each_seeds_own_and_plots_are_written(swept):
    from lopd.stages import distill

    p, result = swept
    eff = result["efficiency"]
    for k in SEEDS:
        details = json.loads((sweep.seed_root(p, k) / "metrics" / "distill.json").read_text())["details"]
        assert eff["per_seed"][str(k)] == json.loads(json.dumps(distill.efficiency(details)))
    fracs = [eff["per_seed"][str(k)]["rollouts_to_grpo_final_frac"] for k in SEEDS]
    assert eff["rollouts_to_grpo_final_frac"]["mean"] == pytest.approx(sum(fracs) / len(fracs))
    assert set(eff["rollouts_to_grpo_final_frac"]["per_seed"]) == {str(k) for k in SEEDS}
    assert all(0.0 <= f <= 1.0 for f in fracs) and eff["not_reached"] == [k for k in SEEDS if fracs[k] == 1.0 and
                                                                         not eff["per_seed"][str(k)]["grpo_final_reached"]]
    for rel in ("metrics/plots/dev_vs_rollouts.png", "metrics/plots/dev_vs_wall.png", "metrics/plots/lopd_dynamics.png",
                "metrics/plots/decisions.png"):
        assert (p.root() / rel).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and rel in result["plots"]
    md = (p.root() / "metrics" / "sweep.md").read_text()
    assert "## Efficiency" in md and "rollouts_to_grpo_final_frac" in md and "lopd " in md
    assert "tracking_uri" not in result and str(p.root()) not in json.dumps(result)  # no machine paths in metrics files
    artifacts = {a.path for a in _client(p).list_artifacts(result["parent_run_id"], "plots")}
    assert artifacts == {"plots/dev_vs_rollouts.png", "plots/dev_vs_wall.png", "plots/lopd_dynamics.png", "plots/ablation_dynamics.png",
                         "plots/decisions.png"}
    # per-seed efficiency in the json and the md; a degenerate seed is flagged (GRPO ends no higher than the base starts)
    for k in SEEDS:
        start = result["efficiency"]["base_dev_success"][str(k)]
        assert (k in eff["degenerate"]) == (eff["per_seed"][str(k)]["grpo_final_dev_success"] <= start)
        assert f"seed{k}: {fracs[k]:.3f}" in md
    assert "Degenerate:" in md


def test_one_command_gives_methods_chance_with_its_policies_and_the_profiles_ablation(swept):
    """``lopd sweep --profile smoke`` alone: every method, the chance row with the policy behind each figure,
    and the smoke profile's ablation (``frozen``) run over the same seeds as its own sweep and folded in."""
    p, result = swept
    assert set(result["aggregate"]) == {"chance", *METHODS}
    chance = result["chance"]
    evaluated = json.loads((sweep.seed_root(p, 0) / "metrics" / "evaluate.json").read_text())["chance"]
    assert chance["best"] == evaluated["best"] and set(chance["best"]) >= {"success_rate", "mean_reward"}
    assert set(chance["best"].values()) <= set(chance["policies"]) == set(evaluated["policies"])
    md = (p.root() / "metrics" / "sweep.md").read_text()
    assert f"test success `{chance['best']['success_rate']}`" in md
    [ab] = [a for a in result["ablations"] if a["name"] != "main"]
    assert ab["name"] == "sweep-frozen" and ab["changed"] == {"composer.frozen": "True"} and ab["seeds"] == SEEDS
    assert ab["aggregate"]["lopd"]["test_success_rate"]["n"] == len(SEEDS)
    assert (p.root() / "metrics" / "sweep-frozen.json").exists() and (p.root() / "runs" / "sweep-frozen" / "seed1").is_dir()
    assert "| lopd · sweep-frozen (composer.frozen=True) |" in md


@pytest.mark.slow
def test_an_ablation_sweep_joins_the_report_with_what_it_changed(swept, repo, capsys):
    p, _ = swept
    overrides = [f"paths.root={p.root()}", f"tracking.tracking_uri={p.tracking.tracking_uri}", *FAST]
    sets = [a for o in overrides for a in ("--set", o)]
    common = ["--params", str(repo / "params.yaml"), "--profile", "smoke", *sets]
    # an ablation over a subset of the main seeds (seed 1 only): the report adds the main run over that subset
    assert main(["-q", "sweep", *common, "--seeds", "1", "--methods", "lopd", "--name", "margin0", "--set", "distill.margin=0",
                 "--no-ablations"]) == 0
    assert (p.root() / "runs" / "margin0" / "seed1" / "metrics" / "distill.json").exists()
    assert main(["-q", "sweep-report", *common, "--ablation", "margin0"]) == 0
    out = json.loads((p.root() / "metrics" / "sweep.json").read_text())
    same_seeds, ab = out["ablations"]
    assert ab["name"] == "margin0" and ab["changed"] == {"distill.margin": "0.0"} and ab["seeds"] == [1]
    assert ab["aggregate"]["lopd"]["test_success_rate"]["n"] == 1 and ab["dynamics_final"]["delta"]["n"] == 1
    main_seed1 = out["per_seed"]["lopd"]["1"]["test_success_rate"]
    assert same_seeds["name"] == "main" and same_seeds["seeds"] == [1] and same_seeds["changed"] == {}
    assert same_seeds["aggregate"]["lopd"]["test_success_rate"]["mean"] == pytest.approx(main_seed1)
    assert (p.root() / "metrics" / "plots" / "ablation_dynamics.png").exists()
    printed = capsys.readouterr().out
    assert "lopd · margin0 (distill.margin=0.0, seeds 1)" in printed and "lopd · main (same params, seeds 1)" in printed
    assert main(["-q", "sweep-report", *common, "--ablation", "nope"]) == 1
    assert "nope.json" in capsys.readouterr().err


@pytest.mark.slow
def test_stale_shared_outputs_stop_the_sweep_before_any_run(swept):
    import mlflow

    p, _ = swept
    _client(p)
    before = len(mlflow.search_runs(experiment_names=[p.tracking.experiment], output_format="list"))
    stale = p.model_copy(update={"bootstrap": p.bootstrap.model_copy(update={"lr": p.bootstrap.lr * 2})})
    with pytest.raises(sweep.SweepError, match=r"bootstrap outputs .* other params \(bootstrap.lr\)"):
        sweep.run(stale, [0], ["grpo"])
    assert len(mlflow.search_runs(experiment_names=[p.tracking.experiment], output_format="list")) == before


@pytest.mark.slow
def test_prefect_flow_calls_the_sweep(swept, repo):
    """The flow's body (``.fn``: no Prefect server) reuses the shared outputs; vanilla at a third seed."""
    from flows.sweep_flow import sweep_flow

    p, first = swept
    overrides = [f"paths.root={p.root()}", f"tracking.tracking_uri={p.tracking.tracking_uri}", *FAST]
    assert sweep_flow.name == "lopd-sweep"
    out = sweep_flow.fn(str(repo / "params.yaml"), "smoke", overrides, seeds=[2], methods=["vanilla"])
    assert out["shared_stages_run"] == [] and out["parent_run_id"] != first["parent_run_id"]
    assert len(_children(p, out["parent_run_id"])) == 1
    assert set(out["per_seed"]["vanilla"]["2"]) == set(tables.METRICS)


@pytest.mark.slow
def test_sweeps_over_other_seeds_join_one_report_and_other_params_are_refused(swept, repo, capsys):
    """One sweep's seeds run as two processes (``--name sweep-b``) fold into one table; a changed param is refused."""
    p, _ = swept
    overrides = [f"paths.root={p.root()}", f"tracking.tracking_uri={p.tracking.tracking_uri}", *FAST]
    common = ["--params", str(repo / "params.yaml"), "--profile", "smoke", *[a for o in overrides for a in ("--set", o)]]
    for name, seeds, extra in (("parta", "0", []), ("partb", "1,2", []), ("partc", "3", ["--set", "evaluate.samples_per_task=2"])):
        assert main(["-q", "sweep", *common, "--seeds", seeds, "--methods", "vanilla", "--name", name, *extra]) == 0
    capsys.readouterr()
    assert main(["-q", "sweep-report", *common, "--name", "parta", "--join", "partb"]) == 0
    joined = json.loads((p.root() / "metrics" / "parta.json").read_text())
    assert joined["seeds"] == [0, 1, 2] and joined["seed_dirs"] == {"1": "runs/partb/seed1", "2": "runs/partb/seed2"}
    assert joined["aggregate"]["vanilla"]["test_success_rate"]["n"] == 3
    partb = json.loads((p.root() / "metrics" / "partb.json").read_text())
    assert joined["per_seed"]["vanilla"]["2"] == partb["per_seed"]["vanilla"]["2"]
    assert "seeds 0, 1, 2" in (p.root() / "metrics" / "parta.md").read_text()
    assert main(["-q", "sweep-report", *common, "--name", "parta", "--join", "partb"]) == 0  # a second report: joined already
    assert json.loads((p.root() / "metrics" / "parta.json").read_text())["seeds"] == [0, 1, 2]
    assert main(["-q", "sweep-report", *common, "--name", "parta", "--join", "partc"]) == 1
    assert "ran other params (evaluate.samples_per_task=2)" in capsys.readouterr().err
    assert json.loads((p.root() / "metrics" / "parta.json").read_text())["seeds"] == [0, 1, 2]  # nothing written
