"""Masked next-token training: the loss only sees action tokens, and training lowers it."""

import random

import pytest
import torch

from lopd.lm_train import IGNORE, collate, lr_at, make_batches, masked_nll, train_causal_lm
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


def test_copy_weights_mark_argument_values_and_answers_only():
    from lopd.bootstrap import copy_spans, episode_weights
    from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, make_tasks, run_episode
    from lopd.rollout import tokenize_episode

    action = '<tool_call>{"name": "transfer", "arguments": {"from_id": "acc_123", "amount_cents": 23400}}</tool_call>'
    assert [action[a:b] for a, b in copy_spans(action)] == ['"acc_123"', "23400"]
    assert copy_spans("Done.") == [(0, 5)]
    tok = tiny_tokenizer()
    task = make_tasks("train", 1)[0]
    env = ToolWorldEnv(task)
    messages = env.initial_observation()
    ep = run_episode(env, ScriptedExpert())
    ids, mask = tokenize_episode(tok, messages, ep["actions"], ep["observations"])
    w = episode_weights(tok, ids, mask, ep["actions"], 4.0)
    assert len(w) == len(ids)
    assert all((x > 0) == bool(m) for x, m in zip(w, mask))  # loss only on actions, as before
    heavy = tok.decode([i for i, x in zip(ids, w) if x == 4.0])
    first = ep["actions"][0]
    value = first[slice(*copy_spans(first)[0])].strip('"')  # e.g. the owner's name
    assert value in heavy and "tool_call" not in heavy


def test_short_context_examples_train_each_action_on_task_and_previous_turn_only():
    from lopd.bootstrap import short_context_examples
    from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, make_tasks, run_episode

    tok = tiny_tokenizer()
    task = make_tasks("train", 1)[0]
    env = ToolWorldEnv(task)
    messages = env.initial_observation()
    ep = run_episode(env, ScriptedExpert())
    examples = short_context_examples(tok, [(messages, ep["actions"], ep["observations"])])
    assert len(examples) == len(ep["actions"]) >= 3
    system = messages[0]["content"]
    for i, (ids, mask) in enumerate(examples):
        text = tok.decode(ids)
        assert system not in text and messages[1]["content"] in text  # the task, no system prompt
        target = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True)
        assert target == ep["actions"][i]  # the loss is on this action only
        if i:  # the previous turn is context
            assert ep["actions"][i - 1] in text and ep["observations"][i - 1] in text
        assert text.count("<|im_start|>assistant") == (2 if i else 1)  # nothing older than that


def test_with_experiences_adds_same_family_peer_successes_in_the_teacher_framing():
    from lopd.bootstrap import with_experiences
    from lopd.teacher import LATENT_FRAMING

    head = LATENT_FRAMING.split("{placeholder}")[0]
    sys = {"role": "system", "content": "tools"}
    demos = [([sys, {"role": "user", "content": f"task {i}"}], [f"a{i}"], [f"o{i}"]) for i in range(6)]
    # demo 2 failed (no lite text); demo 5 is the only one of its family.
    lites = [("bank", "L0"), ("bank", "L1"), ("bank", None), ("shop", "L3"), ("shop", "L4"), ("cal", "L5")]
    assert with_experiences(demos, lites, 0.0, 3, seed=0) is demos
    out = with_experiences(demos, lites, 1.0, 3, seed=0)
    assert out == with_experiences(demos, lites, 1.0, 3, seed=0)  # seeded
    for i, ((messages, actions, obs), (family, _)) in enumerate(zip(out, lites)):
        assert (actions, obs, messages[1:]) == (demos[i][1], demos[i][2], demos[i][0][1:])  # only the system message changes
        content = messages[0]["content"]
        if i == 5:  # no same-family peer: unchanged
            assert content == "tools"
            continue
        assert content.startswith("tools\n\n" + head)
        used = content.split(head)[1].split("\n\n")
        peers = {f"L{j}" for j, (f, lite) in enumerate(lites) if f == family and lite and j != i}
        assert 1 <= len(used) <= 3 and set(used) <= peers  # same family, successes only, never itself
    assert demos[0][0][0]["content"] == "tools"  # the input is not modified
    # frac 0.5 leaves some demos bare
    half = with_experiences(demos * 20, lites * 20, 0.5, 3, seed=1)
    n_with = sum(head in m[0]["content"] for m, _, _ in half)
    assert 0 < n_with < 100
