"""The per-action probe: spans, and accuracies against an oracle whose mistakes we place by hand."""

from types import SimpleNamespace

import torch

from lopd.config import load_params
from lopd.envs.toolworld import environment as toolworld
from lopd.envs.toolworld import make_tasks
from lopd.policy.probe import action_accuracy, action_spans, expert_episodes
from tests.helpers import tiny_model, tiny_tokenizer


class Oracle(torch.nn.Module):
    """Predicts the true next token everywhere except at the positions listed per episode."""

    def __init__(self, vocab: int, wrong: dict[tuple[int, ...], set[int]]):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(1))
        self.vocab, self.wrong = vocab, wrong

    def forward(self, input_ids):
        ids = input_ids[0].tolist()
        logits = torch.zeros(1, len(ids), self.vocab)
        bad = self.wrong.get(tuple(ids), set())
        for t in range(len(ids) - 1):
            logits[0, t, (ids[t + 1] + (t in bad)) % self.vocab] = 1.0
        return SimpleNamespace(logits=logits)


def test_action_spans_are_the_runs_of_the_mask():
    assert action_spans([0, 0, 1, 1, 0, 1, 0, 0, 1, 1]) == [(2, 4), (5, 6), (8, 10)]
    assert action_spans([0, 0]) == []


def _episodes(n=8):
    tok = tiny_tokenizer()
    return tok, expert_episodes(tok, make_tasks("dev", n), toolworld.make(load_params("params.yaml", None)))


def test_oracle_scores_every_action_right_and_keys_follow_families():
    tok, eps = _episodes()
    acc = action_accuracy(Oracle(len(tok), {}), eps)
    assert acc["all"] == 1.0
    n_max = max(len(action_spans(e.action_mask)) for e in eps)
    assert {f"a{k}" for k in range(n_max)} <= acc.keys()
    assert {f"{e.task.family}/a0" for e in eps} <= acc.keys()


def test_one_wrong_token_fails_its_whole_action_only():
    tok, eps = _episodes()
    # In every episode, the prediction of the last token of the second action is wrong.
    wrong = {tuple(e.token_ids): {action_spans(e.action_mask)[1][1] - 2} for e in eps}
    acc = action_accuracy(Oracle(len(tok), wrong), eps)
    n_actions = sum(len(action_spans(e.action_mask)) for e in eps)
    assert acc["a0"] == 1.0 and acc["a1"] == 0.0
    assert acc["all"] == (n_actions - len(eps)) / n_actions


def test_untrained_model_is_scored_and_left_in_its_mode():
    tok, eps = _episodes(4)
    model = tiny_model().train()
    acc = action_accuracy(model, eps)
    assert 0.0 <= acc["all"] <= 1.0 and model.training
