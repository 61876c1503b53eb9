"""Masked next-token training: the loss only sees action tokens, and training lowers it."""

import random

import pytest
import torch

from lopd.train.lm_train import IGNORE, collate, lr_at, make_batches, masked_nll, train_causal_lm
from tests.helpers import tiny_model, tiny_tokenizer


def test_collate_masks_non_action_tokens_and_padding():
    ids_BT, attn_BT, labels_BT = collate([([5, 6, 7], [0, 1, 1]), ([8], [1])], pad_id=0)
    assert ids_BT.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert attn_BT.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert labels_BT.tolist() == [[IGNORE, 6, 7], [8, IGNORE, IGNORE]]


def test_masked_nll_equals_hf_loss_and_the_hand_computed_action_nll():
    model, tok = tiny_model(), tiny_tokenizer()
    ids_BT, attn_BT, labels_BT = collate([([5, 6, 7, 8, 9], [0, 0, 1, 1, 1]), ([5, 6, 7], [0, 1, 1])], tok.pad_token_id)
    ours = masked_nll(model, ids_BT, attn_BT, labels_BT)
    torch.testing.assert_close(ours, model(input_ids=ids_BT, attention_mask=attn_BT, labels=labels_BT).loss)
    # By hand: the mean NLL of exactly the action tokens (targets 7, 8, 9 and 6, 7).
    logits = model(input_ids=ids_BT, attention_mask=attn_BT).logits.log_softmax(-1)
    by_hand = -torch.stack([logits[0, 1, 7], logits[0, 2, 8], logits[0, 3, 9], logits[1, 0, 6], logits[1, 1, 7]]).mean()
    torch.testing.assert_close(ours, by_hand)


def test_batches_cover_every_example_once():
    batches = make_batches([5, 1, 9, 3, 7, 2, 8], batch_size=3, rng=random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(7))
    assert all(len(b) <= 3 for b in batches)


def test_schedule_warms_up_then_decays_to_zero():
    assert lr_at(0, 100, 1.0, 10) == 0.1 and lr_at(9, 100, 1.0, 10) == 1.0
    assert abs(lr_at(10, 100, 1.0, 10) - 1.0) < 1e-9 and lr_at(100, 100, 1.0, 10) == 0.0


def test_training_lowers_the_loss_and_is_seeded():
    tok = tiny_tokenizer()
    ids = tok("<tool_call>{\"name\": \"find_account\"}</tool_call>", add_special_tokens=False)["input_ids"]
    examples = [(ids, [0] + [1] * (len(ids) - 1))] * 8
    runs = []
    for _ in range(2):
        model = tiny_model(seed=1)
        runs.append(train_causal_lm(model, examples, pad_id=tok.pad_token_id, epochs=15, lr=1e-2, batch_size=4, seed=3))
    assert runs[0] == runs[1]  # same seed, same numbers on CPU
    assert runs[0][-1] < 0.5 * runs[0][0]


def test_weighted_nll_is_the_weighted_mean_of_token_nlls():
    model = tiny_model()
    ids_BT = torch.tensor([[5, 6, 7, 8]])
    attn_BT = torch.ones_like(ids_BT)
    labels_BT = torch.tensor([[IGNORE, IGNORE, 7, 8]])
    with torch.no_grad():
        logp = model(ids_BT).logits[0].log_softmax(-1)
        nll7, nll8 = -logp[1, 7].item(), -logp[2, 8].item()
        plain = masked_nll(model, ids_BT, attn_BT, labels_BT).item()
        weighted = masked_nll(model, ids_BT, attn_BT, labels_BT, torch.tensor([[0.0, 0.0, 3.0, 1.0]])).item()
    assert plain == pytest.approx((nll7 + nll8) / 2, rel=1e-5)
    assert weighted == pytest.approx((3 * nll7 + nll8) / 4, rel=1e-5)
