"""Latent composer + teacher injection on a tiny Qwen3 built from a config."""

import pytest
import torch

from lopd.config import ComposerParams
from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, make_tasks, run_episode
from lopd.latent.composer import Composer, ComposerAnchor
from lopd.latent.teacher import (
    add_latent_placeholder,
    align_to_student,
    collate_teacher,
    split_at_placeholder,
    teacher_example,
    teacher_logprobs,
    teacher_prompt,
)
from lopd.policy.chat import LATENT_PH, encode, render_prompt
from lopd.policy.rollout import Trajectory, tokenize_episode
from lopd.policy.scoring import token_logprobs
from lopd.train.lm_train import IGNORE, collate
from lopd.train.losses import masked_mean, topm_kl_per_token, topm_reverse_kl_per_token
from tests.helpers import tiny_model, tiny_tokenizer

CP = ComposerParams(num_latents=4, depth=2, num_heads=4, max_input_tokens=96)
N_RET = 2


@pytest.fixture(scope="module")
def episodes():
    """(messages, ids, action_mask, prompt_len, task text, observation-lite text) of two expert episodes."""
    tok, out = tiny_tokenizer(), []
    for task in make_tasks("train", 2):
        env = ToolWorldEnv(task)
        messages = env.initial_observation()
        ep = run_episode(env, ScriptedExpert())
        ids, mask = tokenize_episode(tok, messages, ep["actions"], ep["observations"][:-1])
        lite = "\n".join(f"{a} -> {s}" for a, s in zip(ep["actions"], ep["shorts"]))
        out.append((messages, ids, mask, len(encode(tok, render_prompt(tok, messages))), task.text, lite))
    return out


def make_composer(seed: int = 0, lora_noise: bool = True) -> Composer:
    composer = Composer.build(tiny_model(), tiny_tokenizer(), CP, seed=seed)
    if lora_noise:  # peft starts lora_B at 0 (LoRA = identity); make the adapter matter
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for n, p in composer.trainable_named_parameters().items():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return composer


def base_snapshot(composer: Composer) -> dict:
    return {n: t.clone() for n, t in composer.backbone.get_base_model().state_dict().items() if "lora_" not in n}


def batches(episodes, n_latents: int):
    """Student (ids, attn, mask) and the matching teacher batch."""
    tok = tiny_tokenizer()
    ids_BT, attn_BT, labels_BT = collate([(ids, mask) for _, ids, mask, *_ in episodes], tok.pad_token_id)
    prompts = [teacher_prompt(tok, m, n_latents) for m, *_ in episodes]
    examples = [align_to_student(p, ids, mask, plen) for p, (_, ids, mask, plen, *_) in zip(prompts, episodes)]
    return ids_BT, attn_BT, labels_BT != IGNORE, collate_teacher(examples, tok.pad_token_id)


# ----------------------------------------------------------------------------- teacher prompt


def test_latent_slots_sit_where_the_placeholder_was_and_the_rest_is_the_students(episodes):
    tok = tiny_tokenizer()
    messages, ids, mask, plen, *_ = episodes[0]
    n = N_RET * CP.num_latents
    prompt = teacher_prompt(tok, messages, n)
    text = render_prompt(tok, add_latent_placeholder(messages))
    assert text.count(LATENT_PH) == 1 and "similar tasks: " + LATENT_PH in text
    # The tiny tokenizer has the placeholder as one special token: where it lands, the slots are.
    whole = encode(tok, text)
    j = whole.index(tok.convert_tokens_to_ids(LATENT_PH))
    slots = [i for i, m in enumerate(prompt.latent_mask) if m]
    assert slots == list(range(j, j + n))
    assert prompt.ids[:j] + prompt.ids[j + n:] == whole[:j] + whole[j + 1:]
    assert tok.decode(prompt.ids[:j]) + tok.decode(prompt.ids[j + n:]) == text.replace(LATENT_PH, "")

    ex = align_to_student(prompt, ids, mask, plen)
    assert ex.shift == len(prompt.ids) - plen > n
    assert ex.ids[len(prompt.ids):] == ids[plen:]  # everything after the prompt is the student's
    assert ex.action_mask[len(prompt.ids):] == mask[plen:] and not any(ex.action_mask[: len(prompt.ids)])
    assert [i for i, m in zip(ex.ids, ex.action_mask) if m] == [i for i, m in zip(ids, mask) if m]
    assert sum(ex.latent_mask) == n and not any(ex.latent_mask[len(prompt.ids):])

    traj = Trajectory("r", "t", "f", 0, token_ids=list(ids), action_mask=list(mask), prompt_len=plen)
    assert teacher_example(tok, messages, traj, n) == ex
    with pytest.raises(ValueError, match="not the rendering"):
        teacher_example(tok, episodes[1][0], traj, n)


def test_missing_or_duplicated_placeholder_is_a_clear_error(episodes):
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="exactly once; it is missing"):
        split_at_placeholder(tok, "no sentinel here", 4)
    messages = [dict(m) for m in episodes[0][0]]
    messages[1]["content"] += f" {LATENT_PH}"
    with pytest.raises(ValueError, match="exactly once; it appears 2 times"):
        teacher_prompt(tok, messages, 4)


def test_a_tokenizer_without_the_sentinel_token_gets_the_same_slots(episodes):
    """A real Qwen3 tokenizer has no <|LATENT_PH|>: splitting the text must not depend on it."""
    tok = tiny_tokenizer()
    other = "<<NOT_A_TOKEN>>"
    prompt = teacher_prompt(tok, episodes[0][0], 5, placeholder=other)
    ref = teacher_prompt(tok, episodes[0][0], 5)
    assert prompt.latent_mask == ref.latent_mask
    assert [i for i, m in zip(prompt.ids, prompt.latent_mask) if not m] == [i for i, m in zip(ref.ids, ref.latent_mask) if not m]
    assert {i for i, m in zip(prompt.ids, prompt.latent_mask) if m} == {tok.pad_token_id}


# ----------------------------------------------------------------------------- composer


def test_latent_shapes_follow_n_ret_and_k(episodes):
    composer = make_composer()
    tasks = [e[4] for e in episodes]
    d = composer.backbone.config.hidden_size
    for n_ret in (1, N_RET):
        lat = composer(tasks, [[e[5]] * n_ret for e in episodes])
        assert lat.shape == (len(tasks), n_ret * CP.num_latents, d)
    assert composer.resampler.queries.shape == (CP.num_latents, d)
    with pytest.raises(ValueError, match="same non-zero number"):
        composer(tasks, [[episodes[0][5]], [episodes[0][5]] * 2])


def test_one_experience_under_two_tasks_gives_different_latents(episodes):
    composer = make_composer()
    experience = episodes[0][5]
    with torch.no_grad():
        lat = composer([episodes[0][4], episodes[1][4]], [[experience], [experience]])
        again = composer([episodes[0][4]], [[experience]])
    assert not torch.allclose(lat[0], lat[1], atol=1e-4)
    assert torch.allclose(lat[0], again[0], atol=1e-5)  # deterministic for the same inputs


def test_teacher_step_trains_lora_and_resampler_never_the_backbone(episodes):
    composer = make_composer(lora_noise=False)  # the spec's init: lora_B = 0
    before = base_snapshot(composer)
    phi_before = {n: p.detach().clone() for n, p in composer.trainable_named_parameters().items()}
    ids_BT, _, mask_BT, batch = batches(episodes, N_RET * CP.num_latents)
    latents = composer([e[4] for e in episodes], [[e[5], e[5]] for e in episodes])
    latents.retain_grad()
    scores = teacher_logprobs(composer.backbone, batch, latents, ids_BT, mask_BT)
    nll = -masked_mean(scores.token_logp_BT, mask_BT)  # cold-start NLL under the latent-conditioned teacher
    opt = torch.optim.AdamW(composer.trainable_parameters(), lr=1e-2)
    nll.backward()

    assert latents.grad.abs().sum() > 0
    grads = {n: p.grad for n, p in composer.trainable_named_parameters().items()}
    assert all(g is not None for g in grads.values())
    assert any(g.abs().sum() > 0 for n, g in grads.items() if "lora_B" in n)  # lora_A's is 0 while B = 0
    assert all(grads[n].abs().sum() > 0 for n in ("resampler.queries", "resampler.proj_out.weight", "resampler.block.attn.in_proj_weight"))
    assert all(p.grad is None for n, p in composer.named_parameters() if n not in grads)
    opt.step()

    after = base_snapshot(composer)
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    moved = [n for n, p in composer.trainable_named_parameters().items() if not torch.equal(p, phi_before[n])]
    assert any("lora_B" in n for n in moved) and any(n.startswith("resampler.") for n in moved)


def test_teacher_with_adapter_disabled_is_the_plain_base_model(episodes):
    composer = make_composer()
    plain = tiny_model()  # same seed, never wrapped: the base weights
    ids_BT, _, mask_BT, batch = batches(episodes, 0)  # a teacher prompt with zero latent slots
    no_latents = torch.zeros(len(episodes), 0, composer.backbone.config.hidden_size)
    with torch.no_grad():
        teacher = teacher_logprobs(composer.backbone, batch, no_latents, ids_BT, mask_BT)
        base_logits = plain(input_ids=batch.ids_BT, attention_mask=batch.attn_BT).logits
        lora_on, _ = token_logprobs(composer.backbone, batch.ids_BT, batch.attn_BT, batch.action_mask_BT)
    t_mask = batch.action_mask_BT
    base_NV = base_logits[:, :-1][t_mask[:, 1:]].log_softmax(-1)
    assert torch.allclose(teacher.logp_BTV[mask_BT], base_NV, atol=1e-5)
    assert not torch.allclose(lora_on[t_mask], base_NV, atol=1e-3)  # the adapter does change the model...
    assert composer.backbone.active_adapters == ["encoder"] and not composer.backbone._adapters_disabled  # ...and is back on


def test_teacher_topm_matches_full_vocabulary_and_feeds_the_kl(episodes):
    composer = make_composer()
    ids_BT, attn_BT, mask_BT, batch = batches(episodes, N_RET * CP.num_latents)
    with torch.no_grad():
        latents = composer([e[4] for e in episodes], [[e[5], e[5]] for e in episodes])
        full = teacher_logprobs(composer.backbone, batch, latents, ids_BT, mask_BT)
        top = teacher_logprobs(composer.backbone, batch, latents, ids_BT, mask_BT, top_m=5)
        student_BTV, _ = token_logprobs(tiny_model(seed=1), ids_BT, attn_BT, mask_BT)
    assert torch.allclose(top.topm_logp_BTM[mask_BT], full.logp_BTV[mask_BT].topk(5, dim=-1).values)
    assert torch.equal(top.token_logp_BT, full.token_logp_BT)
    assert (full.token_logp_BT[mask_BT] < 0).all() and (full.token_logp_BT[~mask_BT] == 0).all()
    kl_top = topm_kl_per_token(student_BTV.gather(-1, top.topm_ids_BTM), top.topm_logp_BTM)
    kl_full = topm_reverse_kl_per_token(student_BTV, full.logp_BTV, 5)
    assert torch.allclose(kl_top[mask_BT], kl_full[mask_BT], atol=1e-6)
    bad = batches(episodes[:1] * 2, N_RET * CP.num_latents)[3]  # teacher rows from another batch
    with pytest.raises(ValueError, match="action tokens"):
        teacher_logprobs(composer.backbone, bad, latents, ids_BT, mask_BT)


def test_save_load_round_trip_and_the_frozen_anchor(episodes, tmp_path):
    composer = make_composer()
    inputs = ([e[4] for e in episodes], [[e[5], episodes[1][5]] for e in episodes])
    with torch.no_grad():
        phi0 = composer(*inputs)
    anchor = ComposerAnchor(composer)
    composer.save(tmp_path / "phi0")
    assert (tmp_path / "phi0" / "encoder" / "adapter_model.safetensors").exists()
    assert (tmp_path / "phi0" / "resampler.safetensors").exists()

    loaded = Composer.load(tiny_model(), tiny_tokenizer(), tmp_path / "phi0")
    with torch.no_grad():
        assert torch.equal(loaded(*inputs), phi0)

    with torch.no_grad():  # training moves φ away from φ₀
        for p in composer.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
        phi = composer(*inputs)
    assert not torch.allclose(phi, phi0, atol=1e-4)
    assert torch.equal(anchor.latents(*inputs), phi0)
    from_dir = ComposerAnchor.from_dir(composer, tmp_path / "phi0")
    with torch.no_grad():
        assert torch.equal(from_dir.latents(*inputs), phi0)
        assert torch.equal(composer(*inputs), phi)  # loading φ₀ left φ untouched
    with pytest.raises(FileNotFoundError, match="no composer"):
        Composer.load(tiny_model(), tiny_tokenizer(), tmp_path / "nope")
