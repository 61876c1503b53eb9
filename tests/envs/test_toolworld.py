"""ToolWorld: apps with hidden conventions, task splits, the environment protocol, checklist rewards and the experts."""

from __future__ import annotations

import dataclasses
import json
import itertools
import random
import re

import pytest

from lopd.envs.toolworld import (FAMILIES, NoisyExpert, ScriptedExpert, StepResult, ToolWorldEnv, app_group,
                                 entity_words, format_tool_call, make_tasks, parse_action, pretrain_apps,
                                 random_conventions, run_episode, system_prompt)
from lopd.envs.toolworld.apps import SYNTHETIC_APPS, conventions
from lopd.envs.toolworld.experts import observed, render
from lopd.envs.toolworld.families import REGISTRY
from lopd.envs.toolworld.families.base import ID_RE, ROLES
from lopd.envs.toolworld.tasks import Task, content_signature

SPLITS = ("train", "dev", "test")


def success_rate(tasks, agent) -> float:
    return sum(run_episode(ToolWorldEnv(t), agent)["success"] for t in tasks) / len(tasks)


def task_with(family: str, **want) -> Task:
    """The first dev task of ``family``, its app's conventions set as in ``want`` (a world need not
    hold every combination)."""
    task = make_tasks("dev", 1, families=[family])[0]
    return dataclasses.replace(task, conventions={**task.conventions, **want})


def play(task: Task, believed: dict) -> tuple[dict, list]:
    """The scripted plan under ``believed`` conventions (not the app's), the errors it met, and the final info."""
    env, history = ToolWorldEnv(task), []
    family = REGISTRY[task.family]
    while True:
        action = render(family.next_step(task.goal, believed, observed(history)))
        result = env.step(action)
        history.append((action, result.observation))
        if result.done:
            return result.info, history


@pytest.mark.parametrize("split", SPLITS)
def test_expert_solves_every_split(split):
    assert success_rate(make_tasks(split, 400), ScriptedExpert()) >= 0.99


def test_splits_are_disjoint_by_id_and_content_and_cover_every_app():
    tasks = {s: make_tasks(s, 400) for s in SPLITS}
    for a, b in [("train", "dev"), ("train", "test"), ("dev", "test")]:
        assert not {t.task_id for t in tasks[a]} & {t.task_id for t in tasks[b]}
        assert not ({content_signature(t.family, t.goal) for t in tasks[a]}
                    & {content_signature(t.family, t.goal) for t in tasks[b]})
    assert all(t.split == s for s, ts in tasks.items() for t in ts)
    every_app = {(f, a) for f in FAMILIES for a in REGISTRY[f].apps}
    assert all({(t.family, t.app) for t in ts} == every_app for ts in tasks.values())


def test_make_tasks_is_deterministic_prefix_stable_round_robin_and_filters_apps():
    assert make_tasks("train", 50, seed=3) == make_tasks("train", 50, seed=3)
    assert make_tasks("train", 120, seed=3)[:50] == make_tasks("train", 50, seed=3)
    assert make_tasks("train", 50, seed=3) != make_tasks("train", 50, seed=4)
    assert [t.family for t in make_tasks("dev", 8)] == FAMILIES * 2
    assert {t.family for t in make_tasks("dev", 6, families=["shop"])} == {"shop"}
    assert make_tasks("dev", 1)[0].task_id == "bank-dev-00000"
    only = {f: pretrain_apps(f, 2) for f in FAMILIES}
    filtered = make_tasks("train", 80, apps=only, tag="demo")
    assert {t.app for t in filtered} == {a for apps in only.values() for a in apps}
    assert all("-demo-" in t.task_id for t in filtered)
    json.dumps([t.goal for t in make_tasks("test", 40)])
    with pytest.raises(ValueError):
        make_tasks("valid", 3)


def test_every_split_at_its_default_size_holds_unique_tasks():
    sizes = {"train": 4000, "dev": 300, "test": 300}
    for split, n in sizes.items():
        tasks = make_tasks(split, n)
        assert len({content_signature(t.family, t.goal) for t in tasks}) == n
        assert len({t.text for t in tasks}) == n
    demos = make_tasks("train", 3000, apps={f: pretrain_apps(f, 4) for f in FAMILIES}, tag="demo")
    assert len({content_signature(t.family, t.goal) for t in demos}) == 3000


def test_apps_take_turns_pre_training_and_new_alternately_so_short_prefixes_hold_both_groups():
    tasks = make_tasks("dev", 64)
    for family in FAMILIES:
        apps = [t.app for t in tasks if t.family == family]
        assert len(set(apps)) == 8 and [app_group(family, a, 4) for a in apps[:2]] == ["pretrain", "new"]
    groups = [app_group(t.family, t.app, 4) for t in make_tasks("dev", 16)]
    assert groups.count("pretrain") == groups.count("new") == 8


def test_asking_for_more_tasks_than_the_content_space_holds_names_the_fix():
    with pytest.raises(ValueError, match=r"content is nearly exhausted.*env\.n_test"):
        make_tasks("test", 200, families=["shop"], apps={"shop": ("Cornershop",)})


def _options(family: str, apps, world_seed: int, n_pretrain: int = 4) -> list[tuple[int, ...]]:
    """Each app's conventions as option indices, e.g. ``(0, 1, 1)``."""
    opts = REGISTRY[family].options
    return [tuple(opts[k].index(v) for k, v in conventions(family, a, world_seed, n_pretrain).items()) for a in apps]


PAIRS = [(0, 1), (0, 2), (1, 2)]


@pytest.mark.parametrize("world_seed", range(5))
@pytest.mark.parametrize("family", FAMILIES)
def test_conventions_are_balanced_within_each_group_and_no_pattern_carries_over(family, world_seed):
    """The balance rule (apps.py): within the pre-training apps and within the new apps, every
    option of every convention is held by exactly half of the apps; and any relation between two
    conventions (or all three) that holds at every pre-training app holds at exactly half of the
    new apps, so no family-wide habit of the pre-training apps is right or wrong at new apps."""
    apps = REGISTRY[family].apps
    assert len(apps) == 8
    pre, new = _options(family, apps[:4], world_seed), _options(family, apps[4:], world_seed)
    for group in (pre, new):
        assert all(sum(x[c] for x in group) == 2 for c in range(3))
        assert len(set(group)) == 4  # four different apps, not two copies
    relations = [lambda x, i=i, j=j: x[i] ^ x[j] for i, j in PAIRS] + [lambda x: x[0] ^ x[1] ^ x[2]]
    for rel in relations:
        if len({rel(x) for x in pre}) == 1:
            assert sum(rel(x) == rel(pre[0]) for x in new) == 2
    assert sum(len({rel(x) for x in pre}) == 1 for rel in relations) == 1  # one relation per group
    for group in (pre, new):  # no fixed guess of the silent pair (format, commit) fits two apps
        assert sorted((x[0], x[2]) for x in group) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert _options(family, apps, world_seed) == _options(family, apps, world_seed)  # deterministic


@pytest.mark.parametrize("world_seed", range(5))
def test_conditional_balance_no_rule_that_reads_the_check_fits_more_than_a_quarter_of_a_group(world_seed):
    """The conditional balance (apps.py): within each group, across the families, for each check
    setting every (format as literal or other, commit) pair is held by the same number of apps;
    so each of the 16 rules that map the check to a (format, commit) choice fits exactly a quarter."""
    choice = {}  # (group, check) -> [(literal?, commit) per app]
    for family in FAMILIES:
        fam = REGISTRY[family]
        for i, app in enumerate(fam.apps):
            c = conventions(family, app, world_seed)
            key = ("pretrain" if i < 4 else "new", c["prereq"])
            choice.setdefault(key, []).append((c["format"] == fam.literal_format, c["commit"]))
    pairs = list(itertools.product((True, False), ("required", "auto")))
    for (group, check), got in choice.items():
        assert len(got) == 2 * len(FAMILIES) and {p: got.count(p) for p in pairs} == dict.fromkeys(pairs, len(got) // 4), (group, check)
    for group in ("pretrain", "new"):
        n_apps = sum(len(v) for (g, _), v in choice.items() if g == group)
        for when_check, when_not in itertools.product(pairs, repeat=2):
            right = choice[group, "required"].count(when_check) + choice[group, "none"].count(when_not)
            assert right * 4 == n_apps, (group, when_check, when_not)


@pytest.mark.parametrize("n_pretrain", [2, 3, 5, 6])
def test_other_group_sizes_are_as_balanced_as_their_counts_allow(n_pretrain):
    for family in FAMILIES:
        apps = REGISTRY[family].apps
        for group in (apps[:n_pretrain], apps[n_pretrain:]):
            counts = [sum(x[c] for x in _options(family, group, 0, n_pretrain)) for c in range(3)]
            assert all(abs(2 * k - len(group)) <= 1 for k in counts), (family, group, counts)


def test_conventions_are_a_function_of_family_app_and_world_seed():
    for family, fam in REGISTRY.items():
        for app in fam.apps:
            assert all(v in fam.options[k] for k, v in conventions(family, app).items())
        assert [conventions(family, a) for a in fam.apps] == [conventions(family, a, 0, 4) for a in fam.apps]
    assert any(conventions(f, REGISTRY[f].apps[0], 0) != conventions(f, REGISTRY[f].apps[0], 1) for f in FAMILIES)
    assert {t.conventions == conventions(t.family, t.app) for t in make_tasks("dev", 40)} == {True}
    with pytest.raises(ValueError, match="unknown banking app"):
        conventions("banking", "Nowhere")
    rng = random.Random(0)
    assert {tuple(random_conventions("shop", rng).values()) for _ in range(200)} == set(
        __import__("itertools").product(*REGISTRY["shop"].options.values()))
    assert app_group("banking", REGISTRY["banking"].apps[0], 4) == "pretrain"
    assert app_group("banking", REGISTRY["banking"].apps[5], 4) == "new"


def test_the_prompt_lists_tool_signatures_only_and_the_task_names_the_app():
    for family, fam in REGISTRY.items():
        assert [t.role for t in fam.tools] == list(ROLES)
        prompt = system_prompt(family)
        assert all(t.signature() in prompt for t in fam.tools)
        # Nothing about an app's conventions: no format option, no app name, short.
        words = set(re.findall(r"\w+", prompt))
        assert not words & {*fam.formats, *fam.apps, "required", "cents", "dollars", "first"}
        assert len(prompt.split()) <= 20
    for task in make_tasks("dev", 24):
        messages = ToolWorldEnv(task).initial_observation()
        assert [m["role"] for m in messages] == ["system", "user"]
        assert messages[0]["content"] == system_prompt(task.family)  # the same for every app of a family
        assert messages[1]["content"] == task.text and task.text.startswith(f"At {task.app}, ")


def test_a_wrong_format_or_a_missing_commit_fails_silently():
    fam = REGISTRY["banking"]
    for key in ("format", "commit"):
        task = task_with("banking", commit="required")
        believed = dict(task.conventions)
        a, b = fam.options[key]
        believed[key] = b if believed[key] == a else a
        info, history = play(task, believed)
        assert not info["success"] and info["error"] is None
        assert not any(o and "error" in json.loads(o) for _, o in history)  # no error message told the agent
        failed = [k for k, ok in info["checks"].items() if not ok]
        assert failed == (["value"] if key == "format" else ["committed"])


def test_a_missing_prerequisite_is_an_error_that_a_retry_fixes():
    task = task_with("calendar", prereq="required")
    info, history = play(task, {**task.conventions, "prereq": "none"})
    assert not info["success"]
    assert any(o and json.loads(o).get("error") == REGISTRY["calendar"].prereq_error for _, o in history)
    env = ToolWorldEnv(task)  # the expert, after a mistaken call, recovers and succeeds
    expert = ScriptedExpert()
    first = env.step(expert.act(task, []))
    hist = [(format_tool_call("find_contact", {"name": task.goal["name"]}), first.observation)]
    contact = json.loads(first.observation)["id"]
    bad = format_tool_call("create_event", REGISTRY["calendar"].main_args(task.goal, task.conventions["format"], contact, {}))
    err = env.step(bad)
    assert json.loads(err.observation) == {"error": REGISTRY["calendar"].prereq_error} and not err.done
    hist.append((bad, err.observation))
    while not (r := env.step(action := expert.act(task, hist))).done:
        hist.append((action, r.observation))
    assert r.info["success"]


def test_a_needless_check_is_an_error_and_a_needless_commit_submits_twice_silently():
    task = task_with("shop", prereq="none", commit="auto")
    info, history = play(task, {**task.conventions, "prereq": "required"})
    assert not info["success"]  # the believed plan keeps checking; the app keeps refusing
    assert any(o and json.loads(o).get("error") == "check_stock is not available here" for _, o in history)
    info, history = play(task, {**task.conventions, "commit": "required"})
    assert not info["success"] and [k for k, ok in info["checks"].items() if not ok] == ["single"]
    assert not any(o and "error" in json.loads(o) for _, o in history)
    task = task_with("shop", commit="required")  # committing twice where commits exist is an error, not a duplicate
    env = ToolWorldEnv(task)
    env.backend.records["ord_10"] = {"args": {}, "committed": True}
    assert "already done" in json.loads(env.step(format_tool_call("confirm_order", {"order_id": "ord_10"})).observation)["error"]


def test_parse_and_format_round_trip():
    text = format_tool_call("pay", {"payee_id": "py_12", "amount": 3400})
    assert text == '<tool_call>{"name": "pay", "arguments": {"payee_id": "py_12", "amount": 3400}}</tool_call>'
    assert parse_action(text) == ({"name": "pay", "arguments": {"payee_id": "py_12", "amount": 3400}}, None)
    assert parse_action("All done.") == (None, None)
    for bad in ['<tool_call>{"name": "x", </tool_call>', "<tool_call>{}", text + text]:
        call, error = parse_action(bad)
        assert call is None and error


@pytest.mark.parametrize("action, message", [
    ('<tool_call>{"name": "find_payee", "arguments": {"name": </tool_call>', "malformed"),
    (format_tool_call("delete_everything", {}), "unknown tool"),
    (format_tool_call("verify_payee", {"payee_id": "py_99"}), "unknown payee id py_99"),
    (format_tool_call("verify_payee", {}), "missing argument"),
    (format_tool_call("pay", {"payee_id": "a", "amount": 12.5}), "must be int"),
])
def test_bad_actions_give_error_observations_and_the_episode_goes_on(action, message):
    env = ToolWorldEnv(task_with("banking", prereq="required"))  # the check tool exists at this app
    result = env.step(action)
    assert isinstance(result, StepResult) and not result.done and result.reward == 0.0
    assert message in json.loads(result.observation)["error"]
    assert result.info["error"] and result.info["short"].startswith("error:")
    ok = env.step(format_tool_call("find_payee", {"name": env.task.goal["name"]}))
    assert not ok.done and ok.info["error"] is None and ID_RE.match(json.loads(ok.observation)["id"])


def test_turn_limit_ends_the_episode():
    env = ToolWorldEnv(task_with("banking"), max_turns=3)
    results = [env.step(format_tool_call("nope", {})) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["success"] is False and "checks" in results[-1].info
    with pytest.raises(RuntimeError):
        env.step("Done.")


def test_an_episode_cut_at_the_turn_limit_is_not_a_success_even_with_every_check_met():
    task = task_with("banking", format="dollars", prereq="none", commit="auto")
    plan = [ScriptedExpert().act(task, [])]
    env = ToolWorldEnv(task, max_turns=2)
    first = env.step(plan[0])
    payee = json.loads(first.observation)["id"]
    cut = env.step(format_tool_call("pay", {"payee_id": payee, "amount": task.goal["dollars"]}))
    assert cut.done and cut.reward == 1.0 and cut.info["truncated"] and cut.info["success"] is False
    finished = ToolWorldEnv(task, max_turns=3)
    finished.step(plan[0])
    finished.step(format_tool_call("pay", {"payee_id": payee, "amount": task.goal["dollars"]}))
    done = finished.step("Done.")
    assert done.reward == 1.0 and not done.info["truncated"] and done.info["success"] is True


def test_reward_is_the_checklist_fraction_and_success_needs_all_four_items():
    task = task_with("banking", format="cents", prereq="none", commit="auto")
    env = ToolWorldEnv(task)
    payee = json.loads(env.step(format_tool_call("find_payee", {"name": task.goal["name"]})).observation)["id"]
    env.step(format_tool_call("pay", {"payee_id": payee, "amount": task.goal["dollars"]}))  # dollars, not cents
    final = env.step("Done.")
    assert final.done and final.observation is None
    assert final.info["checks"] == {"entity": True, "value": False, "committed": True, "single": True}
    assert final.reward == 0.75 and final.info["success"] is False


def test_noisy_expert_degrades_smoothly_and_is_deterministic():
    tasks = make_tasks("dev", 300)
    rates = [success_rate(tasks, NoisyExpert(p, seed=0)) for p in (0.0, 0.1, 0.3, 0.6)]
    assert rates[0] >= 0.99 and rates[0] > rates[1] > rates[2] > rates[3]
    assert 0.75 <= rates[1] <= 0.95 and 0.4 <= rates[2] <= 0.7
    episodes = lambda seed: [run_episode(ToolWorldEnv(t), NoisyExpert(0.3, seed))["actions"] for t in tasks[:40]]  # noqa: E731
    assert episodes(7) == episodes(7) and episodes(7) != episodes(8)


def test_episode_logs_are_compact_and_every_entity_is_a_listed_word():
    words = set(entity_words())
    assert set(SYNTHETIC_APPS) <= words and len(words) == len(entity_words())
    for task in make_tasks("train", 200):
        episode = run_episode(ToolWorldEnv(task), NoisyExpert(0.4, seed=1))
        assert len(episode["shorts"]) == episode["n_turns"] == len(episode["actions"])
        assert all(len(s) <= 60 for s in episode["shorts"])
        assert all(o is None or len(o) <= 80 for o in episode["observations"])
        assert 0.0 <= episode["reward"] <= 1.0
        ids = {w for text in episode["actions"] + [o or "" for o in episode["observations"]]
               for w in re.findall(r"\b[a-z]+_\d+\b", text)}
        assert ids <= words, ids - words
        assert task.app in words and all(v in words for k, v in task.goal.items() if k in ("name", "room", "product", "title"))


def test_params_name_the_same_families_as_the_environment():
    from lopd.config import TOOLWORLD_FAMILIES

    assert list(TOOLWORLD_FAMILIES) == FAMILIES
