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
from dataclasses import dataclass
from typing import Sequence

import torch

from lopd.policy.rollout import tokenize_episode


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


@dataclass
class ExpertEpisode:
    """The scripted expert's episode on a task, tokenised exactly as a rollout would be."""

    task: object  # the environment's task
    messages: list[dict]
    token_ids: list[int]
    action_mask: list[int]
    reward: float
    success: bool
    actions: list[str]
    observations: list[str | None]


def expert_episodes(tokenizer, tasks, env) -> list[ExpertEpisode]:
    """The scripted expert's episode on each task, in order (``env``: a ``lopd.envs.registry.Environment`` with an expert)."""
    out = []
    for task in tasks:
        messages = env.make_env(task).initial_observation()
        ep = env.play(task, env.expert())
        ids, mask = tokenize_episode(tokenizer, messages, ep["actions"], ep["observations"])
        out.append(ExpertEpisode(task, messages, ids, mask, ep["reward"], ep["success"], ep["actions"], ep["observations"]))
    return out


@torch.no_grad()
def action_accuracy(model, episodes: Sequence[ExpertEpisode]) -> dict[str, float]:
    """Share of actions whose every token is the greedy prediction given the expert's prefix.

    Keys: ``a<k>`` (action index k over all families), ``<family>/a<k>``, and ``all``.
    """
    device = next(model.parameters()).device
    hits: dict[str, list[bool]] = defaultdict(list)
    was_training = model.training
    model.eval()
    for e in episodes:
        ids, family = e.token_ids, e.task.family
        ids_1T = torch.tensor([ids], device=device)
        pred_T = model(input_ids=ids_1T).logits[0, :-1].argmax(-1).tolist()  # pred_T[t] guesses ids[t + 1]
        for k, (a, b) in enumerate(action_spans(e.action_mask)):
            ok = all(pred_T[t - 1] == ids[t] for t in range(a, b))
            for key in (f"a{k}", f"{family}/a{k}", "all"):
                hits[key].append(ok)
    model.train(was_training)
    return {k: sum(v) / len(v) for k, v in sorted(hits.items())}
