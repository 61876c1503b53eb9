"""Typed params: defaults match params.yaml, profiles load, and every mistake is one clear line."""

import pytest
import yaml

from lopd.cli import main
from lopd.config import Params, ParamsError, load_params, parse_set


def test_params_yaml_holds_every_field_with_its_default(repo):
    raw = yaml.safe_load((repo / "params.yaml").read_text())
    p = load_params(repo / "params.yaml", profile=None)
    assert p == Params()  # params.yaml is exactly the paper defaults
    for name, section in Params.model_fields.items():
        if name == "profile":
            continue
        ann = section.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            assert set(raw[name]) == set(ann.model_fields), f"params.yaml section {name} misses keys"


def test_spec_defaults(repo):
    p = load_params(repo / "params.yaml", profile=None)
    assert (p.retrieval.n_ret, p.composer.num_latents, p.composer.depth) == (3, 32, 8)
    assert (p.composer.lora_r, p.composer.lora_alpha) == (8, 16)
    assert (p.distill.margin, p.distill.anchor_lambda, p.distill.eta_beta, p.distill.beta0) == (0.05, 0.2, 0.5, 0.0)
    assert (p.distill.top_m, p.distill.kl_support, p.env.success_threshold) == (20, "teacher", 0.8)
    assert (p.rollout.temperature, p.rollout.top_p) == (0.7, 0.95)
    assert (p.distill.student_lr, p.distill.composer_lr, p.distill.grad_clip, p.distill.batch_tasks, p.distill.steps) == (
        1e-5, 1e-5, 1.0, 32, 100)


@pytest.mark.parametrize("profile", ["smoke", "demo"])
def test_profiles_load(repo, profile):
    p = load_params(repo / "params.yaml", profile=profile)
    assert p.profile == profile


def test_set_overrides_parse_yaml_values(repo):
    p = load_params(repo / "params.yaml", "smoke", ["distill.margin=0.1", "distill.methods=[lopd]", "model.path=null"])
    assert p.distill.margin == 0.1 and p.distill.methods == ["lopd"] and p.model.path is None
    assert parse_set("a.b=3") == (["a", "b"], 3)


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        ("distill.margin=-0.5", "distill.margin", "greater than or equal to 0"),
        ("composer.num_latents=0", "composer.num_latents", "greater than or equal to 1"),
        ("retrieval.n_ret=0", "retrieval.n_ret", "greater than or equal to 1"),
        ("env.success_threshold=1.5", "env.success_threshold", "less than or equal to 1"),
        ("distill.batch_tasks=0", "distill.batch_tasks", "greater than or equal to 1"),
        ("rollout.top_p=abc", "rollout.top_p", "valid number"),
        ("distill.kl_support=both", "distill.kl_support", "'teacher' or 'student'"),
    ],
)
def test_bad_values_name_key_value_and_rule(repo, override, key, allowed):
    with pytest.raises(ParamsError) as e:
        load_params(repo / "params.yaml", "smoke", [override])
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert key in msg and override.split("=")[1] in msg and allowed in msg


def test_unknown_key_lists_allowed(repo):
    with pytest.raises(ParamsError, match=r"unknown key 'distill.margn' \(allowed here: methods, steps"):
        load_params(repo / "params.yaml", "smoke", ["distill.margn=0.1"])


def test_cross_field_rule(repo):
    with pytest.raises(ParamsError, match="num_kv_heads = 3 must divide model.num_heads = 4"):
        load_params(repo / "params.yaml", "demo", ["model.num_kv_heads=3"])


def test_bad_set_syntax_and_unknown_profile(repo):
    with pytest.raises(ParamsError, match="expected KEY=VALUE"):
        load_params(repo / "params.yaml", "smoke", ["distill.margin"])
    with pytest.raises(ParamsError, match="known profiles: demo, smoke"):
        load_params(repo / "params.yaml", "nope")


def test_cli_rejects_bad_params_before_compute(repo, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(repo)
    rc = main(["bootstrap", "--profile", "smoke", "--set", "distill.margin=-1", "--set", f"paths.root={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: params: distill.margin = -1")
    assert list(tmp_path.iterdir()) == []  # nothing was computed or written


def test_model_path_that_is_not_a_checkpoint_fails_before_compute(repo, tmp_path, capsys):
    rc = main(["bootstrap", "--params", str(repo / "params.yaml"), "--profile", "smoke",
               "--set", f"paths.root={tmp_path}", "--set", f"model.path={tmp_path / 'nope'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "model.path" in err and "no config.json" in err
    assert list(tmp_path.iterdir()) == []


def test_distill_method_flag_selects_methods_through_params(repo):
    from lopd.cli import build_parser, stage_overrides

    args = build_parser().parse_args(["distill", "--params", str(repo / "params.yaml"), "--method", "grpo", "--method", "lopd"])
    p = load_params(args.params, None, stage_overrides(args))
    assert p.distill.methods == ["grpo", "lopd"]
    bad = build_parser().parse_args(["distill", "--params", str(repo / "params.yaml"), "--method", "ppo"])
    with pytest.raises(ParamsError, match="distill.methods"):
        load_params(bad.params, None, stage_overrides(bad))


@pytest.mark.parametrize("ablations, words", [
    ("[{name: x, set: {composer.frozn: true}}]", "sweep.ablations[0] (x).set: unknown key 'composer.frozn'"),
    ("[{name: x, set: {distill.margin: -1}}]", "sweep.ablations[0] (x).set: distill.margin = -1 is invalid"),
    ("[{name: x, set: {}}]", "sweep.ablations: set is empty"),
    ("[{name: Joint, set: {composer.frozen: false}}]", "sweep.ablations: name 'Joint' is invalid"),
    ("[{name: x, set: {a.b: 1}}, {name: x, set: {a.b: 2}}]", "appear more than once"),
    ("[{name: x, set: {sweep.ablations: []}}]", "key 'sweep.ablations' is invalid"),
])
def test_sweep_ablations_are_checked_before_compute(repo, ablations, words):
    with pytest.raises(ParamsError) as e:
        load_params(repo / "params.yaml", "smoke", [f"sweep.ablations={ablations}"])
    assert words in str(e.value) and "\n" not in str(e.value)


def test_profiles_list_their_ablations(repo):
    demo = load_params(repo / "params.yaml", "demo")
    assert [(a.name, a.set) for a in demo.sweep.ablations] == [("joint", {"composer.frozen": False})]
    assert len(load_params(repo / "params.yaml", "smoke").sweep.ablations) == 1
    assert load_params(repo / "params.yaml", None).sweep.ablations == []
