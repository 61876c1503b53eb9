"""The method loop of ``lopd distill``: every method, the same budget, the same cadence.

Per step, ``distill.batch_tasks`` generations by the method's own student on train tasks
(``lopd.train.onpolicy`` documents the budget accounting), the method's update (its trainer's
``step``), MLflow metrics, a dev evaluation every ``distill.eval_every`` steps (dev only: the test
split is for ``lopd evaluate``) and a checkpoint every ``distill.checkpoint_every`` steps, from which
``distill.resume`` continues exactly (optimiser states, bank rounds, RNG).

Data parallel (``distill.engine: deepspeed``, ``lopd.train.parallel``): every rank runs this loop
on its block of each step's tasks and dev tasks; the budget is charged with the step's global
count before anyone samples; rank 0 alone logs and writes, checkpoints are written by all ranks
(each its ZeRO partition) into one directory that rank 0 then puts in place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from lopd import layout
from lopd.config import Params, ParamsError
from lopd.io import atomic_path, replace_path
from lopd.policy.engine import train_tasks_by_id
from lopd.train.bank_distiller import BankDistiller
from lopd.train.decisions import DecisionProbe
from lopd.train.lopd_trainer import LOPDTrainer
from lopd.train.onpolicy import derive_seed, ends_round, rollout_budget, round_of, step_tasks
from lopd.train.opsd_trainer import OPSDTrainer
from lopd.train.parallel import DataParallel
from lopd.train.updater import save_hf

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
# The per-step numbers kept in metrics/distill.json (details.<method>.history).
HISTORY_KEYS = ("step", "rollouts_cum", "train_wall_s", "reward_mean", "success_rate", "kl", "delta", "margin_violation",
                "beta", "anchor", "student_grad_norm", "composer_grad_norm", "grad_norm", "new_successes", "loss")


def comparable_hash(p: Params) -> str:
    """Hash of every param that changes the numbers (not which methods run, resume, cadence of checkpoints, tracking, paths,
    schedule), and with ``distill.init: champion`` the champion it starts from."""
    d = p.model_dump()
    for key in ("profile", "tracking", "paths", "schedule", "sweep"):
        d.pop(key)
    for key in ("methods", "resume", "checkpoint_every", "decision_tasks"):  # decision_tasks: a measurement, no number moves
        d["distill"].pop(key)
    if p.distill.init == "champion":  # which champion it starts from (the copy's registry marker: name, version, checkpoint hash)
        marker = layout.champion_dir(p) / "registry.json"
        d["champion"] = marker.read_text() if marker.exists() else None
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- a method's trainer


def make_trainer(p: Params, method: str, student, tokenizer, *, fresh_bank: bool = True, rounds: bool = True,
                 dp: DataParallel = DataParallel()):
    """The trainer of ``method`` ('lopd', 'opsd', 'grpo', 'sft') around a trainable ``student``.

    LOPD loads a second copy of the starting policy (``distill.init``: the base, or the champion) as
    the composer's backbone (the frozen teacher), the
    cold-start composer φ₀ (``models/composer``) and its anchor, and the retriever; with
    ``fresh_bank`` its bank starts over as a copy of ``data/bank``. ``rounds=False`` gives it no
    bank of its own (successes are not kept; for benchmarks and probes that must not write).
    """
    from lopd.memory.bank import read_bank

    tasks_by_id = train_tasks_by_id(p)
    if method == "grpo":
        from lopd.train.grpo import GRPOTrainer

        return GRPOTrainer(p, student, tokenizer, dp)
    if method == "sft":
        from lopd.train.episodes import bank_episodes
        from lopd.train.sft import SFTTrainer

        return SFTTrainer(p, student, tokenizer, bank_episodes(p, tokenizer, read_bank(layout.bank_dir(p)), tasks_by_id), tasks_by_id, dp)
    if method not in ("lopd", "opsd"):
        raise ParamsError(f"params: distill method {method!r} has no trainer (allowed: lopd, opsd, grpo, sft)")

    from lopd.latent.composer import Composer, ComposerAnchor
    from lopd.memory.retrieval import open_retriever
    from lopd.policy.modeling import load_policy

    backbone, _ = load_policy(layout.init_path(p), p.model.dtype)  # the frozen teacher's weights: the base, or the champion
    bank_dir = layout.distill_bank_dir(p, method) if rounds else None
    if bank_dir is not None and (fresh_bank or not bank_dir.is_dir()) and dp.is_main:
        with atomic_path(bank_dir) as tmp:
            shutil.copytree(layout.bank_dir(p), tmp)
        shutil.rmtree(layout.distill_index_dir(p, method), ignore_errors=True)  # an index of an earlier run's bank
    dp.barrier()
    if method == "opsd":
        backbone.eval().requires_grad_(False)
        return OPSDTrainer(p, student, tokenizer, backbone, open_retriever(p), tasks_by_id, bank_dir, dp)
    composer = Composer.load(backbone, tokenizer, layout.composer_dir(p)).eval()
    anchor = None if p.composer.frozen else ComposerAnchor.from_dir(composer, layout.composer_dir(p))
    return LOPDTrainer(p, student, tokenizer, composer, anchor, open_retriever(p), tasks_by_id, bank_dir, dp)


# ----------------------------------------------------------------------------- the loop


@dataclass
class LoopState:
    step: int = 0  # steps done
    rollouts_used: int = 0  # training generations charged to the budget
    eval_rollouts: int = 0  # dev generations (measurement, not budget)
    train_wall_s: float = 0.0  # rollout + update time, without dev evaluation and checkpoints
    history: list[dict] = field(default_factory=list)  # per-step metrics
    curve: list[dict] = field(default_factory=list)  # dev evaluations


def dev_eval(p: Params, engine, dev_tasks: Sequence, dp: DataParallel = DataParallel()) -> dict[str, float]:
    """Mean reward and success of one sample per dev task; the same seed every time (common random numbers).

    Each rank plays its block of the dev tasks; every rank gets the numbers of all of them.
    """
    from lopd.policy.engine import success_by_group

    trajs = dp.gather(engine.run(dp.split(dev_tasks), 1, seed=derive_seed(p.seed, "dev"), id_prefix="dev", progress=False))
    groups = success_by_group(p, dev_tasks, trajs)
    return {"dev_reward": sum(t.reward for t in trajs) / len(trajs), "dev_success": sum(t.success for t in trajs) / len(trajs),
            **{f"dev_success_{g}": v for g, v in groups.items()}}  # per report group (ToolWorld: pretrain, new)


def export_student(student, tokenizer, path: Path, updater=None, dp: DataParallel = DataParallel()) -> None:
    """A plain HF checkpoint (``save_pretrained``): loads with ``AutoModelForCausalLM``, no composer or bank needed."""
    tmp = path.with_name(f".{path.name}.export")
    if dp.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    save_hf(student, tokenizer, tmp, updater, dp)  # collective under ZeRO-3
    if dp.is_main:
        replace_path(tmp, path)
    dp.barrier()


def _rng_state() -> dict:
    return {"rng_python": random.getstate(), "rng_torch": torch.get_rng_state()}


def _save_checkpoint(p: Params, method: str, trainer, state: LoopState, dp: DataParallel = DataParallel()) -> None:
    """Every rank writes its part (its ZeRO partition, its RNG) into one temporary directory;
    rank 0 adds the loop state and puts the directory in place in one rename."""
    final = layout.checkpoint_dir(p, method)
    tmp = final.with_name(f".{final.name}.tmp")
    if dp.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dp.barrier()
    trainer.save(tmp)
    if dp.active:
        torch.save(_rng_state(), tmp / f"rng-{dp.rank}.pt")
    dp.barrier()
    if dp.is_main:
        torch.save({"loop": asdict(state), "trainer": trainer.state_dict(), **_rng_state(), "params_hash": comparable_hash(p),
                    "world": dp.world}, tmp / STATE_FILE)
        meta = {"method": method, "step": state.step, "rollouts_used": state.rollouts_used, "params_hash": comparable_hash(p)}
        if isinstance(trainer, BankDistiller):
            meta["bank_version"] = trainer.bank_version
        if isinstance(trainer, LOPDTrainer):
            meta["beta"] = trainer.beta
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        replace_path(tmp, final)
    dp.barrier()


def _load_checkpoint(p: Params, method: str, dp: DataParallel = DataParallel()) -> dict | None:
    path = layout.checkpoint_dir(p, method)
    if not (path / STATE_FILE).exists():
        return None
    ckpt = torch.load(path / STATE_FILE, weights_only=False)  # our own file; holds python RNG state and rows
    if ckpt["params_hash"] != comparable_hash(p):
        raise ParamsError(
            f"params: distill.resume = true but the checkpoint at {path} was written with other params "
            f"(hash {ckpt['params_hash']} != {comparable_hash(p)}): restore those params, or set distill.resume=false to start over"
        )
    if ckpt.get("world", 1) != dp.world:
        raise ParamsError(f"params: distill.resume = true but the checkpoint at {path} was written by {ckpt.get('world', 1)} "
                          f"process(es), this run has {dp.world}: resume with --nproc {ckpt.get('world', 1)}, or set distill.resume=false")
    if dp.rank:
        ckpt.update(torch.load(path / f"rng-{dp.rank}.pt", weights_only=False))  # this rank's RNG
    return ckpt


def _log_metrics(metrics: dict, step: int, dp: DataParallel = DataParallel()) -> None:
    if not dp.is_main:
        return
    import mlflow

    mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v}, step=step)


def train_method(p: Params, method: str, *, resume: bool = False, stop_after: int | None = None,
                 dp: DataParallel = DataParallel()) -> dict | None:
    """Train one method at the budget; returns its summary (``None`` when ``stop_after`` cut it short).

    ``stop_after`` (a testing hook) returns after that many steps without exporting, as if the
    process were killed there; ``resume`` continues from the last checkpoint. ``dp``: this
    process's rank (module docstring).
    """
    from lopd.policy.engine import make_engine, split_tasks
    from lopd.policy.modeling import load_policy
    from lopd.policy.rollout import RolloutBudget

    d = p.distill
    ckpt = _load_checkpoint(p, method, dp) if resume and method != "vanilla" else None
    if resume and ckpt is None and method != "vanilla":
        log.info("distill %s: no checkpoint at %s, starting from step 0", method, layout.checkpoint_dir(p, method))
    dp.barrier()  # every rank has read the checkpoint before rank 0 may remove it
    if ckpt is None and dp.is_main:  # starting over: an earlier run's checkpoint must never be resumed into this one
        shutil.rmtree(layout.checkpoint_dir(p, method), ignore_errors=True)
    src = layout.checkpoint_dir(p, method) / "student" if ckpt else layout.init_path(p)  # distill.init: the base or the champion
    student, tokenizer = load_policy(src, p.model.dtype)
    engine = make_engine(p, student, tokenizer)
    dev_tasks = split_tasks(p, "dev", d.eval_dev_tasks)
    state = LoopState()

    if method == "vanilla":  # the base as is: one dev evaluation, no generation spent
        state.curve.append({"step": 0, "rollouts_cum": 0, "train_wall_s": 0.0, **dev_eval(p, engine, dev_tasks, dp)})
        state.eval_rollouts = len(dev_tasks)
        _log_metrics({k: v for k, v in state.curve[0].items() if k.startswith("dev_")}, 0, dp)
        return _summary(p, method, state, None)

    trainer = make_trainer(p, method, student, tokenizer, fresh_bank=ckpt is None, dp=dp)
    generation = trainer.opt_student.for_generation  # ZeRO-3: full weights for the whole rollout
    if ckpt:
        trainer.load_state_dict(ckpt["trainer"], path=layout.checkpoint_dir(p, method))
        state = LoopState(**ckpt["loop"])
        random.setstate(ckpt["rng_python"])
        torch.set_rng_state(ckpt["rng_torch"])
        log.info("distill %s: resumed at step %d (%d generations used)", method, state.step, state.rollouts_used)
    budget = RolloutBudget(rollout_budget(p))
    budget.used = state.rollouts_used
    train_tasks = split_tasks(p, "train")
    probe = DecisionProbe.maybe(p, tokenizer, trainer)  # convention decisions at new apps (None: distill.decision_tasks = 0)

    def evaluate_dev() -> None:
        with generation():
            point = {"step": state.step, "rollouts_cum": budget.used, "train_wall_s": state.train_wall_s, **dev_eval(p, engine, dev_tasks, dp),
                     **(probe.at_eval(student) if probe else {})}
        state.curve.append(point)
        state.eval_rollouts += len(dev_tasks)
        # x = generations spent: the efficiency axis of the spec (dev reward vs cumulative rollouts).
        _log_metrics({k: v for k, v in point.items() if k.startswith(("dev_", "decision/")) and v is not None}, budget.used, dp)

    if state.step == 0 and not state.curve:
        evaluate_dev()  # the starting point of the curve (0 generations)
    bar = tqdm(range(state.step, d.steps), desc=f"distill {method}", unit="step", initial=state.step, total=d.steps,
               leave=False, disable=not dp.is_main)
    for step in bar:
        t0 = time.perf_counter()
        tasks = step_tasks(p, train_tasks, step, trainer.tasks_per_step)
        budget.charge(len(tasks) * trainer.samples_per_task)  # the step's global count, before anyone samples
        mine = dp.split(tasks)  # this rank's block of the step's tasks (all of them in one process)
        with trainer.timer("rollout"), generation():
            local = engine.run(mine, trainer.samples_per_task, seed=derive_seed(p.seed, method, "rollout", step),
                               id_prefix=f"{method}-s{step}", progress=False)
        trajs = dp.gather(local)
        if len(trajs) != len(tasks) * trainer.samples_per_task:
            raise RuntimeError(f"step {step}: {len(trajs)} rollouts returned for {len(tasks) * trainer.samples_per_task} charged")
        metrics = trainer.step(step, mine, local)
        metrics.update(
            reward_mean=sum(t.reward for t in trajs) / len(trajs),
            success_rate=sum(t.success for t in trajs) / len(trajs),
            rollouts_cum=budget.used,
            n_rollouts=len(trajs),
            tokens_per_s=dp.sum(engine.stats.gen_tokens_per_s),  # all ranks together
        )
        if ends_round(p, step):
            trainer.end_round(round_of(p, step))
        trainer.timer.steps += 1
        state.train_wall_s += time.perf_counter() - t0
        state.step, state.rollouts_used = step + 1, budget.used
        metrics.update(step_s=time.perf_counter() - t0, train_wall_s=state.train_wall_s, **(probe.loss_shares(trainer, dp) if probe else {}))
        state.history.append({"step": step, **metrics})
        _log_metrics(metrics, step, dp)
        bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", **({"beta": f"{metrics['beta']:.3f}"} if "beta" in metrics else {}))
        if state.step % d.eval_every == 0 or state.step == d.steps:
            evaluate_dev()
        if state.step % d.checkpoint_every == 0 or state.step == d.steps:
            _save_checkpoint(p, method, trainer, state, dp)
        if stop_after is not None and state.step >= stop_after and state.step < d.steps:
            return None
    bar.close()
    export_student(trainer.student, tokenizer, layout.student_dir(p, method), trainer.opt_student, dp)
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
    out["history"] = [{k: (None if v != v else v) for k, v in h.items() if k in HISTORY_KEYS or k.startswith("decision/")}
                      for h in state.history]  # NaN → null (JSON)
    return out
