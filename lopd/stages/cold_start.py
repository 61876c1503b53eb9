"""Stage `cold-start` (spec step 5): one round of training the latent composer, backbone frozen.

The teacher is the base (encoder LoRA off) with ``n_ret`` retrieved experiences' latents in its
prompt. ``cold_start.objective`` says what it is trained towards:

- ``nll`` (the spec's): the teacher's NLL of each bank entry's action tokens, given latents of
  its retrieved peers;
- ``text_kl``: KL(T_text ‖ T_latent) at every action position of the base's own collected
  rollouts, successes and failures alike: the target is the same base reading the same
  experiences *as text*, so the latents learn to say what the text says;
- ``mix``: ``nll`` on the successes among those rollouts + ``kl_weight`` × ``text_kl``.

Only the encoder LoRA and the resampler learn. The result, φ₀, is saved to ``models/composer/``
and is the anchor of the distillation Lagrangian. With ``distill.init: champion`` "the base" above
is the registered champion (``models/champion``): the composer is refitted to the backbone the
frozen teacher then is, not reused from the base's.

Then it is measured on dev (never train): the teacher as a policy (success with no context,
with the experiences as text, with their latents; ``lopd.latent.teacher_rollout``); the NLL of
the scripted expert's dev successes with no latents, random bank entries' latents, the retrieved
ones' latents and the retrieved ones as text; and Δ = mean A(τ)·δ_t over the base's fresh dev
rollouts (spec: Losses).
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from lopd import layout
from lopd.config import Params
from lopd.io import atomic_path, write_json
from lopd.latent.composer import Composer, encoder_text
from lopd.latent.teacher import teacher_logprobs, text_teacher_batch
from lopd.latent.teacher_rollout import teacher_success
from lopd.memory.bank import BankError, read_bank
from lopd.policy.engine import make_engine, split_tasks, train_tasks_by_id
from lopd.policy.scoring import token_logprobs
from lopd.train import composer_warmup
from lopd.train.episodes import Episode, Timer, bank_episodes, from_expert, initial_messages, student_batch, teacher_batch, to_episodes
from lopd.train.losses import cold_start_loss, masked_mean, privilege, text_to_latent_kl, trajectory_margin
from lopd.train.onpolicy import derive_seed

log = logging.getLogger(__name__)


def n_latents(p: Params) -> int:
    return p.retrieval.n_ret * p.composer.num_latents


def teacher_token_logp(
    composer: Composer, tokenizer, episodes: Sequence[Episode], experiences: Sequence[Sequence[str]], p: Params,
    timer: Timer | None = None, ids_BTM: torch.Tensor | None = None,
):
    """``(token_logp_BT, mask_BT)``: the teacher's log-prob of each action token, student layout.

    Differentiable in φ unless called under ``no_grad``. ``timer`` splits encoder / resampler /
    teacher forward. With ``ids_BTM`` the teacher's log-probs at those ids come third.
    """
    timer = timer or Timer()
    device = next(composer.parameters()).device
    with timer("encoder"):
        texts = [encoder_text(e.task.text, x) for e, exps in zip(episodes, experiences) for x in exps]
        ids_NS, valid_NS = composer.tokenize(texts)
        states_NSD = composer.encoder_states(ids_NS, valid_NS)
    with timer("resampler"):
        lat_NKD = composer.resampler(states_NSD, valid_NS)
        latents_BLD = lat_NKD.reshape(len(episodes), -1, lat_NKD.shape[-1])
    with timer("teacher_forward"):
        s_ids_BT, _, s_mask_BT = student_batch(episodes, tokenizer.pad_token_id)
        tb = teacher_batch(tokenizer, episodes, latents_BLD.shape[1], p.composer.placeholder).to(device)
        scores = teacher_logprobs(composer.backbone, tb, latents_BLD, s_ids_BT.to(device), s_mask_BT.to(device), ids_BTM=ids_BTM)
    if ids_BTM is not None:
        return scores.token_logp_BT, s_mask_BT.to(device), scores.topm_logp_BTM
    return scores.token_logp_BT, s_mask_BT.to(device)


@torch.no_grad()
def text_teacher(composer: Composer, tokenizer, episodes: Sequence[Episode], experiences: Sequence[Sequence[str]], top_m: int | None):
    """The frozen base with the experiences *as text* (the KL target): its ``TeacherScores`` in the student's layout."""
    device = next(composer.parameters()).device
    s_ids_BT, _, s_mask_BT = student_batch(episodes, tokenizer.pad_token_id)
    tb = text_teacher_batch(tokenizer, episodes, ["\n\n".join(x) for x in experiences]).to(device)
    no_latents = torch.zeros(len(episodes), 0, composer.backbone.config.hidden_size, device=device)
    return teacher_logprobs(composer.backbone, tb, no_latents, s_ids_BT.to(device), s_mask_BT.to(device), top_m=top_m)


def batch_loss(p: Params, composer: Composer, tokenizer, episodes: Sequence[Episode], experiences: Sequence[Sequence[str]],
               timer: Timer) -> tuple[torch.Tensor, dict[str, float]]:
    """The cold-start loss of one batch (``cold_start.objective``) and its parts (``nll``, ``text_kl``)."""
    c = p.cold_start
    nll = text_kl = None
    if c.objective == "nll":
        logp_BT, mask_BT = teacher_token_logp(composer, tokenizer, episodes, experiences, p, timer)
    else:
        with timer("text_teacher"):
            target = text_teacher(composer, tokenizer, episodes, experiences, p.distill.top_m)  # support: the text's top-M
        logp_BT, mask_BT, logp_BTM = teacher_token_logp(composer, tokenizer, episodes, experiences, p, timer, target.topm_ids_BTM)
        text_kl = text_to_latent_kl(target.topm_logp_BTM, logp_BTM, mask_BT)
    if c.objective != "text_kl":
        wins_BT = mask_BT.bool() & torch.tensor([e.success for e in episodes], device=mask_BT.device)[:, None]  # NLL of successes only
        nll = -masked_mean(logp_BT, wins_BT)
    loss = cold_start_loss(nll, text_kl, c.objective, c.kl_weight)
    return loss, {k: float(v.detach()) for k, v in (("nll", nll), ("text_kl", text_kl)) if v is not None}


def rollout_episodes(p: Params, tokenizer, tasks_by_id: dict) -> list[Episode]:
    """The base's collected train rollouts (``data/rollouts``), successes and failures, as episodes."""
    from lopd.stages.collect import ROLLOUTS_FILE

    path = layout.rollouts_dir(p) / ROLLOUTS_FILE
    if not path.exists():
        raise FileNotFoundError(f"cold_start.objective = {p.cold_start.objective}: {path} is missing; run `lopd collect` first")
    frame = pd.read_parquet(path, columns=["task_id", "token_ids", "action_mask", "prompt_len", "reward", "success"])
    messages: dict[str, list[dict]] = {}
    out = []
    for r in frame.itertuples(index=False):
        task = tasks_by_id[r.task_id]
        if r.task_id not in messages:
            messages[r.task_id] = initial_messages(p, task)
        out.append(Episode(task, messages[r.task_id], list(r.token_ids), list(r.action_mask), int(r.prompt_len), float(r.reward), bool(r.success)))
    return out


def train_targets(p: Params, tokenizer, bank) -> list[Episode]:
    """What the composer is trained on, capped by ``cold_start.max_targets``: bank entries replayed as
    episodes (``nll``, ``bank_id`` order) or the base's collected rollouts (``text_kl``, ``mix``)."""
    if p.cold_start.objective == "nll":
        episodes = bank_episodes(p, tokenizer, bank, train_tasks_by_id(p))
    else:
        episodes = rollout_episodes(p, tokenizer, train_tasks_by_id(p))
    return episodes[: p.cold_start.max_targets] if p.cold_start.max_targets else episodes


def lr_lambda(schedule: str, total: int):
    """Multiplier of the base rate at step ``s``: constant, or 10 % linear warm-up then cosine to 0."""
    warmup = max(1, total // 10)
    if schedule == "constant":
        return lambda s: 1.0
    return lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1.0 + math.cos(math.pi * (s - warmup) / max(1, total - warmup)))


def retrieved_lite(p: Params, retriever, tasks: Sequence) -> list[list[str]]:
    """The observation-lite texts of each task's ``retrieval.n_ret`` retrieved experiences."""
    return [[x["lite_text"] for x in hits] for hits in retriever.retrieve_batch(list(tasks), p.retrieval.n_ret)]


def train(p: Params, composer: Composer, tokenizer, targets: list[Episode], retriever, on_step=None,
          experiences: list[list[str]] | None = None) -> tuple[list[float], Timer]:
    """The cold start: ``cold_start.objective`` on each batch of targets, latents of their retrieved peers
    (``experiences``, one list per target; retrieved here when not given)."""
    c = p.cold_start
    params = composer.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=c.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(c.lr_schedule, c.epochs * math.ceil(len(targets) / c.batch_size)))
    rng = random.Random(p.seed)
    if experiences is None:
        experiences = retrieved_lite(p, retriever, [e.task for e in targets])
    losses, timer = [], Timer()
    bs = c.batch_size
    bar = tqdm(total=c.epochs * math.ceil(len(targets) / bs), desc=f"cold start ({c.objective})", unit="step", leave=False)
    composer.train()
    for epoch in range(c.epochs):
        order = list(range(len(targets)))
        rng.shuffle(order)
        for start in range(0, len(order), bs):
            idx = order[start : start + bs]
            loss, parts = batch_loss(p, composer, tokenizer, [targets[i] for i in idx], [experiences[i] for i in idx], timer)
            with timer("backward"):
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, p.distill.grad_clip)
                opt.step()
                sched.step()
            timer.steps += 1
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            if on_step:
                on_step(len(losses) - 1, losses[-1], parts)
    bar.close()
    composer.eval()
    return losses, timer


def expert_dev_episodes(p: Params, tokenizer, tasks: Sequence) -> list[Episode]:
    """Scripted-expert successes on held-out dev tasks, tokenised as a rollout would be (none without an expert)."""
    from lopd.envs.registry import get_environment
    from lopd.policy.probe import expert_episodes

    env = get_environment(p)
    return [from_expert(tokenizer, e) for e in expert_episodes(tokenizer, tasks, env) if e.success] if env.expert else []


@torch.no_grad()
def privilege_metrics(
    p: Params, composer: Composer, student, tokenizer, dev_eps: list[Episode], retriever, bank,
    nll_eps: list[Episode] | None = None,
) -> dict:
    """NLLs on successful dev episodes (none / random / retrieved latents / retrieved text) and Δ on ``dev_eps``.

    ``nll_eps``: the successful dev trajectories the NLLs are measured on; default the
    successes among ``dev_eps`` (the base's own rollouts).
    """
    device = next(composer.parameters()).device
    wins = nll_eps if nll_eps is not None else [e for e in dev_eps if e.success]
    rng = random.Random(p.seed + 1)
    retrieved = [[x["lite_text"] for x in hits] for hits in retriever.retrieve_batch([e.task for e in dev_eps], p.retrieval.n_ret)]
    retrieved_wins = [[x["lite_text"] for x in hits] for hits in retriever.retrieve_batch([e.task for e in wins], p.retrieval.n_ret)] if wins else []
    lite = bank["lite_text"].tolist()

    def nll(episodes, exps, as_text: bool = False) -> float:
        """NLL per action token: the bare base (``exps`` None), the teacher with ``exps``' latents, or with them as text."""
        if not episodes:
            return float("nan")
        total, count = 0.0, 0
        for i in range(0, len(episodes), p.cold_start.batch_size):
            chunk = episodes[i : i + p.cold_start.batch_size]
            if exps is None:
                ids_BT, attn_BT, mask_BT = (t.to(device) for t in student_batch(chunk, tokenizer.pad_token_id))
                _, logp_BT = token_logprobs(student, ids_BT, attn_BT, mask_BT)
            elif as_text:
                logp_BT = text_teacher(composer, tokenizer, chunk, exps[i : i + len(chunk)], top_m=None).token_logp_BT
                mask_BT = student_batch(chunk, tokenizer.pad_token_id)[2].to(device)
            else:
                logp_BT, mask_BT = teacher_token_logp(composer, tokenizer, chunk, exps[i : i + len(chunk)], p)
            total -= float(logp_BT[mask_BT.bool()].sum())
            count += int(mask_BT.sum())
        return total / count

    random_exps = [rng.sample(lite, p.retrieval.n_ret) for _ in wins]
    out = {
        "n_dev_episodes": len(dev_eps),
        "n_dev_successes": sum(e.success for e in dev_eps),
        "n_nll_trajectories": len(wins),
        "nll_no_latents": nll(wins, None),
        "nll_random_latents": nll(wins, random_exps),
        "nll_retrieved_latents": nll(wins, retrieved_wins),
        "nll_retrieved_text": nll(wins, retrieved_wins, as_text=True),
    }
    # Δ on fresh student rollouts, successes and failures alike (A(τ) = 2r − 1).
    deltas = []
    for i in range(0, len(dev_eps), p.cold_start.batch_size):
        chunk = dev_eps[i : i + p.cold_start.batch_size]
        t_logp_BT, mask_BT = teacher_token_logp(composer, tokenizer, chunk, retrieved[i : i + len(chunk)], p)
        ids_BT, attn_BT, _ = (t.to(device) for t in student_batch(chunk, tokenizer.pad_token_id))
        _, s_logp_BT = token_logprobs(student, ids_BT, attn_BT, mask_BT)
        reward_B = torch.tensor([e.reward for e in chunk], device=device)
        delta_BT = privilege(t_logp_BT, s_logp_BT, mask_BT)
        deltas.append((float(trajectory_margin(delta_BT, reward_B, mask_BT)) * int(mask_BT.sum()), int(mask_BT.sum())))
    out["delta_mean"] = sum(d for d, _ in deltas) / max(1, sum(n for _, n in deltas))
    return out


@torch.no_grad()
def latent_probe(composer: Composer, tokenizer, tasks: Sequence, experiences: Sequence[Sequence[str]], top: int = 5) -> str:
    """Nearest vocabulary tokens of each latent through the LM head (the paper's interpretability probe)."""
    lm_head = composer.backbone.get_base_model().get_output_embeddings()
    lines = []
    for task, exps in zip(tasks, experiences):
        latents_LD = composer([task.text], [exps])[0]
        top_LK = lm_head(latents_LD.to(lm_head.weight.dtype)).topk(top, dim=-1).indices
        lines.append(f"## {task.task_id}: {task.text}")
        for j, ids in enumerate(top_LK.tolist()):
            lines.append(f"latent {j:3d} (experience {j // composer.resampler.queries.shape[0]}): " + " | ".join(repr(tokenizer.decode([t])) for t in ids))
        lines.append("")
    return "\n".join(lines)


def warmup_pairs(p: Params, retriever, split: str, n_tasks: int) -> list[tuple[str, str]]:
    """(task text, retrieved experience) pairs of the first ``n_tasks`` tasks of ``split``.

    Tasks, not bank entries: the bank holds the base's successes, mostly at apps it already
    knows, while distillation meets every app alike."""
    tasks = split_tasks(p, split, n_tasks)
    return [(t.text, x) for t, exps in zip(tasks, retrieved_lite(p, retriever, tasks)) for x in exps]


def run_warmup(p: Params, composer: Composer, tokenizer, retriever, eval_tasks: int = 32) -> dict:
    """The autoencoding warm-up (``cold_start.warmup_*``) on ``warmup_tasks`` train tasks' (task, retrieved
    experience) pairs; its reconstruction accuracy on ``eval_tasks`` dev tasks' pairs."""
    import mlflow

    c = p.cold_start
    pairs, eval_pairs = warmup_pairs(p, retriever, "train", c.warmup_tasks), warmup_pairs(p, retriever, "dev", eval_tasks)
    t0 = time.perf_counter()
    result = composer_warmup.warmup(composer, tokenizer, pairs, eval_pairs, c.warmup_steps, c.warmup_lr, c.warmup_batch_size,
                                    p.distill.grad_clip, seed=derive_seed(p.seed, "composer-warmup"),
                                    on_step=lambda step, loss: mlflow.log_metric("warmup_loss", loss, step=step))
    out = {"steps": c.warmup_steps, "pairs": len(pairs), "first_loss": result.losses[0],
           "final_loss": sum(result.losses[-10:]) / len(result.losses[-10:]),
           "dev_token_accuracy": result.token_accuracy, "wall_s": time.perf_counter() - t0}
    log.info("composer warm-up: %d steps on %d pairs, loss %.3f -> %.3f, dev token accuracy %.3f",
             c.warmup_steps, len(pairs), out["first_loss"], out["final_loss"], result.token_accuracy)
    mlflow.log_metrics({"warmup_final_loss": out["final_loss"], "warmup_dev_token_accuracy": result.token_accuracy})
    return out


def run(p: Params) -> dict:
    """Cold-start the composer, save φ₀ to ``models/composer/``, write ``metrics/cold_start.json``."""
    import mlflow

    from lopd.memory.retrieval import open_retriever
    from lopd.ops.tracking import stage_run
    from lopd.policy.modeling import load_policy

    t0 = time.perf_counter()
    if p.distill.init == "champion":  # the composer is fitted to the backbone it will read: the champion's
        from lopd.ops.registry import fetch_champion

        fetch_champion(p)
    path = layout.init_path(p)
    bank = read_bank(layout.bank_dir(p))
    if len(bank) < p.bank.min_size:
        raise BankError(
            f"cold start: the bank holds {len(bank)} successful trajectories, fewer than bank.min_size = {p.bank.min_size}. "
            "The base policy solves too few train tasks: collect more (collect.n_tasks, collect.samples_per_task) "
            "or strengthen the base (bootstrap.*)"
        )
    retriever = open_retriever(p)
    with stage_run(p, "cold_start"):
        backbone, tokenizer = load_policy(path, p.model.dtype)
        student, _ = load_policy(path, p.model.dtype)  # the untouched starting policy (distill.init): rollouts and the no-latent NLL
        composer = Composer.build(backbone, tokenizer, p.composer, seed=p.seed)
        targets = train_targets(p, tokenizer, bank)
        log.info("cold start (%s): %d bank entries, %d targets, n_ret=%d, K=%d", p.cold_start.objective, len(bank), len(targets),
                 p.retrieval.n_ret, p.composer.num_latents)

        experiences = retrieved_lite(p, retriever, [e.task for e in targets])
        warmup_metrics = run_warmup(p, composer, tokenizer, retriever) if p.cold_start.warmup_steps else None

        def on_step(step, loss, parts):
            mlflow.log_metrics({"cold_start_loss": loss, **{f"cold_start_{k}": v for k, v in parts.items()}}, step=step)

        losses, timer = train(p, composer, tokenizer, targets, retriever, on_step, experiences)
        with atomic_path(layout.composer_dir(p)) as tmp:
            composer.save(tmp)

        dev_tasks = split_tasks(p, "dev", p.cold_start.eval_dev_tasks)
        engine = make_engine(p, student, tokenizer)
        trajs = engine.run(dev_tasks, seed=p.seed, id_prefix="cs-dev")
        dev_eps = to_episodes(p, dev_tasks, trajs)
        # The privilege lives where the base fails: the NLLs are taken on the scripted expert's
        # successes on the same dev tasks (the base's own successes are mostly at apps it knows).
        nll_eps, nll_source = expert_dev_episodes(p, tokenizer, dev_tasks), "scripted-expert dev successes"
        metrics = privilege_metrics(p, composer, student, tokenizer, dev_eps, retriever, bank, nll_eps)
        metrics["nll_source"] = nll_source
        if p.cold_start.teacher_success_tasks:
            ts_tasks = split_tasks(p, "dev", p.cold_start.teacher_success_tasks)
            hits = retriever.retrieve_batch(list(ts_tasks), p.retrieval.n_ret)
            exps = {t.task_id: [h["lite_text"] for h in hs] for t, hs in zip(ts_tasks, hits)}
            rows = teacher_success(p, student, tokenizer, ts_tasks, exps, {"latents": composer}, seed=derive_seed(p.seed, "teacher-success"))
            metrics["teacher_success"] = {"tasks": len(ts_tasks), **rows}
            log.info("cold start: teacher success on %d dev tasks: %s", len(ts_tasks),
                     ", ".join(f"{k} {v['success']:.3f}" + (f" (new apps {v['success_new']})" if "success_new" in v else "") for k, v in rows.items()))
            mlflow.log_metrics({f"teacher_success_{k}": v["success"] for k, v in rows.items()})
        if warmup_metrics:
            metrics["warmup"] = warmup_metrics
        metrics.update(
            n_bank=len(bank),
            objective=p.cold_start.objective,
            n_targets=len(targets),
            n_latents=n_latents(p),
            steps=len(losses),
            first_loss=losses[0] if losses else None,
            final_loss=sum(losses[-5:]) / max(1, len(losses[-5:])),
            step_ms=timer.per_step_ms(),
            wall_s=time.perf_counter() - t0,
        )
        probe = dev_tasks[: p.cold_start.probe_tasks]
        if probe:
            exps = [[x["lite_text"] for x in hits] for hits in retriever.retrieve_batch(probe, p.retrieval.n_ret)]
            mlflow.log_text(latent_probe(composer, tokenizer, probe, exps), "latent_probe.md")
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v})
        mlflow.log_metrics({f"step_ms_{k}": v for k, v in metrics["step_ms"].items()})
        write_json(layout.metrics_path(p, "cold_start"), {"params": p.flat(), **metrics})
    return metrics
