"""`lopd ingest`: a file of deployed trajectories with bad rows. Every bad row lands in quarantine with its
reason, every good success in a new bank round (lite text from the environment), and a second ingest adds
nothing. No model is involved: the rows are the scripted expert's episodes, replayed by the environment."""

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from lopd import layout
from lopd.cli import main
from lopd.config import load_params
from lopd.memory.bank import expert_top_up, read_bank, round_numbers
from lopd.memory.experience import trajectory_row
from lopd.policy.engine import environment, split_tasks


def _row(env, task, actions=None, verdict=None, reward=None, **extra):
    """The JSONL row of the expert's episode on ``task`` (or of ``actions`` played there)."""
    if actions is None:
        ep = env.play(task, env.expert())
    else:
        e = env.make_env(task)
        e.initial_observation()
        results = [e.step(a) for a in actions]
        ep = {"actions": actions, "observations": [r.observation for r in results], "reward": results[-1].reward,
              "success": bool(results[-1].info.get("success"))}
    traj = SimpleNamespace(task_id=task.task_id, actions=ep["actions"], observations=ep["observations"][:-1], truncated=False,
                           success=ep["success"], reward=ep["reward"])
    row = trajectory_row(traj, env.make_env(task).initial_observation(), "deployed-v1")
    if verdict is not None:
        row["verdict"] = verdict
    if reward is not None:
        row["reward"] = reward
    return {**row, **extra}


@pytest.fixture
def project(repo, tmp_path, monkeypatch):
    p = load_params(repo / "params.yaml", "smoke", [f"paths.root={tmp_path}", f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
                                                    "bank.expert_top_up=6"])
    bank = expert_top_up(p, pd.DataFrame(columns=["task_id"]), round_=0)  # the expert's successes on the first train tasks
    layout.bank_dir(p).mkdir(parents=True)
    bank.to_parquet(layout.bank_dir(p) / "round-000.parquet", index=False)
    events = []
    monkeypatch.setattr("lopd.ops.events.emit", lambda event, resource, payload: events.append((event, payload)) or True)
    return p, bank, events


def test_bad_rows_are_quarantined_with_their_reason_good_ones_banked_and_a_second_ingest_adds_nothing(project, repo, tmp_path, capsys):
    p, bank, events = project
    env = environment(p)
    train = [t for t in split_tasks(p, "train") if t.task_id not in set(bank["task_id"])]
    in_bank = next(t for t in split_tasks(p, "train") if t.task_id in set(bank["task_id"]))
    good_a, good_b = _row(env, train[0]), _row(env, train[1])
    assert good_a["verdict"] == good_b["verdict"] == "success"
    give_up = _row(env, train[2], actions=["I cannot do this."])
    assert give_up["verdict"] == "failure" and give_up["reward"] < p.env.success_threshold
    no_verdict = {k: v for k, v in _row(env, train[3]).items() if k != "verdict"}
    tampered = _row(env, train[4])
    tampered["messages"][3]["content"] = '{"ok":true}'  # the first tool result, not the environment's
    lines = [
        json.dumps(good_a),                                                       # 1 banked
        json.dumps(good_b),                                                       # 2 banked
        json.dumps(give_up),                                                      # 3 a valid failure: kept out of the bank
        json.dumps(no_verdict),                                                   # 4 missing verdict
        json.dumps(_row(env, split_tasks(p, "dev")[0])),                          # 5 a dev task
        json.dumps(_row(env, in_bank)),                                           # 6 a duplicate of a bank entry
        json.dumps({**give_up, "verdict": "success"}),                            # 7 a failure labelled success
        '{"task_id": "' + train[5].task_id + '", "messages": [',                  # 8 malformed JSON
        json.dumps(tampered),                                                     # 9 does not replay
        json.dumps(good_a),                                                       # 10 the same trajectory again
        json.dumps({**_row(env, train[6]), "task_id": "no-such-task"}),           # 11 unknown task
        json.dumps({**_row(env, train[7]), "reward": "high"}),                   # 12 a reward that is no number
        json.dumps({**_row(env, train[8]), "task_id": 42}),                       # 13 a task id that is no string
    ]
    path = tmp_path / "week1.jsonl"
    path.write_text("\n".join(lines) + "\n")
    args = ["ingest", str(path), "--params", str(repo / "params.yaml"), "--profile", "smoke", "--set", f"paths.root={tmp_path}",
            "--set", f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db", "--set", "bank.expert_top_up=6"]
    assert main(args) == 0

    m = json.loads(layout.metrics_path(p, "ingest").read_text())
    assert (m["lines"], m["banked"], m["failure"], m["quarantined"], m["already_in_bank"]) == (13, 2, 1, 10, 0)
    assert m["round"] == 1 and m["added"] == 2 and m["bank_size"] == len(bank) + 2
    assert m["files"][0]["file"] == "week1.jsonl" and "/" not in json.dumps(m["files"][0]["file"])
    quarantine = [json.loads(x) for x in (tmp_path / m["files"][0]["quarantine"]).read_text().splitlines()]
    reasons = {q["line"]: q["reason"] for q in quarantine}
    assert reasons == {
        4: "missing field 'verdict'",
        5: "a dev or test task never enters the bank",
        6: "duplicate of a bank entry or an earlier row",
        7: f"a success needs reward >= {p.env.success_threshold}",
        8: reasons[8],
        9: "the messages do not replay in the environment: message 3: the observation differs from the environment's",
        10: "duplicate of a bank entry or an earlier row",
        11: "unknown task id",
        12: "reward must be a number",
        13: "unknown task id",
    }
    assert reasons[8].startswith("malformed JSON") and all(q["row"] == lines[q["line"] - 1] for q in quarantine)
    assert "the environment's verdict or reward on replay differs from the row's" in next(q for q in quarantine if q["line"] == 7)["reasons"]

    grown = read_bank(layout.bank_dir(p))
    new = grown[grown["source_round"] == 1]
    assert round_numbers(layout.bank_dir(p)) == [0, 1] and sorted(new["task_id"]) == sorted([train[0].task_id, train[1].task_id])
    for _, e in new.iterrows():  # the environment's lite text, reward and verdict
        task = next(t for t in train if t.task_id == e["task_id"])
        ep = env.play(task, env.expert())
        assert e["lite_text"] == env.lite_text(task.text, ep["actions"], ep["shorts"]) and e["reward"] == ep["reward"] and e["success"]
        assert e["model"] == "deployed-v1"
    assert [(ev, pl["round"], pl["added"]) for ev, pl in events] == [("lopd.bank.grew", 1, 2)]
    kept = layout.ingest_dir(p) / "rounds" / "round-001.parquet"  # what collect puts back after a re-collect
    assert kept.read_bytes() == (layout.bank_dir(p) / "round-001.parquet").read_bytes()
    assert m["dvc"] == "not tracked: no dvc.lock entry for data/bank here"
    report = json.loads(next((layout.ingest_dir(p) / "reports").glob("week1-*.json")).read_text())
    assert [report["outcomes"][str(n)]["outcome"] for n in (1, 2, 3)] == ["banked", "banked", "failure"] and len(report["outcomes"]) == 13

    assert main(args) == 0  # the same file again: nothing new
    again = json.loads(layout.metrics_path(p, "ingest").read_text())
    assert (again["banked"], again["already_in_bank"], again["quarantined"], again["round"], again["added"]) == (0, 2, 10, None, 0)
    assert round_numbers(layout.bank_dir(p)) == [0, 1] and len(read_bank(layout.bank_dir(p))) == len(grown) and len(events) == 1


def test_no_file_adds_nothing_and_a_missing_file_fails_before_compute(project, repo, tmp_path, capsys):
    from lopd.stages import ingest

    p, bank, _ = project
    assert ingest.run(p)["files"] == [] and round_numbers(layout.bank_dir(p)) == [0]
    args = ["ingest", str(tmp_path / "nope.jsonl"), "--params", str(repo / "params.yaml"), "--profile", "smoke", "--set", f"paths.root={tmp_path}"]
    assert main(args) == 2
    assert "ingest.files names no file" in capsys.readouterr().err
