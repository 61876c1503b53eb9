"""Where a policy goes wrong: teacher-forced accuracy per action of scripted-expert episodes.

Sampled success says *whether* the base policy solves a task; this says *which step* it
cannot do. Each dev task's expert episode is scored in one forward pass, and an action counts
as right when the greedy next token is the expert's token at every position of the action
(its eos included). Grouped by action index (0 = first call) overall and per family, this
separates format and tool-order knowledge (late "Done." turns) from copying names and ids out
of the task and tool results (first and second calls), which is what the embedded base lacks.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch

from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, run_episode
from lopd.rollout import tokenize_episode


def action_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of action tokens in an episode's mask, in order."""
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def expert_episodes(tokenizer, tasks, max_turns: int, success_threshold: float) -> list[tuple[str, list[int], list[int]]]:
    """``(family, ids, action_mask)`` of the scripted expert's episode on each task."""
    out = []
    for task in tasks:
        env = ToolWorldEnv(task, max_turns, success_threshold)
        messages = env.initial_observation()
        ep = run_episode(env, ScriptedExpert())
        ids, mask = tokenize_episode(tokenizer, messages, ep["actions"], ep["observations"])
        out.append((task.family, ids, mask))
    return out


@torch.no_grad()
def action_accuracy(model, episodes: Sequence[tuple[str, list[int], list[int]]]) -> dict[str, float]:
    """Share of actions whose every token is the greedy prediction given the expert's prefix.

    Keys: ``a<k>`` (action index k over all families), ``<family>/a<k>``, and ``all``.
    """
    device = next(model.parameters()).device
    hits: dict[str, list[bool]] = defaultdict(list)
    was_training = model.training
    model.eval()
    for family, ids, mask in episodes:
        ids_1T = torch.tensor([ids], device=device)
        pred_T = model(input_ids=ids_1T).logits[0, :-1].argmax(-1).tolist()  # pred_T[t] guesses ids[t + 1]
        for k, (a, b) in enumerate(action_spans(mask)):
            ok = all(pred_T[t - 1] == ids[t] for t in range(a, b))
            for key in (f"a{k}", f"{family}/a{k}", "all"):
                hits[key].append(ok)
    model.train(was_training)
    return {k: sum(v) / len(v) for k, v in sorted(hits.items())}
