"""Cold start of the composer (issue #4): the SFT loop, the privilege metrics, episode replay."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from lopd.config import load_params
from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, make_tasks, run_episode
from lopd.latent.composer import Composer
from lopd.envs.toolworld.lite import lite_text
from lopd.memory.bank import BANK_COLUMNS
from lopd.policy.rollout import tokenize_episode
from lopd.stages import cold_start
from lopd.train.episodes import replay_entry
from tests.helpers import tiny_model, tiny_tokenizer
from tests.memory.test_retrieval import retriever_for


def _params(repo, **over):
    sets = [
        "composer.num_latents=2", "composer.depth=1", "composer.num_heads=2", "retrieval.n_ret=2",
        "cold_start.lr=0.01", "cold_start.batch_size=4", "cold_start.epochs=3", "env.max_turns=8",
    ] + [f"{k}={v}" for k, v in over.items()]
    return load_params(repo / "params.yaml", None, sets)


def _expert_bank(tasks) -> pd.DataFrame:
    rows = []
    for task in tasks:
        ep = run_episode(ToolWorldEnv(task), ScriptedExpert())
        rows.append({
            "bank_id": f"b-{task.task_id}", "task_id": task.task_id, "family": task.family, "task_text": task.text,
            "steps_json": json.dumps([{"action": a, "result": s} for a, s in zip(ep["actions"], ep["shorts"])]),
            "lite_text": lite_text(task.text, ep["actions"], ep["shorts"]), "reward": ep["reward"], "success": True,
            "source_round": 0, "model": "expert",
        })
    return pd.DataFrame(rows, columns=list(BANK_COLUMNS))


def test_replayed_bank_entry_is_the_tokenised_episode():
    tok = tiny_tokenizer()
    task = make_tasks("train", 1)[0]
    env = ToolWorldEnv(task)
    ep = run_episode(env, ScriptedExpert())
    bank = _expert_bank([task])
    episode = replay_entry(tok, task, bank.steps_json[0], lambda t: ToolWorldEnv(t, 8, 0.8))
    ids, mask = tokenize_episode(tok, ToolWorldEnv(task).initial_observation(), ep["actions"], ep["observations"])
    assert (episode.token_ids, episode.action_mask, episode.reward) == (ids, mask, 1.0)
    assert not any(mask[: episode.prompt_len]) and mask[episode.prompt_len] == 1


def test_cold_start_lowers_teacher_nll_and_never_touches_the_backbone(repo):
    p = _params(repo)
    tok = tiny_tokenizer()
    tasks = make_tasks("train", 8)
    bank = _expert_bank(tasks)
    targets = [replay_entry(tok, t, s, lambda t: ToolWorldEnv(t, 8, 0.8)) for t, s in zip(tasks, bank.steps_json)]
    backbone = tiny_model()
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    composer = Composer.build(backbone, tok, p.composer, seed=0)
    losses, timer = cold_start.train(p, composer, tok, targets, retriever_for(bank))
    assert len(losses) == 3 * 2  # 8 targets / batch 4, 3 epochs
    assert losses[-1] < losses[0]
    base = composer.backbone.get_base_model().state_dict()
    assert all(torch.equal(base[k], v) for k, v in before.items() if k in base)
    assert set(timer.per_step_ms()) == {"encoder", "resampler", "teacher_forward", "backward"}


@pytest.mark.parametrize("objective", ["text_kl", "mix"])
def test_text_kl_cold_start_moves_the_latent_teacher_towards_the_text_teacher(repo, objective):
    p = _params(repo, **{"cold_start.objective": objective, "cold_start.kl_weight": 2.0, "cold_start.lr_schedule": "cosine"})
    tok = tiny_tokenizer()
    tasks = make_tasks("train", 8)
    bank = _expert_bank(tasks)
    targets = [replay_entry(tok, t, s, lambda t: ToolWorldEnv(t, 8, 0.8)) for t, s in zip(tasks, bank.steps_json)]
    targets[0].reward, targets[0].success = 0.0, False  # failures are trained on too (KL), never as NLL targets
    composer = Composer.build(tiny_model(), tok, p.composer, seed=0)
    retriever = retriever_for(bank)
    exps = [[x["lite_text"] for x in hits] for hits in retriever.retrieve_batch([e.task for e in targets], p.retrieval.n_ret)]

    def kl_now() -> float:
        with torch.no_grad():
            return cold_start.batch_loss(p.model_copy(update={"cold_start": p.cold_start.model_copy(update={"objective": "text_kl"})}),
                                         composer, tok, targets, exps, cold_start.Timer())[1]["text_kl"]

    before = kl_now()
    losses, timer = cold_start.train(p, composer, tok, targets, retriever)
    if objective == "text_kl":
        assert kl_now() < before  # the latents now say more of what the text says
    else:  # on a random tiny model the KL is ~1e-6 beside the NLL: the sum is what falls
        assert losses[-1] < losses[0]
    assert "text_teacher" in timer.per_step_ms()
    _, parts = cold_start.batch_loss(p, composer, tok, targets[:1], exps[:1], cold_start.Timer())
    if objective == "mix":  # the one failure alone: no NLL target, only the KL
        assert parts["nll"] == 0.0 and parts["text_kl"] > 0
    else:
        assert set(parts) == {"text_kl"}


def test_lr_schedule_warms_up_then_decays_to_zero():
    f = cold_start.lr_lambda("cosine", 100)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0) and f(10) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.5) and f(100) == pytest.approx(0.0, abs=1e-12)
    assert cold_start.lr_lambda("constant", 100)(57) == 1.0


def test_privilege_metrics_are_finite_and_weighted_by_outcome(repo):
    p = _params(repo, **{"cold_start.epochs": 1})
    tok = tiny_tokenizer()
    train, dev = make_tasks("train", 6), make_tasks("dev", 4)
    bank = _expert_bank(train)
    dev_eps = [replay_entry(tok, t, s, lambda t: ToolWorldEnv(t, 8, 0.8)) for t, s in zip(dev, _expert_bank(dev).steps_json)]
    dev_eps[0].reward, dev_eps[0].success = 0.0, False  # one failure: A(τ) = −1 flips its δ
    composer = Composer.build(tiny_model(), tok, p.composer, seed=0)
    m = cold_start.privilege_metrics(p, composer, tiny_model(), tok, dev_eps, retriever_for(bank), bank)
    assert m["n_dev_successes"] == 3 and m["n_dev_episodes"] == 4
    for key in ("nll_no_latents", "nll_random_latents", "nll_retrieved_latents", "nll_retrieved_text", "delta_mean"):
        assert m[key] == pytest.approx(m[key]) and abs(m[key]) < 50  # finite
    # Without latents the teacher is the student: an untrained composer still changes the prompt,
    # so the no-latent NLL (the bare student) differs from the latent ones.
    assert m["nll_no_latents"] != m["nll_retrieved_latents"]


def test_too_small_bank_is_a_clear_error_before_any_training(repo, tmp_path):
    from lopd.memory.bank import round_path
    from lopd.ops.validation import DataValidationError

    p = load_params(repo / "params.yaml", None, [f"paths.root={tmp_path}", "bank.min_size=5"])
    path = round_path(tmp_path / "data" / "bank", 0)
    path.parent.mkdir(parents=True)
    _expert_bank(make_tasks("train", 2)).to_parquet(path)
    with pytest.raises(DataValidationError, match="bank holds 2 successful trajectories, fewer than bank.min_size = 5"):
        cold_start.run(p)


def test_warmup_stage_autoencodes_train_tasks_pairs_and_reports_dev_accuracy(repo, monkeypatch):
    import mlflow

    from lopd.policy.engine import split_tasks

    p = _params(repo, **{"cold_start.warmup_steps": 4, "cold_start.warmup_tasks": 5, "cold_start.warmup_batch_size": 3})
    tok = tiny_tokenizer()
    retriever = retriever_for(_expert_bank(make_tasks("train", 8)))
    pairs = cold_start.warmup_pairs(p, retriever, "train", 5)
    assert len(pairs) == 5 * p.retrieval.n_ret and {t for t, _ in pairs} == {t.text for t in split_tasks(p, "train", 5)}
    logged = []  # what the stage sends to MLflow (the stage run is opened by the caller)
    monkeypatch.setattr(mlflow, "log_metric", lambda k, v, step=None: logged.append((k, step)))
    monkeypatch.setattr(mlflow, "log_metrics", lambda d, step=None: logged.extend((k, step) for k in d))
    composer = Composer.build(tiny_model(), tok, p.composer, seed=0)
    out = cold_start.run_warmup(p, composer, tok, retriever, eval_tasks=2)
    assert out["steps"] == 4 and out["pairs"] == len(pairs)
    assert 0.0 <= out["dev_token_accuracy"] <= 1.0 and out["final_loss"] < out["first_loss"]
    assert [s for k, s in logged if k == "warmup_loss"] == [0, 1, 2, 3] and ("warmup_dev_token_accuracy", None) in logged
