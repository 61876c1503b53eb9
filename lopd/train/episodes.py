"""Scored episodes: the same action tokens in the student's layout and in the teacher's.

An ``Episode`` is one task's token ids with the action mask (what the policy produced) and
the initial messages its prompt was rendered from. The student scores it as is; the teacher
scores it behind a prompt with latent slots (``lopd.latent.teacher``). Episodes come from rollouts
(exact sampled ids) or from bank entries replayed in a fresh environment (their actions
re-tokenised), which also covers entries without token ids.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, NamedTuple, Sequence

import torch

from lopd.envs.registry import get_environment
from lopd.latent.teacher import TeacherBatch, align_to_student, collate_teacher, teacher_prompt
from lopd.policy.chat import encode, render_prompt
from lopd.policy.rollout import Trajectory, tokenize_episode
from lopd.train.lm_train import IGNORE, collate


@dataclass
class Episode:
    task: object  # the environment's task
    messages: list[dict]
    token_ids: list[int]
    action_mask: list[int]
    prompt_len: int
    reward: float
    success: bool = False  # reward >= threshold and the agent finished (the environment's verdict)


class TokenLoss(NamedTuple):
    """A step's per-token training loss (detached), for diagnostics (``lopd.train.decisions``): the batch's
    episodes in row order, ``loss_BT`` in the target layout of ``lopd.train.losses`` and the action ``mask_BT``."""

    episodes: Sequence
    loss_BT: torch.Tensor
    mask_BT: torch.Tensor


def from_trajectory(task, traj: Trajectory, messages: list[dict]) -> Episode:
    return Episode(task, messages, traj.token_ids, traj.action_mask, traj.prompt_len, traj.reward, bool(traj.success))


def from_expert(tokenizer, e) -> Episode:
    """A scripted-expert episode (``lopd.policy.probe.ExpertEpisode``) as an :class:`Episode`."""
    return Episode(e.task, e.messages, e.token_ids, e.action_mask, len(encode(tokenizer, render_prompt(tokenizer, e.messages))), e.reward,
                   bool(e.success))


def initial_messages(p, task) -> list[dict]:
    """The messages the engine rendered the task's prompt from (the env is deterministic per task)."""
    return get_environment(p).make_env(task).initial_observation()


def to_episodes(p, tasks: Iterable, trajs: Sequence[Trajectory]) -> list[Episode]:
    """Each trajectory as an :class:`Episode` (exact sampled ids, action mask, reward), in order."""
    by_id = {t.task_id: t for t in tasks}
    messages = {tid: initial_messages(p, t) for tid, t in by_id.items()}
    return [from_trajectory(by_id[tr.task_id], tr, messages[tr.task_id]) for tr in trajs]


def replay_entry(tokenizer, task, steps_json: str, make_env) -> Episode:
    """A bank entry's actions played again in a fresh env (``make_env(task)``, deterministic per task) and tokenised."""
    env = make_env(task)
    messages = env.initial_observation()
    actions, observations, reward, success = [], [], 0.0, False
    for step in json.loads(steps_json):
        result = env.step(step["action"])
        actions.append(step["action"])
        observations.append(result.observation)
        reward, success = result.reward, bool(result.info.get("success", False))
        if result.done:
            break
    ids, mask = tokenize_episode(tokenizer, messages, actions, observations)
    prompt_len = len(encode(tokenizer, render_prompt(tokenizer, messages)))
    return Episode(task, messages, ids, mask, prompt_len, reward, success)


def bank_episodes(p, tokenizer, bank, tasks_by_id: dict) -> list[Episode]:
    """The bank's entries on known train tasks, replayed and tokenised, in ``bank_id`` order."""
    rows, make_env = bank.sort_values("bank_id"), get_environment(p).make_env
    return [
        replay_entry(tokenizer, tasks_by_id[r.task_id], r.steps_json, make_env)
        for r in rows.itertuples()
        if r.task_id in tasks_by_id
    ]


def student_batch(episodes: Sequence[Episode], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``ids_BT``, ``attn_BT`` and ``mask_BT`` (bool, action tokens): ``lm_train.collate``'s layout."""
    ids_BT, attn_BT, labels_BT = collate([(e.token_ids, e.action_mask) for e in episodes], pad_id)
    return ids_BT, attn_BT, labels_BT != IGNORE


def teacher_batch(tokenizer, episodes: Sequence[Episode], n_latents: int, placeholder: str) -> TeacherBatch:
    """The teacher's ids for each episode: its prompt with ``n_latents`` slots + the same tail."""
    examples = [
        align_to_student(teacher_prompt(tokenizer, e.messages, n_latents, placeholder), e.token_ids, e.action_mask, e.prompt_len)
        for e in episodes
    ]
    return collate_teacher(examples, tokenizer.pad_token_id)


class Timer:
    """Wall time per named phase, summed over steps: ``with timer("encoder"): ...``."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.steps = 0

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.total[name] += time.perf_counter() - t0

    def per_step_ms(self) -> dict[str, float]:
        return {k: 1000 * v / max(1, self.steps) for k, v in self.total.items()}
