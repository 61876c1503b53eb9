"""Where learning stops (issue 37, item 4): the convention decisions at new apps, found and scored.

Closed form on a toy bigram model whose logits are set by hand; the decisions of the scripted
expert's own episode at every new app of every family; the decision tokens of a rollout and the
share of a per-token loss they carry. The probe inside ``lopd distill`` is checked in test_distill.py.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lopd.envs.registry import get_environment
from lopd.envs.toolworld import FAMILIES, ScriptedExpert, ToolWorldEnv, make_tasks, run_episode
from lopd.envs.toolworld.apps import NEW, app_group
from lopd.envs.toolworld.experts import decision_alternatives
from lopd.envs.toolworld.families import REGISTRY
from lopd.train.decisions import (
    DecisionPair,
    by_kind,
    decision_pairs,
    episode_decision_tokens,
    first_difference,
    loss_share,
    p_right,
    score_pairs,
    student_scorer,
    suffix_mask,
)
from lopd.train.episodes import Episode
from tests.helpers import tiny_model, tiny_tokenizer

KINDS = {"format", "check", "commit"}


class Bigram(nn.Module):
    """A toy causal LM: the next token's logits depend on the current token only, ``logits_VV[cur, next]``."""

    def __init__(self, logits_VV: torch.Tensor):
        super().__init__()
        v = logits_VV.shape[0]
        self.emb = nn.Embedding(v, v)
        self.head = nn.Linear(v, v, bias=False)
        with torch.no_grad():
            self.emb.weight.copy_(torch.eye(v))
            self.head.weight.copy_(logits_VV.T)

    def get_decoder(self):
        return lambda input_ids=None, attention_mask=None, inputs_embeds=None: SimpleNamespace(last_hidden_state=self.emb(input_ids))

    def get_output_embeddings(self):
        return self.head


def row(ids, start):
    return Episode(None, [], list(ids), suffix_mask(len(ids), start), 1, 0.0)


# ----------------------------------------------------------------------------- pure functions


def test_first_difference_and_suffix_mask_on_hand_made_sequences():
    assert first_difference([5, 6, 7, 8], [5, 6, 9, 8]) == 2
    assert first_difference([5, 6], [5, 6, 7]) == 2  # a prefix: the shorter length
    assert first_difference([1], [2]) == 0
    assert first_difference("Done.", "<tool_call>") == 0  # characters too
    assert suffix_mask(5, 2) == [0, 0, 1, 1, 1]


def test_p_right_of_a_toy_model_is_the_sigmoid_computed_by_hand():
    logits = torch.tensor([[0.0, 2.0, 0.0, 0.0, 0.0],   # after 0
                           [0.0, 0.0, 1.5, 0.0, -0.5],  # after 1: 2 (right) or 4 (wrong)
                           [0.3, 0.0, 0.0, 1.0, 0.0],   # after 2
                           [0.0, 0.0, 0.0, 0.0, 0.0],
                           [0.0, 0.0, 0.0, 2.5, 0.0]])  # after 4
    model = Bigram(logits)
    right, wrong = [0, 1, 2, 3], [0, 1, 4, 3]
    start = first_difference(right, wrong)
    assert start == 2

    def logp(cur, nxt):
        return logits[cur, nxt].item() - math.log(sum(math.exp(x) for x in logits[cur].tolist()))

    by_hand = 1.0 / (1.0 + math.exp(-((logp(1, 2) + logp(2, 3)) - (logp(1, 4) + logp(4, 3)))))
    pair = DecisionPair("format", row(right, start), row(wrong, start))
    got = score_pairs([pair, pair], student_scorer(model, pad_id=0))
    assert got.shape == (2,) and got[0].item() == pytest.approx(by_hand, abs=1e-6)
    # the shared tokens cancel: counting them too gives the same P(right)
    whole = score_pairs([DecisionPair("format", row(right, 1), row(wrong, 1))], student_scorer(model, pad_id=0))
    assert whole.item() == pytest.approx(by_hand, abs=1e-6)
    assert p_right(torch.tensor([0.0]), torch.tensor([0.0])).item() == 0.5
    assert by_kind(["a", "b", "a"], torch.tensor([0.2, 0.5, 0.4])) == pytest.approx({"a": 0.3, "b": 0.5})


def test_loss_share_is_the_decision_tokens_share_of_the_absolute_loss_mass():
    loss = torch.tensor([[9.0, 1.0, 2.0, -3.0], [5.0, 4.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]], dtype=torch.bool)
    decision = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    assert loss_share(loss, mask, decision) == pytest.approx((2 + 3) / (1 + 2 + 3 + 4))
    assert math.isnan(loss_share(torch.zeros(2, 4), mask, decision))  # no loss mass at all (a GRPO batch of equal rewards)


# ----------------------------------------------------------------------------- the expert's decisions


def new_app_tasks(per_app: int = 2):
    tasks = make_tasks("dev", 8 * len(FAMILIES) * per_app)
    return [t for t in tasks if app_group(t.family, t.app, 4) == NEW]


def test_every_decision_kind_is_found_once_on_the_experts_episode_at_every_new_app():
    tasks = new_app_tasks()
    assert {(t.family, t.app) for t in tasks} == {(f, a) for f in FAMILIES for a in REGISTRY[f].apps[4:]}  # every new app
    for task in tasks:
        ep = run_episode(ToolWorldEnv(task), ScriptedExpert())
        assert ep["success"]
        found = []
        for i, action in enumerate(ep["actions"]):
            for kind, (right, wrong) in decision_alternatives(task, ep["actions"], ep["observations"], i).items():
                assert right == action and wrong != right  # the expert takes the right option
                found.append(kind)
        assert sorted(found) == sorted(KINDS), (task.task_id, task.conventions, found)


def test_decision_pairs_mark_the_tokens_from_the_first_difference(repo):
    from lopd.config import load_params

    p = load_params(repo / "params.yaml", "smoke")
    tok, env = tiny_tokenizer(), get_environment(p)
    tasks = new_app_tasks(1)
    pairs = decision_pairs(tok, env, tasks)
    assert len(pairs) == 3 * len(tasks) and {pr.kind for pr in pairs} == KINDS
    for pr in pairs:
        start = first_difference(pr.right.token_ids, pr.wrong.token_ids)
        assert pr.right.token_ids[:start] == pr.wrong.token_ids[:start]
        for e in (pr.right, pr.wrong):
            assert e.action_mask == suffix_mask(len(e.token_ids), start) and e.token_ids[-1] == tok.eos_token_id
    scores = score_pairs(pairs, student_scorer(tiny_model(), tok.pad_token_id))
    assert scores.shape == (len(pairs),) and bool(((scores >= 0) & (scores <= 1)).all())  # one long option saturates it


def test_decision_tokens_of_an_episode_are_found_on_either_option(repo):
    """An episode that ends in a decision's right option and one that ends in its wrong option: the decision's
    tokens, found from the episode's ids alone, are those the two options differ in (the probe's), to the end."""
    from lopd.config import load_params
    from lopd.policy.rollout import tokenize_episode

    p = load_params(repo / "params.yaml", "smoke")
    tok, env = tiny_tokenizer(), get_environment(p)
    for task in new_app_tasks(1)[:8]:
        messages = env.make_env(task).initial_observation()
        ep = env.play(task, env.expert())
        acts, obs = ep["actions"], ep["observations"]
        for i in range(len(acts)):
            for kind, options in decision_alternatives(task, acts, obs, i).items():
                rows = [tokenize_episode(tok, messages, [*acts[:i], a], obs[:i]) for a in options]
                start = first_difference(rows[0][0], rows[1][0])
                for ids, mask in rows:
                    found = episode_decision_tokens(tok, env, Episode(task, messages, ids, mask, 0, 0.0))
                    assert found[kind] == suffix_mask(len(ids), start), (task.task_id, kind, tok.decode(ids[start:]))
        ids, mask = tokenize_episode(tok, messages, acts, obs)
        found = episode_decision_tokens(tok, env, Episode(task, messages, ids, mask, 0, 1.0))
        assert set(found) == KINDS and all(sum(m) > 0 and all(a or not d for a, d in zip(mask, m)) for m in found.values())
