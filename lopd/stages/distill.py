"""Stage `distill` (spec step 6): iterative LOPD, and the GRPO / SFT / vanilla baselines at the same budget.

Every method runs in the same loop (:func:`train_method`): per step, ``distill.batch_tasks``
generations by the method's own student on train tasks (``lopd.train.onpolicy`` documents the budget
accounting), the method's update, MLflow metrics, a dev evaluation every ``distill.eval_every``
steps (dev only: the test split is for ``lopd evaluate``), a checkpoint every
``distill.checkpoint_every`` steps. One LOPD step (:class:`LOPDTrainer`), as the public code:

1. **teacher scoring** (no grad): retrieve ``n_ret`` bank entries per task, compose latents, and
   score the student's trajectory under the frozen base with the latents in its prompt: top-M
   ids + log-probs at every action token, and log π_T at the sampled tokens;
2. **student update**: the reverse KL on top-M + tail, teacher detached (spec: student objective);
3. **composer update**: L_φ = KL + β·(m − Δ(φ)) + λ·‖c_φ − c_φ₀‖², student detached (skipped
   when ``composer.frozen``);
4. **dual ascent**: β ← max(0, β + η_β·(m − Δ)) with the Δ of phase 1.

The student is a separate trainable copy of the base; the teacher is the base inside the
composer's backbone (LoRA off), never updated. Rounds (``distill.rounds``): at the end of each
round the round's successful student trajectories join LOPD's bank (``data/distill/bank``, a
copy of ``data/bank`` that distill owns, so the collect stage's output is never touched) as a
new round file, and the retrieval index over it is rebuilt (``data/distill/index``).

Outputs: ``models/student`` (LOPD's student, a plain HF checkpoint of the base architecture),
``models/students/<method>`` for the baselines, ``metrics/distill.json`` and
``metrics/distill_curve.csv``; checkpoints in ``models/checkpoints/distill/<method>``.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from lopd import layout
from lopd.config import Params, ParamsError
from lopd.io import atomic_path, read_json, write_json
from lopd.latent.teacher import teacher_logprobs, text_teacher_batch
from lopd.memory.bank import round_numbers
from lopd.policy.engine import train_tasks_by_id
from lopd.policy.scoring import token_logprobs
from lopd.train.episodes import Timer, student_batch, teacher_batch, to_episodes
from lopd.train.losses import composer_lagrangian, dual_update, latent_anchor, masked_mean, privilege, topm_kl_per_token, trajectory_margin
from lopd.train.onpolicy import (
    check_methods,
    derive_seed,
    ends_round,
    make_adam,
    optimizer_step,
    rollout_budget,
    round_of,
    step_tasks,
)

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
# The per-step numbers kept in metrics/distill.json (details.<method>.history).
HISTORY_KEYS = ("step", "rollouts_cum", "train_wall_s", "reward_mean", "success_rate", "kl", "delta", "margin_violation",
                "beta", "anchor", "student_grad_norm", "composer_grad_norm", "new_successes", "loss")
HEADLINE = ("rollouts", "final_dev_reward", "final_dev_success", "final_dev_success_pretrain", "final_dev_success_new",
            "beta_final", "delta_final")


# ----------------------------------------------------------------------------- comparability


def comparable_hash(p: Params) -> str:
    """Hash of every param that changes the numbers (not which methods run, resume, cadence of checkpoints, tracking, paths, schedule)."""
    import hashlib

    d = p.model_dump()
    for key in ("profile", "tracking", "paths", "schedule"):
        d.pop(key)
    for key in ("methods", "resume", "checkpoint_every"):
        d["distill"].pop(key)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- retrieval over the growing bank


def refresh_retriever(p: Params, bank_dir: Path, index_dir: Path, embedder):
    """Re-embed (cached by content) and re-index the bank at ``bank_dir``; write the index to ``index_dir``.

    A light version of the ``index`` stage: no MLflow run, no dev metrics.
    """
    import faiss

    from lopd.memory import index as faiss_index
    from lopd.memory.bank import read_bank
    from lopd.memory.embed import embed_texts
    from lopd.memory.retrieval import Retriever, entry_texts, held_out_task_ids, scope_of, write_index_dir

    r = p.retrieval
    bank = read_bank(bank_dir)
    vecs, _ = embed_texts(embedder, entry_texts(bank, r.embed_text), layout.embed_cache_dir(p), r.batch_size)
    index = faiss_index.from_params(vecs, r, seed=p.seed)
    manifest = {"embedder": embedder.name, "embedder_fingerprint": embedder.fingerprint, "dim": embedder.dim,
                "embed_text": r.embed_text, "index": r.index, "n_entries": len(bank), "faiss_version": faiss.__version__,
                "seed": p.seed, "source": str(bank_dir)}
    write_index_dir(index_dir, index, vecs, bank, manifest)
    return Retriever(index, bank, embedder, held_out_task_ids(p), r.n_ret, scope=scope_of(p))


# ----------------------------------------------------------------------------- LOPD and its text-privilege baseline


class BankDistiller:
    """What LOPD and its text-privilege baseline share: a trainable student, retrieval of ``n_ret``
    experiences per task, and a bank of their own that grows by the student's successes each round.

    Subclasses set ``name`` and implement ``step``; one student rollout per task.
    """

    name = ""
    samples_per_task = 1

    def __init__(self, p: Params, student, tokenizer, retriever, tasks_by_id: dict, bank_dir: Path | None, lr: float):
        self.p, self.student, self.tokenizer = p, student, tokenizer
        self.retriever, self.tasks_by_id, self.bank_dir = retriever, tasks_by_id, bank_dir
        self.tasks_per_step = p.distill.batch_tasks
        self.opt_student = make_adam(student.parameters(), lr)
        self.pending: list[dict] = []  # this round's successes (bank rows), appended at the round's end
        self.bank_version = max(round_numbers(bank_dir)) if bank_dir is not None and bank_dir.is_dir() else 0
        self.added_rounds: list[int] = []
        self.timer = Timer()

    def experiences(self, tasks: Sequence) -> list[list[str]]:
        """``n_ret`` retrieved observation-lite texts per task (never the task itself, never dev/test)."""
        n_ret = self.p.retrieval.n_ret
        hits = self.retriever.retrieve_batch(list(tasks), n_ret)
        short = [t.task_id for t, h in zip(tasks, hits) if len(h) < n_ret]
        if short:
            raise ValueError(f"retrieval found fewer than retrieval.n_ret = {n_ret} bank entries for {short[:3]}: "
                             "the bank is too small (collect more successes, or lower retrieval.n_ret)")
        return [[h["lite_text"] for h in row] for row in hits]

    def keep_successes(self, trajs: Sequence) -> float:
        """Successes wait for the end of the round to join the bank (spec: iterative bank); returns their count."""
        if self.bank_dir is not None:
            from lopd.memory.bank import bank_frame

            rows = bank_frame(list(trajs), self.tasks_by_id, f"distill-{self.name}", self.bank_version + 1)
            self.pending += rows.to_dict("records")
        return float(sum(tr.success for tr in trajs))

    def end_round(self, round_: int) -> None:
        """The round's successes become bank round file ``bank_version + 1``; the index is rebuilt over it."""
        from lopd.memory.bank import BANK_COLUMNS, append_round
        from lopd.memory.retrieval import held_out_task_ids

        rows, self.pending = pd.DataFrame(self.pending, columns=list(BANK_COLUMNS)), []
        if self.bank_dir is None or rows.empty:
            return
        added = append_round(self.bank_dir, rows, self.bank_version + 1, self.p.env.success_threshold,
                             forbidden_task_ids=held_out_task_ids(self.p))
        if len(added):
            self.bank_version += 1
            self.added_rounds.append(self.bank_version)
            self.retriever = refresh_retriever(self.p, self.bank_dir, layout.distill_index_dir(self.p, self.name), self.retriever.embedder)
            log.info("distill round %d: %d new successes joined the bank (round file %d)", round_, len(added), self.bank_version)

    # -- checkpointing

    def save(self, path: Path) -> None:
        self.student.save_pretrained(path / "student")
        self.tokenizer.save_pretrained(path / "student")

    def state_dict(self) -> dict:
        return {
            "opt_student": self.opt_student.state_dict(),
            "pending": self.pending,
            "bank_version": self.bank_version,
            "added_rounds": self.added_rounds,
        }

    def load_state_dict(self, state: dict, path: Path | None = None) -> None:
        """Restore from a checkpoint; round files written after it are dropped (they will be written again)."""
        self.opt_student.load_state_dict(state["opt_student"])
        self.pending = list(state["pending"])
        self.bank_version, self.added_rounds = int(state["bank_version"]), list(state["added_rounds"])
        if self.bank_dir is not None:
            for n in round_numbers(self.bank_dir):
                if n > self.bank_version:
                    (self.bank_dir / f"round-{n:03d}.parquet").unlink()
            if self.added_rounds:
                self.retriever = refresh_retriever(self.p, self.bank_dir, layout.distill_index_dir(self.p, self.name), self.retriever.embedder)


class LOPDTrainer(BankDistiller):
    """Student + composer + β; ``step`` consumes one batch of student rollouts (one per task)."""

    name = "lopd"

    def __init__(self, p: Params, student, tokenizer, composer, anchor, retriever, tasks_by_id: dict, bank_dir: Path | None = None):
        super().__init__(p, student, tokenizer, retriever, tasks_by_id, bank_dir, p.distill.student_lr)
        self.composer, self.anchor = composer, anchor
        self.phi = composer.trainable_parameters()
        self.opt_composer = None if p.composer.frozen else make_adam(self.phi, p.distill.composer_lr)
        self.beta = p.distill.beta0

    @property
    def n_latents(self) -> int:
        return self.p.retrieval.n_ret * self.p.composer.num_latents

    def step(self, step: int, tasks: Sequence, trajs: Sequence) -> dict[str, float]:
        p, d = self.p, self.p.distill
        device = next(self.student.parameters()).device
        episodes = to_episodes(p, tasks, trajs)
        texts = [e.task.text for e in episodes]
        with self.timer("retrieval"):
            exps = self.experiences([e.task for e in episodes])
        ids_BT, attn_BT, mask_BT = (t.to(device) for t in student_batch(episodes, self.tokenizer.pad_token_id))
        reward_B = torch.tensor([e.reward for e in episodes], dtype=torch.float32, device=device)
        tb = teacher_batch(self.tokenizer, episodes, self.n_latents, p.composer.placeholder).to(device)

        # The student's forward, kept for its update; detached, it is sg[log π_S] in δ and the
        # student side of the composer's KL (all three phases see the student that sampled the batch).
        with self.timer("student_update"):
            self.student.train()
            s_logp_BTV, s_tok_BT = token_logprobs(self.student, ids_BT, attn_BT, mask_BT)

        # 1. Teacher scoring, no grad: top-M support + log π_T at the sampled tokens. Without
        # LoRA dropout the composer's forward is the same in both phases: it runs once, with grad,
        # and phase 1 reads it detached (the encoder is most of a step's cost).
        reuse = self.opt_composer is not None and p.composer.lora_dropout == 0.0
        with self.timer("teacher_scoring"):
            latents_phi_BLD = self.composer(texts, exps) if reuse else None
            with torch.no_grad():
                student_ids = s_logp_BTV.detach().topk(d.top_m, dim=-1).indices if d.kl_support == "student" else None
                latents_BLD = latents_phi_BLD.detach() if reuse else self.composer(texts, exps)
                t = teacher_logprobs(self.composer.backbone, tb, latents_BLD, ids_BT, mask_BT, top_m=d.top_m, ids_BTM=student_ids)
            ids_BTM = t.topm_ids_BTM
            delta = float(trajectory_margin(privilege(t.token_logp_BT, s_tok_BT, mask_BT), reward_B, mask_BT))

        # 2. Student update: reverse KL(π_S ‖ π_T) on top-M + tail, per action token (spec: student objective).
        with self.timer("student_update"):
            kl = masked_mean(topm_kl_per_token(s_logp_BTV.gather(-1, ids_BTM), t.topm_logp_BTM), mask_BT)
            student_norm = optimizer_step(self.opt_student, kl, list(self.student.parameters()), d.grad_clip)
            self.student.eval()

        # 3. Composer update on the Lagrangian, same support ids, student detached (spec: composer objective).
        out = {"kl": kl.item(), "delta": delta, "margin_violation": d.margin - delta, "student_grad_norm": student_norm}
        if self.opt_composer is not None:
            with self.timer("composer_update"):
                anchor_BLD = self.anchor.latents(texts, exps)  # c_φ₀ on the same inputs (eval mode: no dropout)
                self.composer.train()  # encoder LoRA dropout, if composer.lora_dropout > 0
                latents_BLD = latents_phi_BLD if reuse else self.composer(texts, exps)
                t_phi = teacher_logprobs(self.composer.backbone, tb, latents_BLD, ids_BT, mask_BT, ids_BTM=ids_BTM)
                kl_phi = masked_mean(topm_kl_per_token(s_logp_BTV.detach().gather(-1, ids_BTM), t_phi.topm_logp_BTM), mask_BT)
                delta_phi = trajectory_margin(privilege(t_phi.token_logp_BT, s_tok_BT, mask_BT), reward_B, mask_BT)
                anchor = latent_anchor(latents_BLD, anchor_BLD)
                loss_phi = composer_lagrangian(kl_phi, delta_phi, self.beta, d.margin, anchor, d.anchor_lambda)
                out.update(anchor=anchor.item(), composer_loss=loss_phi.item(),
                           composer_grad_norm=optimizer_step(self.opt_composer, loss_phi, self.phi, d.grad_clip))
                self.composer.eval()
        else:
            out.update(anchor=0.0)  # φ = φ₀ by construction

        # 4. Dual ascent on β with this step's Δ.
        self.beta = dual_update(self.beta, d.margin, delta, d.eta_beta)
        out["beta"] = self.beta

        out["new_successes"] = self.keep_successes(trajs)
        return out

    # -- checkpointing

    def save(self, path: Path) -> None:
        super().save(path)
        if self.opt_composer is not None:
            self.composer.save(path / "composer")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "beta": self.beta,
                "opt_composer": self.opt_composer.state_dict() if self.opt_composer is not None else None}

    def load_state_dict(self, state: dict, path: Path | None = None) -> None:
        if self.opt_composer is not None:
            if path is not None:
                self.composer.load_weights(path / "composer")
            self.opt_composer.load_state_dict(state["opt_composer"])
        self.beta = float(state["beta"])
        super().load_state_dict(state, path)


class OPSDTrainer(BankDistiller):
    """The text-privilege baseline (OPSD / SDPO / Skill-SD family): LOPD with the experiences as text.

    Everything is LOPD's (retrieval of ``n_ret`` experiences, the growing bank, the student's
    reverse KL on the teacher's top-M + tail, the student rate ``distill.opsd_lr``) except the
    teacher: the frozen base with the retrieved observation-lite experiences written *as text*
    into the same framing sentence, as the ``privilege`` stage's ``retrieved_text``. No composer,
    no margin, no β; Δ is still computed (on the text teacher) so the curves compare.
    """

    name = "opsd"

    def __init__(self, p: Params, student, tokenizer, teacher, retriever, tasks_by_id: dict, bank_dir: Path | None = None):
        super().__init__(p, student, tokenizer, retriever, tasks_by_id, bank_dir, p.distill.opsd_lr)
        self.teacher = teacher  # the frozen base

    def step(self, step: int, tasks: Sequence, trajs: Sequence) -> dict[str, float]:
        p, d = self.p, self.p.distill
        device = next(self.student.parameters()).device
        episodes = to_episodes(p, tasks, trajs)
        with self.timer("retrieval"):
            texts = ["\n\n".join(exp) for exp in self.experiences([e.task for e in episodes])]
        ids_BT, attn_BT, mask_BT = (t.to(device) for t in student_batch(episodes, self.tokenizer.pad_token_id))
        reward_B = torch.tensor([e.reward for e in episodes], dtype=torch.float32, device=device)

        with self.timer("student_update"):
            self.student.train()
            s_logp_BTV, s_tok_BT = token_logprobs(self.student, ids_BT, attn_BT, mask_BT)
        # 1. Teacher scoring, no grad: the base with the experiences as text in its framing.
        with self.timer("teacher_scoring"), torch.no_grad():
            tb = text_teacher_batch(self.tokenizer, episodes, texts).to(device)
            student_ids = s_logp_BTV.detach().topk(d.top_m, dim=-1).indices if d.kl_support == "student" else None
            no_latents = torch.zeros(len(episodes), 0, self.teacher.config.hidden_size, device=device)
            t = teacher_logprobs(self.teacher, tb, no_latents, ids_BT, mask_BT, top_m=d.top_m, ids_BTM=student_ids)
            delta = float(trajectory_margin(privilege(t.token_logp_BT, s_tok_BT, mask_BT), reward_B, mask_BT))
        # 2. Student update: the same reverse KL(π_S ‖ π_T) on top-M + tail as LOPD's.
        with self.timer("student_update"):
            kl = masked_mean(topm_kl_per_token(s_logp_BTV.gather(-1, t.topm_ids_BTM), t.topm_logp_BTM), mask_BT)
            norm = optimizer_step(self.opt_student, kl, list(self.student.parameters()), d.grad_clip)
            self.student.eval()
        return {"kl": kl.item(), "delta": delta, "student_grad_norm": norm, "new_successes": self.keep_successes(trajs)}


# ----------------------------------------------------------------------------- building a method's trainer


def make_trainer(p: Params, method: str, student, tokenizer, *, fresh_bank: bool = True, rounds: bool = True):
    """The trainer of ``method`` ('lopd', 'opsd', 'grpo', 'sft') around a trainable ``student``.

    LOPD loads a second copy of the base as the composer's backbone (the frozen teacher), the
    cold-start composer φ₀ (``models/composer``) and its anchor, and the retriever; with
    ``fresh_bank`` its bank starts over as a copy of ``data/bank``. ``rounds=False`` gives it no
    bank of its own (successes are not kept; for benchmarks and probes that must not write).
    """
    from lopd.memory.bank import read_bank

    tasks_by_id = train_tasks_by_id(p)
    if method == "grpo":
        from lopd.train.grpo import GRPOTrainer

        return GRPOTrainer(p, student, tokenizer)
    if method == "sft":
        from lopd.train.episodes import bank_episodes
        from lopd.train.sft import SFTTrainer

        return SFTTrainer(p, student, tokenizer, bank_episodes(p, tokenizer, read_bank(layout.bank_dir(p)), tasks_by_id), tasks_by_id)
    if method not in ("lopd", "opsd"):
        raise ParamsError(f"params: distill method {method!r} has no trainer (allowed: lopd, opsd, grpo, sft)")

    from lopd.latent.composer import Composer, ComposerAnchor
    from lopd.memory.retrieval import open_retriever
    from lopd.policy.modeling import load_policy

    backbone, _ = load_policy(layout.policy_path(p), p.model.dtype)  # the frozen teacher's weights
    bank_dir = layout.distill_bank_dir(p, method) if rounds else None
    if bank_dir is not None and (fresh_bank or not bank_dir.is_dir()):
        with atomic_path(bank_dir) as tmp:
            shutil.copytree(layout.bank_dir(p), tmp)
        shutil.rmtree(layout.distill_index_dir(p, method), ignore_errors=True)  # an index of an earlier run's bank
    if method == "opsd":
        backbone.eval().requires_grad_(False)
        return OPSDTrainer(p, student, tokenizer, backbone, open_retriever(p), tasks_by_id, bank_dir)
    composer = Composer.load(backbone, tokenizer, layout.composer_dir(p)).eval()
    anchor = None if p.composer.frozen else ComposerAnchor.from_dir(composer, layout.composer_dir(p))
    return LOPDTrainer(p, student, tokenizer, composer, anchor, open_retriever(p), tasks_by_id, bank_dir)


# ----------------------------------------------------------------------------- the loop


@dataclass
class LoopState:
    step: int = 0  # steps done
    rollouts_used: int = 0  # training generations charged to the budget
    eval_rollouts: int = 0  # dev generations (measurement, not budget)
    train_wall_s: float = 0.0  # rollout + update time, without dev evaluation and checkpoints
    history: list[dict] = field(default_factory=list)  # per-step metrics
    curve: list[dict] = field(default_factory=list)  # dev evaluations


def dev_eval(p: Params, engine, dev_tasks: Sequence) -> dict[str, float]:
    """Mean reward and success of one sample per dev task; the same seed every time (common random numbers)."""
    from lopd.policy.engine import success_by_group

    trajs = engine.run(dev_tasks, 1, seed=derive_seed(p.seed, "dev"), id_prefix="dev", progress=False)
    groups = success_by_group(p, dev_tasks, trajs)
    return {"dev_reward": sum(t.reward for t in trajs) / len(trajs), "dev_success": sum(t.success for t in trajs) / len(trajs),
            "dev_success_pretrain": groups["pretrain"], "dev_success_new": groups["new"]}


def export_student(student, tokenizer, path: Path) -> None:
    """A plain HF checkpoint (``save_pretrained``): loads with ``AutoModelForCausalLM``, no composer or bank needed."""
    with atomic_path(path) as tmp:
        student.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def _save_checkpoint(p: Params, method: str, trainer, state: LoopState) -> None:
    with atomic_path(layout.checkpoint_dir(p, method)) as tmp:
        tmp.mkdir()
        trainer.save(tmp)
        torch.save({
            "loop": asdict(state),
            "trainer": trainer.state_dict(),
            "rng_python": random.getstate(),
            "rng_torch": torch.get_rng_state(),
            "params_hash": comparable_hash(p),
        }, tmp / STATE_FILE)
        meta = {"method": method, "step": state.step, "rollouts_used": state.rollouts_used, "params_hash": comparable_hash(p)}
        if isinstance(trainer, BankDistiller):
            meta["bank_version"] = trainer.bank_version
        if isinstance(trainer, LOPDTrainer):
            meta["beta"] = trainer.beta
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def _load_checkpoint(p: Params, method: str) -> dict | None:
    path = layout.checkpoint_dir(p, method)
    if not (path / STATE_FILE).exists():
        return None
    ckpt = torch.load(path / STATE_FILE, weights_only=False)  # our own file; holds python RNG state and rows
    if ckpt["params_hash"] != comparable_hash(p):
        raise ParamsError(
            f"params: distill.resume = true but the checkpoint at {path} was written with other params "
            f"(hash {ckpt['params_hash']} != {comparable_hash(p)}): restore those params, or set distill.resume=false to start over"
        )
    return ckpt


def _log_metrics(metrics: dict, step: int) -> None:
    import mlflow

    mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v}, step=step)


def train_method(p: Params, method: str, *, resume: bool = False, stop_after: int | None = None) -> dict | None:
    """Train one method at the budget; returns its summary (``None`` when ``stop_after`` cut it short).

    ``stop_after`` (a testing hook) returns after that many steps without exporting, as if the
    process were killed there; ``resume`` continues from the last checkpoint.
    """
    from lopd.policy.engine import make_engine, split_tasks
    from lopd.policy.modeling import load_policy
    from lopd.policy.rollout import RolloutBudget

    d = p.distill
    ckpt = _load_checkpoint(p, method) if resume and method != "vanilla" else None
    if resume and ckpt is None and method != "vanilla":
        log.info("distill %s: no checkpoint at %s, starting from step 0", method, layout.checkpoint_dir(p, method))
    if ckpt is None:  # starting over: an earlier run's checkpoint must never be resumed into this one
        shutil.rmtree(layout.checkpoint_dir(p, method), ignore_errors=True)
    src = layout.checkpoint_dir(p, method) / "student" if ckpt else layout.policy_path(p)
    student, tokenizer = load_policy(src, p.model.dtype)
    engine = make_engine(p, student, tokenizer)
    dev_tasks = split_tasks(p, "dev", d.eval_dev_tasks)
    state = LoopState()

    if method == "vanilla":  # the base as is: one dev evaluation, no generation spent
        state.curve.append({"step": 0, "rollouts_cum": 0, "train_wall_s": 0.0, **dev_eval(p, engine, dev_tasks)})
        state.eval_rollouts = len(dev_tasks)
        _log_metrics({k: v for k, v in state.curve[0].items() if k.startswith("dev_")}, 0)
        return _summary(p, method, state, None)

    trainer = make_trainer(p, method, student, tokenizer, fresh_bank=ckpt is None)
    if ckpt:
        trainer.load_state_dict(ckpt["trainer"], **({"path": layout.checkpoint_dir(p, method)} if method == "lopd" else {}))
        state = LoopState(**ckpt["loop"])
        random.setstate(ckpt["rng_python"])
        torch.set_rng_state(ckpt["rng_torch"])
        log.info("distill %s: resumed at step %d (%d generations used)", method, state.step, state.rollouts_used)
    budget = RolloutBudget(rollout_budget(p))
    budget.used = state.rollouts_used
    train_tasks = split_tasks(p, "train")

    def evaluate_dev() -> None:
        point = {"step": state.step, "rollouts_cum": budget.used, "train_wall_s": state.train_wall_s, **dev_eval(p, engine, dev_tasks)}
        state.curve.append(point)
        state.eval_rollouts += len(dev_tasks)
        # x = generations spent: the efficiency axis of the spec (dev reward vs cumulative rollouts).
        _log_metrics({k: v for k, v in point.items() if k.startswith("dev_") and v is not None}, budget.used)

    if state.step == 0 and not state.curve:
        evaluate_dev()  # the starting point of the curve (0 generations)
    bar = tqdm(range(state.step, d.steps), desc=f"distill {method}", unit="step", initial=state.step, total=d.steps, leave=False)
    for step in bar:
        t0 = time.perf_counter()
        tasks = step_tasks(p, train_tasks, step, trainer.tasks_per_step)
        with trainer.timer("rollout"):
            trajs = engine.run(tasks, trainer.samples_per_task, seed=derive_seed(p.seed, method, "rollout", step),
                               budget=budget, id_prefix=f"{method}-s{step}", progress=False)
        metrics = trainer.step(step, tasks, trajs)
        metrics.update(
            reward_mean=sum(t.reward for t in trajs) / len(trajs),
            success_rate=sum(t.success for t in trajs) / len(trajs),
            rollouts_cum=budget.used,
            n_rollouts=len(trajs),
            tokens_per_s=engine.stats.gen_tokens_per_s,
        )
        if ends_round(p, step):
            trainer.end_round(round_of(p, step))
        trainer.timer.steps += 1
        state.train_wall_s += time.perf_counter() - t0
        state.step, state.rollouts_used = step + 1, budget.used
        metrics.update(step_s=time.perf_counter() - t0, train_wall_s=state.train_wall_s)
        state.history.append({"step": step, **metrics})
        _log_metrics(metrics, step)
        bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", **({"beta": f"{metrics['beta']:.3f}"} if "beta" in metrics else {}))
        if state.step % d.eval_every == 0 or state.step == d.steps:
            evaluate_dev()
        if state.step % d.checkpoint_every == 0 or state.step == d.steps:
            _save_checkpoint(p, method, trainer, state)
        if stop_after is not None and state.step >= stop_after and state.step < d.steps:
            return None
    bar.close()
    export_student(trainer.student, tokenizer, layout.student_dir(p, method))
    return _summary(p, method, state, trainer)


def _summary(p: Params, method: str, state: LoopState, trainer) -> dict:
    last = state.curve[-1]
    out = {
        "rollouts": state.rollouts_used,
        "eval_rollouts": state.eval_rollouts,
        "steps": state.step,
        "final_dev_reward": last["dev_reward"],
        "final_dev_success": last["dev_success"],
        "final_dev_success_pretrain": last.get("dev_success_pretrain"),
        "final_dev_success_new": last.get("dev_success_new"),
        "train_wall_s": state.train_wall_s,
        "curve": state.curve,
        "params_hash": comparable_hash(p),
    }
    if trainer is not None:
        out["step_ms"] = trainer.timer.per_step_ms()
    if method == "lopd" and state.history:
        out.update(beta_final=state.history[-1]["beta"], delta_final=state.history[-1]["delta"], kl_final=state.history[-1]["kl"])
    if method == "opsd" and state.history:
        out.update(delta_final=state.history[-1]["delta"], kl_final=state.history[-1]["kl"])
    # Per-step training record (β, Δ, KL, margin violation, rewards, wall-clock): the sweep's curves read it.
    out["history"] = [{k: (None if v != v else v) for k, v in h.items() if k in HISTORY_KEYS} for h in state.history]  # NaN → null (JSON)
    return out


# ----------------------------------------------------------------------------- summary, curve, plots


def first_reaching(curve: Sequence[dict], target: float, key: str = "dev_success") -> dict | None:
    """The first dev evaluation whose ``key`` is at least ``target`` (None if none is)."""
    return next((pt for pt in curve if pt[key] is not None and pt[key] >= target - 1e-12), None)


def efficiency(results: dict) -> dict:
    """How much of GRPO's budget LOPD needed to first reach GRPO's final dev success.

    ``rollouts_to_grpo_final_frac`` = LOPD's generations at that point / GRPO's budget;
    ``wall_to_grpo_final_ratio`` = LOPD's training seconds at that point / GRPO's training seconds
    for its whole budget (dev evaluations excluded on both sides). If LOPD never reaches it,
    ``grpo_final_reached`` is False, the fraction counts as 1.0 and the ratio as LOPD's whole
    training time over GRPO's (at least 1.0): a seed is flagged, never dropped. The resolution is
    one dev point, every ``distill.eval_every`` steps.
    """
    out = {"grpo_budget": None, "grpo_final_dev_success": None, "rollouts_to_grpo_final": None,
           "rollouts_to_grpo_final_frac": None, "wall_to_grpo_final_ratio": None, "grpo_final_reached": None}
    grpo, lopd = results.get("grpo"), results.get("lopd")
    if grpo is None or lopd is None:
        return out
    target = grpo["final_dev_success"]
    hit = first_reaching(lopd["curve"], target)
    grpo_wall = max(grpo["train_wall_s"], 1e-9)
    out.update(grpo_budget=grpo["rollouts"], grpo_final_dev_success=target, grpo_final_reached=hit is not None)
    if hit is not None:
        out.update(rollouts_to_grpo_final=hit["rollouts_cum"],
                   rollouts_to_grpo_final_frac=hit["rollouts_cum"] / max(1, grpo["rollouts"]),
                   wall_to_grpo_final_ratio=hit["train_wall_s"] / grpo_wall)
    else:
        out.update(rollouts_to_grpo_final_frac=1.0, wall_to_grpo_final_ratio=max(1.0, lopd["train_wall_s"] / grpo_wall))
    return out


def curve_frame(results: dict) -> pd.DataFrame:
    """Wide dev curve: one row per ``rollouts_cum`` (every method evaluates on the same grid), ``<method>_dev_reward`` columns.

    Vanilla (one evaluation at 0 generations) is a constant across the rows.
    """
    trained = {m: r for m, r in results.items() if m != "vanilla"}
    grid = sorted({pt["rollouts_cum"] for r in trained.values() for pt in r["curve"]} or {0})
    df = pd.DataFrame({"rollouts_cum": grid})
    for m, r in results.items():
        pts = pd.DataFrame(r["curve"])
        for col in ("dev_reward", "dev_success"):
            if m == "vanilla":
                df[f"{m}_{col}"] = pts[col].iloc[0]
            else:
                df = df.merge(pts[["rollouts_cum", col]].rename(columns={col: f"{m}_{col}"}), on="rollouts_cum", how="left")
    return df


def plot_curves(results: dict, out_dir: Path) -> list[Path]:
    """Dev reward vs generations (all methods, one figure); β and Δ over LOPD's steps. PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, r in results.items():
        pts = pd.DataFrame(r["curve"])
        if m == "vanilla":
            ax.axhline(pts["dev_reward"].iloc[0], ls="--", c="gray", label="vanilla")
        else:
            ax.plot(pts["rollouts_cum"], pts["dev_reward"], marker="o", label=m)
    ax.set(xlabel="generations (cumulative rollouts)", ylabel="dev reward", title="Dev reward vs rollout budget")
    ax.legend()
    paths.append(_save(plt, fig, out_dir / "dev_reward_vs_rollouts.png"))

    hist = results.get("lopd", {}).get("history")
    if hist:
        h = pd.DataFrame(hist)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
        a1.plot(h["step"], h["beta"], marker=".")
        a1.set(xlabel="step", ylabel="β", title="dual variable β")
        a2.plot(h["step"], h["delta"], marker=".", label="Δ")
        a2.axhline(float(h["delta"].iloc[0] + h["margin_violation"].iloc[0]), ls="--", c="gray", label="margin m")
        a2.set(xlabel="step", ylabel="nats", title="trajectory margin Δ")
        a2.legend()
        paths.append(_save(plt, fig, out_dir / "lopd_beta_delta.png"))
    return paths


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _merge_previous(p: Params, results: dict) -> dict:
    """Earlier results (same params) of methods not run now, so ``--method grpo`` then ``--method lopd`` compare."""
    path = layout.metrics_path(p, "distill")
    if not path.exists():
        return results
    try:
        old = read_json(path).get("details", {})
    except (json.JSONDecodeError, AttributeError):
        return results
    keep = {m: r for m, r in old.items() if m not in results and r.get("params_hash") == comparable_hash(p)}
    return {**keep, **results}


# ----------------------------------------------------------------------------- the stage


def _check_inputs(p: Params, methods: Sequence[str]) -> None:
    """Every input the methods need exists, before any model loads."""
    from lopd.memory.retrieval import INDEX_FILE

    base = layout.policy_path(p)
    if not (base / "config.json").exists():
        raise FileNotFoundError(f"distill: no base policy at {base}: run `lopd bootstrap` (or set model.path)")
    if "lopd" in methods and not (layout.composer_dir(p) / "composer.json").exists():
        raise FileNotFoundError(f"distill: method lopd needs the cold-start composer at {layout.composer_dir(p)}: run `lopd cold-start`")
    for m in ("lopd", "opsd"):
        if m in methods and not (layout.index_dir(p) / INDEX_FILE).exists():
            raise FileNotFoundError(f"distill: method {m} needs the retrieval index at {layout.index_dir(p)}: run `lopd index`")
    if {"lopd", "opsd", "sft"} & set(methods) and not any(layout.bank_dir(p).glob("round-*.parquet")):
        raise FileNotFoundError(f"distill: methods lopd/opsd/sft need the experience bank at {layout.bank_dir(p)}: run `lopd collect`")


def run(p: Params, methods: Sequence[str] | None = None, resume: bool | None = None, stop_after: int | None = None) -> dict:
    """Train ``methods`` (default ``distill.methods``) at one rollout budget; write students, metrics, curve, plots.

    ``resume`` (default ``distill.resume``) continues each method from its last checkpoint.
    ``stop_after`` is a testing hook: stop every method after that many steps, as if killed.
    """
    import mlflow

    from lopd.ops.tracking import stage_run

    methods = list(dict.fromkeys(methods or p.distill.methods))
    resume = p.distill.resume if resume is None else resume
    check_methods(p, methods)
    _check_inputs(p, methods)
    log.info("distill: methods %s, %d generations each (%d steps × %d), resume=%s",
             methods, rollout_budget(p), p.distill.steps, p.distill.batch_tasks, resume)

    results: dict[str, dict] = {}
    for method in methods:
        with stage_run(p, "distill", run_name=f"distill-{method}-seed{p.seed}", method=method):
            summary = train_method(p, method, resume=resume, stop_after=stop_after)
            if summary is None:
                return {"stopped_after": stop_after, "method": method}
            mlflow.log_metrics({k: float(v) for k, v in summary.items() if isinstance(v, (int, float))})
        results[method] = summary

    merged = _merge_previous(p, results)
    # Headline numbers per method at the top level (what `dvc metrics show` prints), the full
    # record (dev curve, timings, params hash) under "details".
    out: dict = {m: {k: r[k] for k in HEADLINE if k in r} for m, r in merged.items()}
    out.update(budget=rollout_budget(p), rollouts_per_step=p.distill.batch_tasks, **efficiency(merged))
    out["details"] = {m: {k: v for k, v in r.items() if not k.startswith("_")} for m, r in merged.items()}
    write_json(layout.metrics_path(p, "distill"), out)
    curve = curve_frame(merged)
    with atomic_path(layout.distill_curve_path(p)) as tmp:
        curve.to_csv(tmp, index=False)

    with stage_run(p, "distill", run_name=f"distill-summary-seed{p.seed}", method="summary"):
        flat = {k: v for k, v in out.items() if isinstance(v, (int, float)) and v is not None}
        mlflow.log_metrics({k: float(v) for k, v in flat.items()})
        with tempfile.TemporaryDirectory() as td:
            for path in plot_curves(merged, Path(td)):
                mlflow.log_artifact(str(path), "plots")
        mlflow.log_artifact(str(layout.metrics_path(p, "distill")))
        mlflow.log_artifact(str(layout.distill_curve_path(p)))
    return out
