"""`lopd distill` (issue #5): LOPD steps, the GRPO / SFT baselines, budget, rounds, checkpoints and resume.

Everything runs on a throwaway project root with a tiny Qwen3 built from a config, a composer
φ₀ saved from a fresh build, a bank of scripted-expert successes and a FAISS index over a
deterministic fake embedder: CPU, offline, seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lopd import layout
from lopd.config import ParamsError, load_params
from lopd.envs.toolworld import ScriptedExpert, ToolWorldEnv, run_episode
from lopd.envs.toolworld.lite import lite_text
from lopd.latent.composer import Composer
from lopd.memory.bank import BANK_COLUMNS, expert_top_up, read_bank, round_numbers, round_path
from lopd.policy.engine import make_engine, split_tasks
from lopd.policy.rollout import Trajectory, tokenize_episode
from lopd.stages import distill
from lopd.train import loop
from lopd.train.episodes import to_episodes
from lopd.train.lopd_trainer import LOPDTrainer
from lopd.train.losses import dual_update, grpo_advantages
from lopd.train.onpolicy import rollout_budget, step_tasks
from lopd.train.opsd_trainer import OPSDTrainer
from tests.helpers import tiny_model, tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
DIM = 16
# Smoke profile, made smaller still: 2 turns of 8 tokens, 2 experiences of 4 latents.
OVERRIDES = [
    "env.max_turns=5", "rollout.max_new_tokens=8", "rollout.batch_size=8", "env.n_train=64", "env.n_dev=8",
    "env.n_test=8", "retrieval.n_ret=2", "composer.max_input_tokens=64", "distill.steps=2", "distill.batch_tasks=4",
    "distill.eval_dev_tasks=2", "distill.eval_every=1", "distill.checkpoint_every=1", "grpo.group_size=2",
    "bank.expert_top_up=12", "evaluate.n_tasks=3", "evaluate.samples_per_task=2",
]


class FakeEmbedder:
    """Deterministic unit vectors seeded by the text's hash (the retrieval tests' stand-in)."""

    name, fingerprint, dim = "fake", "fake-v1", DIM

    def encode(self, texts, batch_size=64, progress=False):
        out = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=DIM) for t in texts]
        return np.asarray([v / np.linalg.norm(v) for v in out], dtype=np.float32)


def build_project(root: Path, *extra: str, init_std: float | None = None):
    """Base model, composer φ₀, a round-0 bank and its index under ``root``; returns the params.

    ``init_std`` (``tests.helpers.tiny_model``): 0.2 gives a base whose teacher context moves its
    next-token distribution by a measurable KL, for tests that compare KL and Δ."""
    from lopd.memory import index as faiss_index
    from lopd.memory.retrieval import write_index_dir

    p = load_params(REPO / "params.yaml", "smoke", [f"paths.root={root}", *OVERRIDES, *extra])
    tok = tiny_tokenizer()
    tiny_model(init_std=init_std).save_pretrained(layout.base_model_dir(p))
    tok.save_pretrained(layout.base_model_dir(p))
    composer = Composer.build(tiny_model(init_std=init_std), tok, p.composer, seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a cold-started φ₀ has lora_B ≠ 0; make the adapter matter
        for n, q in composer.trainable_named_parameters().items():
            if "lora_B" in n:
                q.copy_(torch.randn(q.shape, generator=g) * 0.1)
    composer.save(layout.composer_dir(p))
    bank = expert_top_up(p, pd.DataFrame(columns=list(BANK_COLUMNS)))
    layout.bank_dir(p).mkdir(parents=True)
    bank.to_parquet(round_path(layout.bank_dir(p), 0), index=False)
    bank = read_bank(layout.bank_dir(p))
    vecs = FakeEmbedder().encode(bank["lite_text"].tolist())
    write_index_dir(layout.index_dir(p), faiss_index.build(vecs, "flat", use_gpu=False), vecs, bank,
                    {"embedder": "fake", "embedder_fingerprint": "fake-v1", "dim": DIM})
    return p


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return build_project(tmp_path_factory.mktemp("distill"))


@pytest.fixture(scope="module")
def sharp_project(tmp_path_factory):
    """A base whose teacher context changes its next tokens by a KL that is not rounding noise (≥ 1e-3)."""
    return build_project(tmp_path_factory.mktemp("distill-sharp"), init_std=0.2)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Fake embedder; no MLflow store (the end-to-end test in test_evaluate.py uses a real one)."""
    import mlflow

    import lopd.memory.embed
    import lopd.ops.tracking

    monkeypatch.setattr(lopd.memory.embed, "make_embedder", lambda p, device=None: FakeEmbedder())
    monkeypatch.setattr(lopd.ops.tracking, "stage_run", lambda *a, **k: contextlib.nullcontext())
    for fn in ("log_metrics", "log_metric", "log_artifact", "log_text"):
        monkeypatch.setattr(mlflow, fn, lambda *a, **k: None)


def with_params(p, *overrides: str):
    return load_params(REPO / "params.yaml", "smoke", [f"paths.root={p.root()}", *OVERRIDES, *overrides])


def lopd_trainer(p):
    from lopd.policy.modeling import load_policy

    student, tok = load_policy(layout.policy_path(p), p.model.dtype)
    return loop.make_trainer(p, "lopd", student, tok)


def lopd_batch(p, trainer, step: int = 0):
    tasks = step_tasks(p, split_tasks(p, "train"), step, trainer.tasks_per_step)
    trajs = make_engine(p, trainer.student, trainer.tokenizer).run(tasks, 1, seed=step, progress=False)
    return tasks, trajs


def snapshot(params) -> dict:
    return {n: t.detach().clone() for n, t in params}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- one LOPD step


def test_lopd_step_moves_student_and_composer_never_the_teacher(project):
    tr = lopd_trainer(project)
    base = tr.composer.backbone.get_base_model()
    teacher0 = snapshot((n, t) for n, t in base.named_parameters() if "lora_" not in n)
    phi0 = snapshot(tr.composer.trainable_named_parameters().items())
    student0 = snapshot(tr.student.named_parameters())
    m = tr.step(0, *lopd_batch(project, tr))

    assert same(teacher0, snapshot((n, t) for n, t in base.named_parameters() if "lora_" not in n))  # bitwise
    phi1 = snapshot(tr.composer.trainable_named_parameters().items())
    assert any("lora_" in n and not torch.equal(phi0[n], phi1[n]) for n in phi0)
    assert any(n.startswith("resampler.") and not torch.equal(phi0[n], phi1[n]) for n in phi0)
    assert not same(student0, snapshot(tr.student.named_parameters()))
    assert m["kl"] > 0 and np.isfinite([m["delta"], m["anchor"], m["composer_loss"]]).all()
    assert m["margin_violation"] == pytest.approx(project.distill.margin - m["delta"])
    assert m["anchor"] == 0.0  # the first step starts at φ = φ₀
    # β follows the dual ascent with this step's Δ.
    assert m["beta"] == tr.beta == dual_update(project.distill.beta0, project.distill.margin, m["delta"], project.distill.eta_beta)


def test_frozen_composer_keeps_phi_bitwise_and_still_trains_the_student(project):
    p = with_params(project, "composer.frozen=true")
    tr = lopd_trainer(p)
    assert tr.opt_composer is None and tr.anchor is None
    phi0 = snapshot(tr.composer.trainable_named_parameters().items())
    student0 = snapshot(tr.student.named_parameters())
    m = tr.step(0, *lopd_batch(p, tr))
    assert same(phi0, snapshot(tr.composer.trainable_named_parameters().items()))
    assert not same(student0, snapshot(tr.student.named_parameters()))
    assert m["anchor"] == 0.0 and "composer_loss" not in m


def test_composer_every_k_updates_phi_only_on_every_kth_step(project):
    p = with_params(project, "distill.composer_every=2")
    tr = lopd_trainer(p)
    phi = [snapshot(tr.composer.trainable_named_parameters().items())]
    metrics = []
    for step in range(3):
        metrics.append(tr.step(step, *lopd_batch(p, tr, step)))
        phi.append(snapshot(tr.composer.trainable_named_parameters().items()))
    assert not same(phi[0], phi[1]) and same(phi[1], phi[2]) and not same(phi[2], phi[3])  # steps 0 and 2 update φ
    assert ["composer_loss" in m for m in metrics] == [True, False, True]
    assert all(m["kl"] > 0 for m in metrics)  # the student learns on every step


def test_composer_kl_weight_zero_leaves_only_margin_and_anchor(project):
    p = with_params(project, "distill.composer_kl_weight=0", "distill.beta0=2.0")
    tr = lopd_trainer(p)
    m = tr.step(0, *lopd_batch(p, tr))
    # step 0 starts at φ = φ₀ (anchor 0): L_φ = β(m − Δ(φ)) with Δ(φ) = the Δ the teacher scored (same φ, same batch)
    assert m["composer_loss"] == pytest.approx(2.0 * (p.distill.margin - m["delta"]), abs=1e-5)


def test_margin_zero_and_student_support_paths(project):
    p = with_params(project, "distill.margin=0", "distill.kl_support=student", "distill.beta0=0.3")
    tr = lopd_trainer(p)
    m = tr.step(0, *lopd_batch(p, tr))
    assert m["margin_violation"] == pytest.approx(-m["delta"])
    assert tr.beta == max(0.0, 0.3 + p.distill.eta_beta * (0.0 - m["delta"]))
    assert m["kl"] > 0


def test_beta_follows_the_dual_update_over_steps(project):
    tr = lopd_trainer(project)
    beta = project.distill.beta0
    for step in range(2):
        m = tr.step(step, *lopd_batch(project, tr, step))
        beta = dual_update(beta, project.distill.margin, m["delta"], project.distill.eta_beta)
        assert m["beta"] == beta


def test_round_end_appends_successes_and_rebuilds_the_index(project, tmp_path):
    p = with_params(project, "paths.root=" + str(project.root()))
    tr = lopd_trainer(p)
    n0 = tr.retriever.index.ntotal
    task = [t for t in split_tasks(p, "train") if t.task_id not in set(read_bank(layout.bank_dir(p))["task_id"])][0]
    env = ToolWorldEnv(task, max_turns=p.env.max_turns + 4)
    ep = run_episode(env, ScriptedExpert())
    ids, mask = tokenize_episode(tr.tokenizer, env.initial_observation(), ep["actions"], ep["observations"][:-1])
    win = Trajectory("lopd-s0-x-0", task.task_id, task.family, 0, ids, mask, [0.0] * len(ids), 10, ep["actions"],
                     ep["observations"], ep["shorts"], 1.0, True)
    tr.pending = []
    from lopd.memory.bank import bank_frame

    tr.pending += bank_frame([win], {task.task_id: task}, "distill-lopd", tr.bank_version + 1, lite_text).to_dict("records")
    tr.end_round(0)
    assert tr.bank_version == 1 and tr.added_rounds == [1] and tr.pending == []
    assert round_path(layout.distill_bank_dir(p), 1).exists() and tr.retriever.index.ntotal == n0 + 1
    assert not round_path(layout.bank_dir(p), 1).exists()  # collect's bank is never touched
    assert (layout.distill_index_dir(p) / "index.faiss").exists()
    tr.end_round(1)  # nothing new: no file, same version
    assert tr.bank_version == 1 and not round_path(layout.distill_bank_dir(p), 2).exists()


# ----------------------------------------------------------------------------- OPSD (text-privilege baseline)


def test_opsd_step_distills_from_the_base_with_experiences_as_text(sharp_project):
    """The teacher is the frozen base reading the retrieved experiences as text; only the student moves."""
    from lopd.policy.modeling import load_policy
    from lopd.policy.scoring import token_logprobs
    from lopd.stages.privilege import context_logp
    from lopd.train.episodes import student_batch
    from lopd.train.losses import masked_mean, topm_kl_per_token

    student, tok = load_policy(layout.policy_path(sharp_project), sharp_project.model.dtype)
    tr = loop.make_trainer(sharp_project, "opsd", student, tok)
    assert isinstance(tr, OPSDTrainer) and not isinstance(tr, LOPDTrainer) and not hasattr(tr, "composer")
    assert not any(q.requires_grad for q in tr.teacher.parameters())
    tasks, trajs = lopd_batch(sharp_project, tr)
    episodes = to_episodes(sharp_project, tasks, trajs)
    texts = ["\n\n".join(x) for x in tr.experiences(tasks)]
    assert all(len(x) > 0 for x in texts)
    ids_BT, attn_BT, mask_BT = student_batch(episodes, tok.pad_token_id)
    # Expected loss, computed before the step from the same pieces: the teacher's log-probs with the
    # experiences as text (the privilege stage's `retrieved_text`), student's reverse KL on its top-M.
    with torch.no_grad():
        t_tok_BT = context_logp(tr.teacher, tok, episodes, texts, ids_BT, mask_BT)
        no_text_BT = context_logp(tr.teacher, tok, episodes, [None] * len(episodes), ids_BT, mask_BT)
        s_logp_BTV, _ = token_logprobs(tr.student, ids_BT, attn_BT, mask_BT)
    assert not torch.allclose(t_tok_BT[mask_BT.bool()], no_text_BT[mask_BT.bool()])  # the text reaches the teacher
    teacher0, student0 = snapshot(tr.teacher.named_parameters()), snapshot(tr.student.named_parameters())

    m = tr.step(0, tasks, trajs)
    assert same(teacher0, snapshot(tr.teacher.named_parameters()))
    assert not same(student0, snapshot(tr.student.named_parameters()))
    assert {"kl", "delta", "new_successes"} <= set(m) and "beta" not in m and m["kl"] > 0
    # The KL matches a recomputation on the pre-step student against the text teacher's top-M.
    from lopd.latent.teacher import teacher_logprobs, text_teacher_batch

    with torch.no_grad():
        t = teacher_logprobs(tr.teacher, text_teacher_batch(tok, episodes, texts), torch.zeros(len(episodes), 0, tr.teacher.config.hidden_size),
                             ids_BT, mask_BT, top_m=sharp_project.distill.top_m)
        kl = masked_mean(topm_kl_per_token(s_logp_BTV.gather(-1, t.topm_ids_BTM), t.topm_logp_BTM), mask_BT)
    # the same per-token terms summed in one process: float32 reordering of ≲ 10^3 terms stays below 1e-4 relative
    assert m["kl"] >= 1e-3 and m["kl"] == pytest.approx(kl.item(), rel=1e-4)
    assert torch.allclose(t.token_logp_BT, t_tok_BT)
    assert tr.bank_dir == layout.distill_bank_dir(sharp_project, "opsd") != layout.distill_bank_dir(sharp_project)


# ----------------------------------------------------------------------------- GRPO


def _group(tok, p):
    """One task, two rollouts: the expert's success (r = 1) and an immediate wrong answer (r = 0)."""
    task = split_tasks(p, "train", 1)[0]
    env = ToolWorldEnv(task)
    good = run_episode(env, ScriptedExpert())
    msgs = env.initial_observation()
    eps = []
    for actions, obs, r in ((good["actions"], good["observations"][:-1], 1.0), (["I cannot help."], [], 0.0)):
        ids, mask = tokenize_episode(tok, msgs, actions, obs)
        plen = mask.index(1)
        eps.append(Trajectory("g", task.task_id, task.family, len(eps), ids, mask, [0.0] * len(ids), plen, actions, [], [], r, r == 1.0))
    return task, eps


def test_grpo_step_raises_the_better_rollout_and_clips(project):
    from lopd.policy.scoring import token_logprobs
    from lopd.train.episodes import student_batch
    from lopd.train.grpo import GRPOTrainer, grpo_update
    from lopd.train.updater import TorchAdam

    tok = tiny_tokenizer()
    task, trajs = _group(tok, project)
    episodes = to_episodes(project, [task], trajs)
    ids_BT, attn_BT, mask_BT = student_batch(episodes, tok.pad_token_id)

    def mean_logp(model):
        with torch.no_grad():
            _, lp = token_logprobs(model, ids_BT, attn_BT, mask_BT)
        return (lp * mask_BT).sum(1) / mask_BT.sum(1)

    model = tiny_model()
    before = mean_logp(model)
    opt = TorchAdam(model.parameters(), lr=1e-2, grad_clip=1.0)
    reward_NG = torch.tensor([[1.0, 0.0]])
    m = grpo_update(model, opt, episodes, reward_NG, clip_eps=0.2, updates=4, pad_id=tok.pad_token_id)
    after = mean_logp(model)
    assert after[0] > before[0] and after[1] < before[1]  # advantage +0.7 up, −0.7 down
    assert grpo_advantages(reward_NG).tolist()[0] == pytest.approx([0.7070, -0.7070], abs=1e-3)
    # First update: ratio ≡ 1 (π_old recomputed), so the loss is −mean over action tokens of A.
    adv = grpo_advantages(reward_NG)[0]
    n = mask_BT.sum(1).float()
    assert m["loss"] == pytest.approx(float(-(adv * n).sum() / n.sum()), abs=1e-5)
    assert 0 < m["clip_frac"] <= 1  # later updates move the ratio past 1 ± ε at lr 1e-2

    # Wired the same way in the trainer: equal rewards → zero advantages → a zero first loss.
    tr = GRPOTrainer(project, tiny_model(), tok)
    flat = [Trajectory(**{**t.__dict__, "reward": 0.0}) for t in trajs]
    assert tr.step(0, [task], flat)["loss"] == 0.0


# ----------------------------------------------------------------------------- the loop, budget, resume, export


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """All five methods, two steps each, through ``distill.run``."""
    import mlflow

    import lopd.memory.embed
    import lopd.ops.tracking

    mp = pytest.MonkeyPatch()
    mp.setattr(lopd.memory.embed, "make_embedder", lambda p, device=None: FakeEmbedder())
    mp.setattr(lopd.ops.tracking, "stage_run", lambda *a, **k: contextlib.nullcontext())
    for fn in ("log_metrics", "log_metric", "log_artifact", "log_text"):
        mp.setattr(mlflow, fn, lambda *a, **k: None)
    p = build_project(tmp_path_factory.mktemp("full"), "distill.methods=[lopd,opsd,grpo,sft,vanilla]")
    out = distill.run(p)
    mp.undo()
    return p, out


def test_every_method_spends_the_same_budget(full_run):
    p, out = full_run
    budget = rollout_budget(p)
    assert budget == p.distill.steps * p.distill.batch_tasks == out["budget"]
    for m in ("lopd", "opsd", "grpo", "sft"):
        assert out[m]["rollouts"] == budget == out["details"][m]["rollouts"]
        assert [pt["rollouts_cum"] for pt in out["details"][m]["curve"]] == [0, 4, 8]  # eval every step, same grid
    assert out["vanilla"]["rollouts"] == 0 and out["grpo_budget"] == budget
    assert {"beta_final", "delta_final"} <= set(out["lopd"]) and "beta_final" not in out["grpo"]
    assert "delta_final" in out["opsd"] and "beta_final" not in out["opsd"]
    curve = pd.read_csv(layout.distill_curve_path(p))
    assert list(curve["rollouts_cum"]) == [0, 4, 8] and {"lopd_dev_reward", "grpo_dev_reward", "vanilla_dev_reward"} <= set(curve)
    saved = json.loads(layout.metrics_path(p, "distill").read_text())
    assert saved["lopd"] == out["lopd"] and {"rollouts_to_grpo_final_frac", "wall_to_grpo_final_ratio", "grpo_final_reached"} <= set(saved)
    assert len(saved["details"]["lopd"]["history"]) == p.distill.steps and {"beta", "delta", "kl", "margin_violation"} <= set(saved["details"]["lopd"]["history"][0])


def test_decision_probe_lands_in_history_and_curve_in_0_1(full_run):
    """distill.decision_tasks (on by default): P(right) of the student at every dev evaluation, the fixed
    teachers' beside it, and each method's loss share per step, for every decision kind, all in [0, 1]."""
    p, _ = full_run
    details = json.loads(layout.metrics_path(p, "distill").read_text())["details"]
    kinds = ("format", "check", "commit")
    for m in ("lopd", "opsd", "grpo", "sft"):
        for pt in details[m]["curve"]:
            for k in kinds:
                for role in ("student", "teacher_text", "teacher_latent"):
                    assert 0.0 <= pt[f"decision/{k}/{role}"] <= 1.0, (m, k, role)
        assert len({pt["decision/format/teacher_latent"] for pt in details[m]["curve"]}) == 1  # the teachers are fixed
        shares = [h.get(f"decision/{k}/loss_share") for h in details[m]["history"] for k in kinds]
        assert len(shares) == 3 * p.distill.steps and all(v is None or 0.0 <= v <= 1.0 for v in shares), (m, shares)
    assert details["lopd"]["curve"][0]["decision/check/teacher_text"] == details["grpo"]["curve"][0]["decision/check/teacher_text"]
    assert all(v is not None for h in details["lopd"]["history"] for v in (h[f"decision/{k}/loss_share"] for k in kinds))



def test_decisions_plot_draws_from_one_or_several_seeds_and_skips_runs_without_decisions(full_run, tmp_path):
    p, _ = full_run
    details = json.loads(layout.metrics_path(p, "distill").read_text())["details"]
    for seeds in ({0: details}, {0: details, 1: details}):
        path = distill.plot_decisions(seeds, tmp_path / f"{len(seeds)}" / "decisions.png")
        assert path.read_bytes()[:4] == b"\x89PNG"
    bare = {m: {**r, "curve": [{k: v for k, v in pt.items() if not k.startswith("decision/")} for pt in r["curve"]]} for m, r in details.items()}
    assert distill.plot_decisions({0: bare}, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_grpo_covers_fewer_tasks_with_groups(project):
    from lopd.train.grpo import GRPOTrainer

    tr = GRPOTrainer(project, tiny_model(), tiny_tokenizer())
    assert tr.tasks_per_step * tr.samples_per_task == project.distill.batch_tasks == lopd_trainer(project).tasks_per_step
    train = split_tasks(project, "train")
    assert step_tasks(project, train, 3, tr.tasks_per_step) == step_tasks(project, train, 3, 4)[: tr.tasks_per_step]


def test_exported_student_is_a_plain_checkpoint_of_the_base_architecture(full_run):
    from transformers import AutoModelForCausalLM

    p, _ = full_run
    base = AutoModelForCausalLM.from_pretrained(layout.base_model_dir(p))
    for method in ("lopd", "grpo", "sft"):
        path = layout.student_dir(p, method)
        student = AutoModelForCausalLM.from_pretrained(path)
        assert type(student) is type(base) and student.config.to_diff_dict() == base.config.to_diff_dict()
        assert sum(t.numel() for t in student.parameters()) == sum(t.numel() for t in base.parameters())
        assert not any("lora" in n for n, _ in student.named_parameters())
    assert layout.student_dir(p, "lopd") == p.root() / "models" / "student"
    lopd_sd, base_sd = (AutoModelForCausalLM.from_pretrained(x).state_dict() for x in (layout.student_dir(p, "lopd"), layout.base_model_dir(p)))
    assert any(not torch.equal(lopd_sd[k], base_sd[k]) for k in base_sd)  # it was trained


class ExpertForSolvable:
    """A generation backend that plays the scripted expert on every train task it solves within
    ``env.max_turns`` (so the student has successes, and rounds grow the bank) and lets the
    model sample everywhere else."""

    def __init__(self, real, tok, p):
        from lopd.policy.chat import encode, render_prompt
        from tests.helpers import ReplayBackend

        episodes = {}
        for task in split_tasks(p, "train"):
            env = ToolWorldEnv(task, max_turns=p.env.max_turns, success_threshold=p.env.success_threshold)
            prompt = tuple(encode(tok, render_prompt(tok, env.initial_observation())))
            ep = run_episode(env, ScriptedExpert())
            if ep["success"]:
                episodes[prompt] = ep["actions"]
        self.real, self.replay = real, ReplayBackend(tok, episodes)

    def reset(self):
        self.real.reset()

    def generate(self, prompts, max_new_tokens, rngs=None):
        known = [any(tuple(pr[: len(k)]) == k for k in self.replay.episodes) for pr in prompts]
        if rngs:  # rollout.rng: trajectory: the expert plays half the trajectories (by seed), so GRPO groups mix rewards
            known = [k and g.initial_seed() % 2 == 0 for k, g in zip(known, rngs)]
        experts = iter(self.replay.generate([pr for pr, k in zip(prompts, known) if k], max_new_tokens))
        rest = [pr for pr, k in zip(prompts, known) if not k]
        sampled = iter(self.real.generate(rest, max_new_tokens, [g for g, k in zip(rngs, known) if not k] if rngs else None) if rest else [])
        return [next(experts) if k else next(sampled) for k in known]


def test_resume_reproduces_an_uninterrupted_run_exactly(tmp_path, monkeypatch):
    """6 steps in 3 rounds straight vs killed after step 5 (last checkpoint at step 3) and resumed.

    The checkpoint falls mid-round (it holds the round's pending successes), and the killed run
    had appended round 2's file after it: the resume drops that file and writes it again. Same
    weights, φ, β, curve and bank.
    """
    from safetensors.torch import load_file

    import lopd.policy.engine

    real = lopd.policy.engine.make_backend
    monkeypatch.setattr(lopd.policy.engine, "make_backend", lambda kind, model, tok, t, top_p: ExpertForSolvable(real(kind, model, tok, t, top_p), tok, p))
    extra = ("distill.steps=6", "distill.checkpoint_every=3", "distill.eval_every=2", "distill.rounds=3", "distill.methods=[lopd]",
             "env.max_turns=4")  # the expert solves the tasks of three apps in four within 4 turns
    results = {}
    for name in ("straight", "resumed"):
        p = build_project(tmp_path / name, *extra)
        if name == "resumed":
            assert distill.run(p, stop_after=5) == {"stopped_after": 5, "method": "lopd"}
            meta = json.loads((layout.checkpoint_dir(p, "lopd") / "meta.json").read_text())
            assert meta["step"] == 3 and not layout.student_dir(p, "lopd").exists()
            assert max(round_numbers(layout.distill_bank_dir(p))) > meta["bank_version"]  # written after the checkpoint
            out = distill.run(p, resume=True)
        else:
            out = distill.run(p)
        ckpt = layout.checkpoint_dir(p, "lopd")
        bank = read_bank(layout.distill_bank_dir(p))
        results[name] = (load_file(layout.student_dir(p, "lopd") / "model.safetensors"),
                         load_file(ckpt / "composer" / "resampler.safetensors"),
                         load_file(ckpt / "composer" / "encoder" / "adapter_model.safetensors"), out, bank)
    (s1, r1, a1, o1, b1), (s2, r2, a2, o2, b2) = results["straight"], results["resumed"]
    assert len(b1) > len(read_bank(layout.bank_dir(p))) and b1["source_round"].max() >= 3  # rounds did grow the bank
    pd.testing.assert_frame_equal(b1, b2)
    assert same(s1, s2) and same(r1, r2) and same(a1, a2)
    assert o1["lopd"]["beta_final"] == o2["lopd"]["beta_final"] and o1["lopd"]["delta_final"] == o2["lopd"]["delta_final"]
    strip = lambda c: [{k: v for k, v in pt.items() if k != "train_wall_s"} for pt in c]  # noqa: E731
    assert strip(o1["details"]["lopd"]["curve"]) == strip(o2["details"]["lopd"]["curve"])
    assert o1["lopd"]["rollouts"] == o2["lopd"]["rollouts"] == 24


def test_resume_refuses_a_checkpoint_from_other_params(tmp_path):
    p = build_project(tmp_path, "distill.methods=[grpo]")
    distill.run(p, stop_after=1)
    other = with_params(p, "distill.methods=[grpo]", "grpo.lr=0.5")
    with pytest.raises(ParamsError, match="checkpoint at .* other params"):
        distill.run(other, resume=True)


@pytest.mark.parametrize("override, message", [
    ("grpo.group_size=3", r"distill.batch_tasks = 4 must be a multiple of grpo.group_size = 3"),
    ("distill.rounds=5", r"distill.rounds = 5 exceeds distill.steps = 2"),
])
def test_bad_distill_params_fail_before_any_compute(tmp_path, override, message):
    p = load_params(REPO / "params.yaml", "smoke", [f"paths.root={tmp_path}", *OVERRIDES, override])
    with pytest.raises(ParamsError, match=message):
        distill.run(p)
    assert not any(tmp_path.iterdir())


def test_missing_composer_is_a_clear_error(tmp_path):
    p = load_params(REPO / "params.yaml", "smoke", [f"paths.root={tmp_path}", *OVERRIDES])
    tiny_model().save_pretrained(layout.base_model_dir(p))
    with pytest.raises(FileNotFoundError, match="cold-start composer .* run `lopd cold-start`"):
        distill.run(p, methods=["lopd"])


def test_efficiency_counts_generations_lopd_needs_to_reach_grpo_final_success():
    def curve(*pts):
        return [{"rollouts_cum": r, "dev_success": v, "train_wall_s": r / 10} for r, v in pts]

    grpo = {"rollouts": 16, "final_dev_success": 0.3, "train_wall_s": 0.8, "curve": curve((0, 0.1), (8, 0.3), (16, 0.3))}
    lopd = {"rollouts": 16, "final_dev_success": 0.5, "train_wall_s": 3.2, "curve": curve((0, 0.1), (4, 0.25), (8, 0.3), (16, 0.5))}
    e = distill.efficiency({"lopd": lopd, "grpo": grpo})
    assert (e["grpo_budget"], e["rollouts_to_grpo_final"], e["rollouts_to_grpo_final_frac"]) == (16, 8, 0.5)
    assert e["wall_to_grpo_final_ratio"] == pytest.approx(0.8 / 0.8) and e["grpo_final_reached"] is True
    # never reached: flagged, the fraction counts as 1.0, the wall ratio is LOPD's whole time over GRPO's
    never = distill.efficiency({"lopd": {**lopd, "curve": curve((0, 0.1), (16, 0.2))}, "grpo": grpo})
    assert never["grpo_final_reached"] is False and never["rollouts_to_grpo_final"] is None
    assert never["rollouts_to_grpo_final_frac"] == 1.0 and never["wall_to_grpo_final_ratio"] == pytest.approx(4.0)
    assert distill.efficiency({"lopd": lopd})["grpo_budget"] is None


def test_methods_run_one_at_a_time_end_up_in_one_comparison(tmp_path):
    p = build_project(tmp_path)
    distill.run(p, methods=["grpo"])
    out = distill.run(p, methods=["lopd"])
    assert set(out["details"]) == {"grpo", "lopd"} and out["grpo_budget"] == rollout_budget(p)
    assert set(pd.read_csv(layout.distill_curve_path(p)).columns) >= {"lopd_dev_reward", "grpo_dev_reward"}
    other = with_params(p, "distill.margin=0.1")  # other numbers: earlier results are not comparable
    assert set(distill.run(other, methods=["vanilla"])["details"]) == {"vanilla"}


def test_workers_train_methods_in_processes_of_their_own_with_the_same_numbers(tmp_path):
    """distill.workers=2: grpo and sft in two spawned one-thread processes give exactly the numbers
    of the same methods trained in turn in this process on one thread (and MLflow runs of their own)."""
    p = build_project(tmp_path / "turn", "distill.decision_tasks=0")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        in_turn = distill.run(p, methods=["grpo", "sft"])
    finally:
        torch.set_num_threads(threads)
    q = build_project(tmp_path / "workers", "distill.workers=2", "distill.decision_tasks=0", "tracking.tracking_uri=sqlite:///" + str(tmp_path / "mlflow.db"))
    # the workers are fresh processes: this module's fakes (embedder, no MLflow) do not reach them,
    # and grpo and sft read neither the embedder nor the index (the decision probe's teachers would)
    out = distill.run(q, methods=["grpo", "sft"])
    for m in ("grpo", "sft"):
        a, b = in_turn["details"][m], out["details"][m]
        assert [pt["dev_success"] for pt in a["curve"]] == [pt["dev_success"] for pt in b["curve"]], m
        assert [h["loss"] for h in a["history"]] == [h["loss"] for h in b["history"]], m
        assert b["run_id"], m  # trained under an MLflow run of its own, in the worker
    assert set(json.loads(layout.metrics_path(q, "distill").read_text())["details"]) == {"grpo", "sft"}
