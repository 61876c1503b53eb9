"""Experience from deployment: the JSONL rows a deployed agent's trajectories come in, replayed in the environment.

One row per line (docs/operate.md, "Ingest"):

``{"task_id": "...", "messages": [...], "verdict": "success" | "failure", "reward": 0.93, "model": "...", "lite_text": "..."}``

``messages`` is the whole episode as chat messages: the task's prompt as the environment gives it
(``initial_observation()``: ToolWorld's system and user messages), then each assistant action followed
by the environment's observation (role ``tool``; BFCL's next user turn: ``user``), up to the last action.
``verdict`` and ``reward`` are what the environment said at the end; ``model`` (optional) names the
policy that played; ``lite_text`` (optional) is checked against the environment's.

Nothing in a row is trusted: :func:`replay` plays its actions again in a fresh episode of its task,
checks every observation, and re-derives the verdict, the reward and the observation-lite text from the
environment. :func:`experience_frame` builds the frame the Great Expectations suite
(``lopd.ops.validation.experience_reasons``) validates; :func:`bank_rows` turns the valid successes
into bank entries. :func:`trajectory_row` writes a row from a rollout (what a deployment would log).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import pandas as pd

from lopd.config import Params
from lopd.memory.bank import BANK_COLUMNS, content_key

DEPLOYED = "deployed"  # ``model`` of an ingested entry whose row names none


def parse_lines(text: str) -> tuple[list[tuple[int, dict]], list[tuple[int, str, str]]]:
    """``([(line number, row)], [(line number, raw text, reason)])``: JSON objects, and the lines that are not."""
    rows, bad = [], []
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            bad.append((n, raw, f"malformed JSON: {e.msg} at column {e.colno}"))
            continue
        if not isinstance(obj, dict):
            bad.append((n, raw, f"a row must be a JSON object, got {type(obj).__name__}"))
            continue
        rows.append((n, obj))
    return rows, bad


def replay(env, task, messages: Any) -> dict:
    """Play ``messages``' assistant actions in a fresh episode of ``task``; ``ok`` False with ``error`` when they do not replay.

    Checks that the messages start with the task's prompt, alternate action / observation, that each
    observation is the environment's, and that the episode ends exactly at the last action.
    """
    def fail(error: str) -> dict:
        return {"ok": False, "error": error}

    if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        return fail("messages must be a list of {role, content} objects")
    episode = env.make_env(task)
    prompt = episode.initial_observation()
    if [(m.get("role"), m["content"]) for m in messages[: len(prompt)]] != [(m["role"], m["content"]) for m in prompt]:
        return fail("the first messages are not the task's prompt")
    rest, actions, shorts, result, i = messages[len(prompt):], [], [], None, 0
    while i < len(rest):
        if result is not None and result.done:
            return fail(f"message {len(prompt) + i}: the episode ended before it")
        if rest[i].get("role") != "assistant":
            return fail(f"message {len(prompt) + i}: expected an assistant action, got role {rest[i].get('role')!r}")
        try:
            result = episode.step(rest[i]["content"])
        except Exception as e:  # noqa: BLE001 - a row must never crash the ingest
            return fail(f"message {len(prompt) + i}: the environment raised {type(e).__name__}: {e}")
        actions.append(rest[i]["content"])
        shorts.append(result.info.get("short", ""))
        i += 1
        if result.done:
            continue
        if i >= len(rest):
            return fail("the messages stop before the episode ends")
        if rest[i]["content"] != (result.observation or ""):
            return fail(f"message {len(prompt) + i}: the observation differs from the environment's")
        i += 1
    if result is None or not result.done:
        return fail("no action: the episode never ends")
    return {"ok": True, "actions": actions, "shorts": shorts, "reward": float(result.reward), "success": bool(result.info.get("success", False)),
            "lite_text": env.lite_text(task.text, actions, shorts)}


def steps_json(actions: Sequence[str], shorts: Sequence[str]) -> str:
    """The bank's ``steps_json`` (as ``lopd.memory.bank.bank_frame`` writes it)."""
    return json.dumps([{"action": a, "result": s} for a, s in zip(actions, shorts)])


def experience_frame(rows: list[tuple[int, dict]], env, tasks: dict[str, tuple[Any, str]], bank: pd.DataFrame | None) -> pd.DataFrame:
    """One row per parsed line (index = line number): the fields, and what replaying it derives.

    ``tasks``: task id -> (task, split) over train, dev and test. Derived columns are null where the
    row lacks what they need, so a missing field fails only its own expectation.
    """
    existing = dict(zip(content_key(bank), bank["bank_id"])) if bank is not None and len(bank) else {}
    seen: set[str] = set()
    records = []
    for line, row in rows:
        task_id = row.get("task_id")
        rec = {"line": line, "task_id": task_id, "messages": row.get("messages"), "verdict": row.get("verdict"),
               "reward": row.get("reward"), "model": row.get("model") or DEPLOYED, "task_split": None, "replay_ok": None,
               "verdict_matches": None, "lite_text_ok": None, "duplicate": None, "replay_error": None, "key": None, "env": None}
        if task_id is not None:
            rec["task_split"] = tasks[task_id][1] if isinstance(task_id, str) and task_id in tasks else "unknown"
        if rec["task_split"] in ("train", "dev", "test") and row.get("messages") is not None:
            r = replay(env, tasks[task_id][0], row["messages"])
            rec["replay_ok"], rec["replay_error"] = r["ok"], r.get("error")
            if r["ok"]:
                rec["env"] = r
                reward = row.get("reward")
                if row.get("verdict") is not None and isinstance(reward, (int, float)) and not isinstance(reward, bool):
                    rec["verdict_matches"] = (row["verdict"] == "success") == r["success"] and abs(float(reward) - r["reward"]) <= 1e-6
                rec["lite_text_ok"] = row.get("lite_text") is None or row["lite_text"] == r["lite_text"]
                key = content_key(pd.DataFrame({"task_id": [task_id], "steps_json": [steps_json(r["actions"], r["shorts"])]})).iloc[0]
                rec["key"] = key
                rec["duplicate"] = (key in existing and existing[key] != bank_id(key)) or key in seen
                seen.add(key)
        records.append(rec)
    return pd.DataFrame.from_records(records, index=[r["line"] for r in records]) if records else pd.DataFrame()


def bank_id(key: str) -> str:
    """An ingested entry's id: from its content, so the same trajectory ingested again is recognised."""
    return f"ingest-{key}"


def bank_rows(frame: pd.DataFrame, tasks: dict[str, tuple[Any, str]], round_: int) -> pd.DataFrame:
    """Bank entries (:data:`BANK_COLUMNS`) of ``frame``'s successes, with the environment's lite text and reward."""
    out = []
    for _, r in frame.iterrows():
        task, env = tasks[r["task_id"]][0], r["env"]
        out.append({"bank_id": bank_id(r["key"]), "task_id": r["task_id"], "family": task.family, "app": getattr(task, "app", None),
                    "task_text": task.text, "steps_json": steps_json(env["actions"], env["shorts"]), "lite_text": env["lite_text"],
                    "reward": env["reward"], "success": True, "source_round": round_, "model": r["model"]})
    return pd.DataFrame(out, columns=list(BANK_COLUMNS))


def all_tasks(p: Params) -> dict[str, tuple[Any, str]]:
    """task id -> (task, split) for every configured train, dev and test task."""
    from lopd.policy.engine import split_tasks

    return {t.task_id: (t, split) for split in ("train", "dev", "test") for t in split_tasks(p, split)}


def trajectory_row(traj, task_prompt: list[dict], model: str) -> dict:
    """The JSONL row of one played episode (a rollout ``Trajectory``): what a deployment logs for ``lopd ingest``."""
    messages = [dict(m) for m in task_prompt]
    for i, action in enumerate(traj.actions):
        messages.append({"role": "assistant", "content": action})
        if i < len(traj.observations):  # every action but the last has one
            messages.append({"role": "tool", "content": traj.observations[i] or ""})
    if traj.truncated:  # cut by the context: the rollout ended the episode with an empty action
        messages.append({"role": "assistant", "content": ""})
    return {"task_id": traj.task_id, "messages": messages, "verdict": "success" if traj.success else "failure",
            "reward": float(traj.reward), "model": model}
