"""The embedded base's pre-training data: pre-training apps only, experiences that show an app's
conventions, fresh synthetic apps, distractors; and the committed base's recipe check."""

from __future__ import annotations

import re

import pytest

from lopd.config import ParamsError, load_params
from lopd.envs.toolworld import SYNTHETIC_APPS, pretrain_apps
from lopd.envs.toolworld.apps import conventions
from lopd.envs.toolworld.families import REGISTRY
from lopd.latent.teacher import LATENT_FRAMING
from lopd.policy import base_asset
from lopd.stages.bootstrap import demonstrations, with_experiences

HEAD = LATENT_FRAMING.split("{placeholder}")[0]
APP_RE = re.compile(r"(?:^|Task: )At (\w+), ")


def _params(**overrides):
    sets = [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()]
    return load_params("params.yaml", None, ["bootstrap.n_demos=160", *sets])


def _experiences(messages) -> list[str]:
    system = messages[0]["content"]
    return system.split(HEAD, 1)[1].split("\n\n") if HEAD in system else []


def test_demos_come_from_pretraining_apps_only_and_are_seeded():
    p = _params()
    demos, plain, info = demonstrations(p)
    allowed = {a for f in REGISTRY for a in pretrain_apps(f, p.toolworld.pretrain_apps)}
    assert len(demos) == len(plain) == info["n_demos"] == 160
    assert {APP_RE.search(m[1]["content"]).group(1) for m, _, _ in plain} <= allowed
    assert all(HEAD not in m[0]["content"] for m, _, _ in plain)  # the plain phase sees no experiences
    assert (demos, info) == demonstrations(p)[::2]
    assert info["demos_plain"] + info["demos_same_app"] + info["demos_fresh_app"] + info["demos_unseen_app"] == 160
    assert 0 < info["demos_same_app"] and 0 < info["demos_fresh_app"] and 0 < info["demos_distractors"]
    # an unseen-app demo: a synthetic app, no experiences, so nothing tells its conventions
    unseen = [m for m, _, _ in demos if APP_RE.search(m[1]["content"]).group(1) in SYNTHETIC_APPS and HEAD not in m[0]["content"]]
    assert len(unseen) == info["demos_unseen_app"] > 0


def test_experiences_show_the_apps_conventions_and_distractors_come_from_other_apps():
    p = _params(bootstrap__experience_frac=1.0, bootstrap__distractor_frac=0.0, bootstrap__unseen_app_frac=0.0)
    demos, plain, info = demonstrations(p)
    assert info["demos_distractors"] == 0
    n_fresh, n_bare = 0, 0
    for (messages, actions, _), (bare, _, _) in zip(demos, plain):
        exps = _experiences(messages)
        app = APP_RE.search(messages[1]["content"]).group(1)
        if not exps:  # only where the app has no other successful demo to show
            n_bare += 1
            continue
        assert len(exps) <= p.bootstrap.experience_max
        assert {APP_RE.search(x).group(1) for x in exps} == {app}  # every experience is from the demo's own app
        assert all(x.startswith("Task: ") and "answer:" in x for x in exps)  # observation-lite successes
        assert messages[1:] == bare[1:] or app in SYNTHETIC_APPS  # a same-app demo only gains the framing
        n_fresh += app in SYNTHETIC_APPS
    assert 0 < n_fresh < len(demos) and n_bare == info["demos_plain"] <= len(demos) // 20
    # with every slot a distractor, no experience is from the demo's app
    demos, _, info = demonstrations(_params(bootstrap__experience_frac=1.0, bootstrap__distractor_frac=1.0,
                                            bootstrap__unseen_app_frac=0.0))
    for messages, _, _ in demos:
        app = APP_RE.search(messages[1]["content"]).group(1)
        assert app not in {APP_RE.search(x).group(1) for x in _experiences(messages)}


def test_a_fresh_app_demo_follows_the_conventions_its_experiences_show():
    p = _params(bootstrap__experience_frac=1.0, bootstrap__fresh_app_frac=1.0, bootstrap__distractor_frac=0.0)
    demos, _, _ = demonstrations(p)
    checked = 0
    for messages, actions, _ in demos:
        exps = _experiences(messages)
        shows_cents = ["00}}" in x or "00, " in x for x in exps if '"amount"' in x]
        if shows_cents and '"amount"' in " ".join(actions) and len(set(shows_cents)) == 1:
            pays = [a for a in actions if '"name": "pay"' in a]
            task_dollars = re.search(r"\$(\d+)", messages[1]["content"]).group(1)
            want = f'"amount": {task_dollars}00' if shows_cents[0] else f'"amount": {task_dollars}}}'
            checked += any(want in a for a in pays)
    assert checked > 0  # the noisy expert follows the drawn conventions in most demos


def test_with_experiences_only_adds_the_framing_to_the_system_message():
    demo = ([{"role": "system", "content": "tools"}, {"role": "user", "content": "At X, pay Bob $3."}], ["a"], ["o"])
    assert with_experiences(demo, []) is demo
    out = with_experiences(demo, ["Task: one", "Task: two"])
    assert out[1:] == demo[1:] and out[0][1] == demo[0][1]
    assert out[0][0]["content"] == "tools\n\n" + LATENT_FRAMING.format(placeholder="Task: one\n\nTask: two")
    assert demo[0][0]["content"] == "tools"  # not mutated


def test_the_committed_base_is_refused_for_params_it_was_not_built_with(tmp_path):
    p = _params()
    record = {"recipe": base_asset.recipe(p), "metrics": {}, "pretrain_s": 1.0, "pretrain_steps": 1}
    (tmp_path / base_asset.RECORD).write_text(__import__("json").dumps(record))
    assert base_asset.check_recipe(p, tmp_path) == record
    assert "bootstrap.source" not in record["recipe"] and "model.path" not in record["recipe"]
    assert "toolworld.world_seed" in record["recipe"] and "bootstrap.lr" in record["recipe"]
    with pytest.raises(ParamsError, match=r"toolworld.world_seed = 1 \(committed base: 0\).*bootstrap.source=train"):
        base_asset.check_recipe(_params(toolworld__world_seed=1), tmp_path)
    assert base_asset.check_recipe(_params(bootstrap__eval_dev_tasks=7), tmp_path)  # evaluation sizes are not the recipe
    with pytest.raises(FileNotFoundError, match="bootstrap.source=train"):
        base_asset.read_record(tmp_path / "nothing")
    assert conventions("banking", "Northwind") == conventions("banking", "Northwind", 0)
