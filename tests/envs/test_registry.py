"""The environment registry: built-ins by name, a user's own by ``package.module:factory``, and every
bad ``env.name`` refused when params load, with the field and the fix."""

from __future__ import annotations

import pytest

from lopd.config import ParamsError, load_params
from lopd.envs.registry import BUILTINS, Environment, get_environment, resolve


def _params(repo, *sets):
    return load_params(repo / "params.yaml", "smoke", list(sets))


def test_the_default_is_toolworld_with_its_report_groups_and_hooks(repo):
    env = get_environment(_params(repo))
    assert env.name == "toolworld" and set(env.groups) == {"pretrain", "new"}
    assert env.expert and env.pretraining and env.chance and env.convention_start
    task = env.tasks("dev", 2)[0]
    assert env.group(task) in env.groups and env.play(task, env.expert())["success"]
    assert get_environment(_params(repo)) is env  # built once per params


def test_builtins_are_named_lazily_and_resolve(repo):
    assert set(BUILTINS) == {"toolworld", "code", "bfcl_multi_turn"}
    for name in BUILTINS:
        assert callable(resolve(name))


@pytest.mark.parametrize("name, message", [
    ("tool_world", r"env.name = 'tool_world' is not an environment: use one of \['bfcl_multi_turn', 'code', 'toolworld'\] "
                   r"or your own as package.module:factory"),
    ("no_such_pkg.envs:make", r"env.name = 'no_such_pkg.envs:make': cannot import 'no_such_pkg.envs'.*PYTHONPATH"),
    ("lopd.envs.registry:nope", r"module 'lopd.envs.registry' has no 'nope'; name the function"),
    ("lopd.envs.registry:SPLITS", r"is not callable; it must be a function params -> Environment"),
])
def test_a_bad_env_name_is_one_line_naming_the_field_and_the_fix(repo, name, message):
    with pytest.raises(ParamsError, match=message):
        _params(repo, f"env.name={name}")


def test_a_factory_must_return_an_environment(repo, monkeypatch, tmp_path):
    (tmp_path / "not_an_env.py").write_text("def make(params):\n    return {'name': 'x'}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"env.name = 'not_an_env:make': the factory returned dict, not lopd.envs.registry.Environment"):
        get_environment(_params(repo, "env.name=not_an_env:make"))


def test_a_user_environment_gets_its_options(repo, monkeypatch):
    monkeypatch.syspath_prepend(str(repo / "examples"))
    p = _params(repo, "env.name=echo_env:make", "env.options={hint: false}")
    env = get_environment(p)
    assert isinstance(env, Environment) and env.name == "echo"
    task = env.tasks("test", 1)[0]
    step = env.make_env(task).step("nope")
    assert step.observation == "wrong" and not step.done  # hint: false, and a second try
    assert {t.task_id for t in env.tasks("train", 99)}.isdisjoint(t.task_id for t in env.tasks("test", 99))


def test_bfcl_is_a_test_only_environment(repo):
    env = get_environment(_params(repo, "env.name=bfcl_multi_turn"))
    assert len(env.tasks("test", 2)) == 2
    with pytest.raises(ValueError, match="no train split"):
        env.tasks("train", 1)


def test_code_without_its_sandbox_fails_in_one_line_before_any_compute(repo, tmp_path, monkeypatch, capsys):
    import lopd.envs.code.environment as code_env
    from lopd.cli import main

    monkeypatch.setattr(code_env, "sandbox_unavailable_reason", lambda: "user namespaces are disabled here")
    rc = main(["-q", "bootstrap", "--params", str(repo / "params.yaml"), "--profile", "smoke",
               "--set", f"paths.root={tmp_path}", "--set", "env.name=code"])
    err = capsys.readouterr().err
    assert rc == 2 and "env.name = code needs the code sandbox" in err and "user namespaces are disabled here" in err
    assert not (tmp_path / "models").exists()
