"""Measure: how much shorter is an observation-lite bank entry than the full trajectory text?

Full = the whole conversation as the policy sees it (system prompt with the tool list, task,
every action, every verbose tool observation, chat-template tokens). Lite = ``Task: ...`` plus
one ``tool {args} -> short result`` line per step (what the bank stores and embeds).

Two sources: the base policy's own rollouts in ``data/rollouts`` (full = the decoded token ids),
and scripted-expert successes on train tasks (full = the same chat template rendered).

    .venv/bin/python benchmarks/bank_format.py [--profile demo] [--expert-tasks 400]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd

from lopd import layout
from lopd.config import load_params
from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, run_episode
from lopd.envs.toolworld.lite import lite_text
from lopd.policy.engine import split_tasks
from lopd.stages.collect import ROLLOUTS_FILE


def row(name: str, lite: list[str], full: list[str], tok) -> str:
    lc, fc = np.array([len(s) for s in lite]), np.array([len(s) for s in full])
    lt = np.array([len(tok(s, add_special_tokens=False)["input_ids"]) for s in lite])
    ft = np.array([len(tok(s, add_special_tokens=False)["input_ids"]) for s in full])
    return (f"| {name} | {len(lite)} | {lc.mean():.0f} | {fc.mean():.0f} | {lc.sum() / fc.sum():.3f} | "
            f"{lt.mean():.0f} | {ft.mean():.0f} | {lt.sum() / ft.sum():.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--expert-tasks", type=int, default=400)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    p = load_params(a.params, a.profile, a.overrides)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(layout.policy_path(p))
    print("| source | n | lite chars | full chars | lite/full chars | lite tokens | full tokens | lite/full tokens |")
    print("|---|---|---|---|---|---|---|---|")

    path = layout.rollouts_dir(p) / ROLLOUTS_FILE
    if path.exists():
        df = pd.read_parquet(path)
        tasks = {t.task_id: t for t in split_tasks(p, "train")}
        lite, full = [], []
        for _, r in df.iterrows():
            turns = json.loads(r["turns_json"])
            lite.append(lite_text(tasks[r["task_id"]].text, [t["action"] for t in turns], [t["short"] for t in turns]))
            full.append(tok.decode(list(r["token_ids"]), skip_special_tokens=False))
        print(row(f"policy rollouts ({path.parent.name}, success {df['success'].mean():.2f})", lite, full, tok))

    lite, full = [], []
    for task in split_tasks(p, "train", a.expert_tasks):
        env = ToolWorldEnv(task, max_turns=p.env.max_turns, success_threshold=p.env.success_threshold)
        ep = run_episode(env, ScriptedExpert())
        msgs = env.initial_observation()
        for act, obs in zip(ep["actions"], ep["observations"]):
            msgs.append({"role": "assistant", "content": act})
            if obs is not None:
                msgs.append({"role": "tool", "content": obs})
        full.append(tok.apply_chat_template(msgs, tokenize=False))
        lite.append(lite_text(task.text, ep["actions"], ep["shorts"]))
    print(row("scripted-expert successes (train)", lite, full, tok))


if __name__ == "__main__":
    main()
