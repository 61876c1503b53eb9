"""The teacher as a policy: rollouts of the base with latents in its placeholder slots (tiny model from a config)."""

import pytest
import torch
from helpers import tiny_model, tiny_tokenizer

from lopd.envs.toolworld import ToolWorldEnv, make_tasks
from lopd.latent.teacher import inject_latents
from lopd.latent.teacher_rollout import LatentBackend, LatentContextEnv, first_prompt
from lopd.policy.backends import HFBackend
from lopd.policy.rollout import RolloutEngine

N_LATENTS = 3


def _env(task):
    return LatentContextEnv(ToolWorldEnv(task, max_turns=2), N_LATENTS)


def _engine(backend, tok):
    return RolloutEngine(backend, tok, _env, max_new_tokens=10, batch_size=3, max_seq_len=4096)


def _register(backend, tok, tasks, latents_for):
    for t in tasks:
        backend.register(first_prompt(tok, _env(t)), latents_for(t))


def test_latents_equal_to_the_slot_embeddings_sample_what_the_plain_model_samples():
    tok, model = tiny_tokenizer(), tiny_model()
    tasks = make_tasks("dev", 4)
    latent = LatentBackend(model, tok, 0.7, 0.95)
    slot_embed_D = model.get_input_embeddings().weight[latent.slot_id].detach()
    _register(latent, tok, tasks, lambda t: slot_embed_D.expand(N_LATENTS, -1))
    a = _engine(latent, tok).run(tasks, samples_per_task=2, seed=5, progress=False)
    b = _engine(HFBackend(model, tok, 0.7, 0.95), tok).run(tasks, samples_per_task=2, seed=5, progress=False)
    assert [t.token_ids for t in a] == [t.token_ids for t in b]
    assert sum(t.token_ids.count(latent.slot_id) for t in a) == N_LATENTS * len(a)  # the slots are in every prompt
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=1e-5)


def test_sampled_logprobs_are_the_teachers_with_each_episodes_latents_across_turns():
    """Temperature 1, top-p 1: every recorded log-prob is a full forward over the episode with its latents injected."""
    tok, model = tiny_tokenizer(), tiny_model()
    tasks = make_tasks("dev", 3)
    backend = LatentBackend(model, tok, 1.0, 1.0)
    gen = torch.Generator().manual_seed(0)
    lat = {t.task_id: torch.randn(N_LATENTS, model.config.hidden_size, generator=gen) for t in tasks}
    _register(backend, tok, tasks, lambda t: lat[t.task_id])
    trajs = _engine(backend, tok).run(tasks, seed=3, progress=False)
    for traj in trajs:
        ids_1T = torch.tensor([traj.token_ids])
        n = traj.prompt_len
        slots_1T = torch.zeros_like(ids_1T)
        slots_1T[0, :n] = ids_1T[0, :n] == backend.slot_id
        with torch.no_grad():
            embeds = inject_latents(model, ids_1T, slots_1T, lat[traj.task_id][None])
            logp_TV = model(inputs_embeds=embeds).logits[0].log_softmax(-1)
        recomputed = logp_TV[:-1].gather(-1, ids_1T[0, 1:, None])[:, 0]
        mask = torch.tensor(traj.action_mask[1:], dtype=torch.bool)
        torch.testing.assert_close(recomputed[mask], torch.tensor(traj.logprobs[1:])[mask], atol=1e-4, rtol=1e-4)
    # and the latents matter: other latents give other log-probs on the same first prompt
    other = LatentBackend(model, tok, 1.0, 1.0)
    _register(other, tok, tasks, lambda t: torch.zeros(N_LATENTS, model.config.hidden_size))
    torch.manual_seed(3)
    g_other = other.generate([first_prompt(tok, _env(tasks[0]))], 4)[0]
    torch.manual_seed(3)
    g_mine = backend.generate([first_prompt(tok, _env(tasks[0]))], 4)[0]
    assert g_other.logprobs[0] != pytest.approx(g_mine.logprobs[0], abs=1e-6) or g_other.token_ids != g_mine.token_ids


def test_slot_count_and_unregistered_prompts_are_clear_errors():
    tok, model = tiny_tokenizer(), tiny_model()
    task = make_tasks("dev", 1)[0]
    backend = LatentBackend(model, tok, 1.0, 1.0)
    with pytest.raises(ValueError, match=f"{N_LATENTS} latent slots, the composer gave 2 latents"):
        backend.register(first_prompt(tok, _env(task)), torch.zeros(2, model.config.hidden_size))
    with pytest.raises(KeyError, match="register every episode"):
        backend.generate([first_prompt(tok, _env(task))], 4)
