"""The composer's autoencoding warm-up: its loss against hand values, its targets, and that it learns."""

from __future__ import annotations

import pytest
import torch

from lopd.config import ComposerParams
from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, make_tasks, run_episode
from lopd.latent.composer import Composer
from lopd.envs.toolworld.lite import lite_text
from lopd.policy.chat import encode
from lopd.train import composer_warmup
from lopd.train.losses import latent_reconstruction
from tests.helpers import tiny_model, tiny_tokenizer


def test_latent_reconstruction_matches_hand_values():
    latents_NKD = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    target_NKD = torch.tensor([[[0.0, 0.0], [0.0, 0.0]]])
    # slot 0: ‖(1, 0)‖² = 1; slot 1: ‖(0, 2)‖² = 4; mean 2.5; / scale 2 = 1.25
    assert latent_reconstruction(latents_NKD, target_NKD, scale=2.0).item() == pytest.approx(1.25)
    assert latent_reconstruction(target_NKD, target_NKD, scale=2.0).item() == 0.0


def test_targets_are_the_last_k_tokens_left_padded():
    tok = tiny_tokenizer()
    long, short = "find_payee(name='Bob') -> p1\npay(payee='p1', amount=34)", "confirm()"
    ids = composer_warmup.target_ids(tok, [long, short], k=4)
    assert ids[0].tolist() == encode(tok, long)[-4:]
    n = len(encode(tok, short))
    assert n < 4 and ids[1, 4 - n:].tolist() == encode(tok, short) and (ids[1, : 4 - n] == tok.pad_token_id).all()


def _pairs(n: int) -> list[tuple[str, str]]:
    out = []
    for task in make_tasks("train", n):
        ep = run_episode(ToolWorldEnv(task), ScriptedExpert())
        out.append((task.text, lite_text(task.text, ep["actions"], ep["shorts"])))
    return out


def test_warmup_lowers_the_reconstruction_loss_and_leaves_the_backbone_alone():
    tok = tiny_tokenizer()
    backbone = tiny_model()
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    cp = ComposerParams(num_latents=4, depth=1, num_heads=2)
    composer = Composer.build(backbone, tok, cp, seed=0)
    pairs = _pairs(6)
    acc0 = composer_warmup.token_accuracy(composer, tok, pairs)
    result = composer_warmup.warmup(composer, tok, pairs, pairs, steps=60, lr=1e-2, batch_size=4, grad_clip=1.0, seed=0)
    assert len(result.losses) == 60
    assert sum(result.losses[-5:]) / 5 < 0.5 * sum(result.losses[:5]) / 5
    assert 0.0 <= acc0 < result.token_accuracy <= 1.0  # the latents now sit nearer their target tokens
    base = composer.backbone.get_base_model().state_dict()
    assert all(torch.equal(base[k], v) for k, v in before.items() if k in base)


def test_warmup_without_pairs_is_a_clear_error():
    composer = Composer.build(tiny_model(), tiny_tokenizer(), ComposerParams(num_latents=2, depth=1, num_heads=2), seed=0)
    with pytest.raises(ValueError, match="no \\(task, experience\\) pairs"):
        composer_warmup.warmup(composer, tiny_tokenizer(), [], [], steps=1, lr=1e-3, batch_size=1, grad_clip=1.0, seed=0)


def test_first_k_targets_are_right_padded_and_ceiling_latents_are_the_token_embeddings():
    tok = tiny_tokenizer()
    text, short = "find_payee(name='Bob') -> p1\npay(payee='p1', amount=34)", "confirm()"
    ids = composer_warmup.target_ids(tok, [text, short], k=4, end="first")
    n = len(encode(tok, short))
    assert ids[0].tolist() == encode(tok, text)[:4] and ids[1, :n].tolist() == encode(tok, short)
    assert (ids[1, n:] == tok.pad_token_id).all()
    model = tiny_model()
    lat_BLD = composer_warmup.TokenEmbeddingLatents(model, tok, k=4)(["task"], [[text, short]])
    want = model.get_input_embeddings()(composer_warmup.target_ids(tok, [text, short], k=4).reshape(-1))
    assert lat_BLD.shape == (1, 8, model.config.hidden_size) and torch.equal(lat_BLD[0], want)
