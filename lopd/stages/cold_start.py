"""Stage `cold-start` (spec step 5): one SFT round of the latent composer, backbone frozen.

For each bank entry (a successful train trajectory) the composer reads ``n_ret`` *other*
retrieved successes, and the teacher (base weights, encoder LoRA off) with those latents in
its prompt is trained to predict the entry's action tokens. Only the encoder LoRA and the
resampler learn. The result, φ₀, is saved to ``models/composer/`` and is the anchor of the
distillation Lagrangian.

Then the privilege is measured on dev (never train): the NLL of successful dev trajectories
with no latents, with latents of random bank entries, and with latents of the retrieved ones
(the base's own dev successes, or the scripted expert's on the same dev tasks when the base
has fewer than ``MIN_POLICY_WINS``, recorded as ``nll_source``); and Δ = mean A(τ)·δ_t over
the base's fresh dev rollouts (spec: Losses).
"""

from __future__ import annotations

import logging
import random
import time
from typing import Sequence

import torch

from lopd import layout
from lopd.config import Params
from lopd.io import atomic_path, write_json
from lopd.latent.composer import Composer, encoder_text
from lopd.latent.teacher import teacher_logprobs
from lopd.memory.bank import BankError, read_bank
from lopd.policy.engine import make_engine, split_tasks, train_tasks_by_id
from lopd.policy.scoring import token_logprobs
from lopd.train.episodes import Episode, Timer, bank_episodes, from_expert, student_batch, teacher_batch, to_episodes
from lopd.train.losses import masked_mean, privilege, trajectory_margin

log = logging.getLogger(__name__)


def n_latents(p: Params) -> int:
    return p.retrieval.n_ret * p.composer.num_latents


def teacher_token_logp(
    composer: Composer, tokenizer, episodes: Sequence[Episode], experiences: Sequence[Sequence[str]], p: Params,
    timer: Timer | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_logp_BT, mask_BT)``: the teacher's log-prob of each action token, student layout.

    Differentiable in φ unless called under ``no_grad``. ``timer`` splits encoder / resampler /
    teacher forward.
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
        scores = teacher_logprobs(composer.backbone, tb, latents_BLD, s_ids_BT.to(device), s_mask_BT.to(device))
    return scores.token_logp_BT, s_mask_BT.to(device)


def train_targets(p: Params, tokenizer, bank) -> list[Episode]:
    """Bank entries replayed as episodes (train tasks, ``bank_id`` order, capped by ``cold_start.max_targets``)."""
    episodes = bank_episodes(p, tokenizer, bank, train_tasks_by_id(p))
    return episodes[: p.cold_start.max_targets] if p.cold_start.max_targets else episodes


def train(p: Params, composer: Composer, tokenizer, targets: list[Episode], retriever, on_step=None) -> tuple[list[float], Timer]:
    """The cold-start SFT: teacher NLL of each target's actions given latents of its retrieved peers."""
    params = composer.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=p.cold_start.lr, weight_decay=0.0)
    rng = random.Random(p.seed)
    experiences = [[x["lite_text"] for x in hits] for hits in retriever.retrieve_batch([e.task for e in targets], p.retrieval.n_ret)]
    losses, timer = [], Timer()
    bs = p.cold_start.batch_size
    composer.train()
    for epoch in range(p.cold_start.epochs):
        order = list(range(len(targets)))
        rng.shuffle(order)
        for start in range(0, len(order), bs):
            idx = order[start : start + bs]
            logp_BT, mask_BT = teacher_token_logp(composer, tokenizer, [targets[i] for i in idx], [experiences[i] for i in idx], p, timer)
            loss = -masked_mean(logp_BT, mask_BT)  # NLL per action token
            with timer("backward"):
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, p.distill.grad_clip)
                opt.step()
            timer.steps += 1
            losses.append(loss.item())
            if on_step:
                on_step(len(losses) - 1, losses[-1])
    composer.eval()
    return losses, timer


MIN_POLICY_WINS = 8  # fewer of the base's own dev successes than this and the NLLs use the expert's


def expert_dev_episodes(p: Params, tokenizer, tasks: Sequence) -> list[Episode]:
    """Scripted-expert successes on held-out dev tasks, tokenised as a rollout would be."""
    from lopd.policy.probe import expert_episodes

    return [from_expert(tokenizer, e) for e in expert_episodes(tokenizer, tasks, p.env.max_turns, p.env.success_threshold) if e.success]


@torch.no_grad()
def privilege_metrics(
    p: Params, composer: Composer, student, tokenizer, dev_eps: list[Episode], retriever, bank,
    nll_eps: list[Episode] | None = None,
) -> dict:
    """NLLs on successful dev episodes (none / random / retrieved latents) and Δ on ``dev_eps``.

    ``nll_eps``: the successful dev trajectories the NLLs are measured on; default the
    successes among ``dev_eps`` (the base's own rollouts).
    """
    device = next(composer.parameters()).device
    wins = nll_eps if nll_eps is not None else [e for e in dev_eps if e.success]
    rng = random.Random(p.seed + 1)
    retrieved = [[x["lite_text"] for x in hits] for hits in retriever.retrieve_batch([e.task for e in dev_eps], p.retrieval.n_ret)]
    retrieved_wins = [[x["lite_text"] for x in hits] for hits in retriever.retrieve_batch([e.task for e in wins], p.retrieval.n_ret)] if wins else []
    lite = bank["lite_text"].tolist()

    def nll(episodes, exps) -> float:
        if not episodes:
            return float("nan")
        total, count = 0.0, 0
        for i in range(0, len(episodes), p.cold_start.batch_size):
            chunk = episodes[i : i + p.cold_start.batch_size]
            if exps is None:
                ids_BT, attn_BT, mask_BT = (t.to(device) for t in student_batch(chunk, tokenizer.pad_token_id))
                _, logp_BT = token_logprobs(student, ids_BT, attn_BT, mask_BT)
            else:
                logp_BT, mask_BT = teacher_token_logp(composer, tokenizer, chunk, exps[i : i + len(chunk)], p)
            total -= float(logp_BT[mask_BT].sum())
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


def run(p: Params) -> dict:
    """Cold-start the composer, save φ₀ to ``models/composer/``, write ``metrics/cold_start.json``."""
    import mlflow

    from lopd.memory.retrieval import open_retriever
    from lopd.ops.tracking import stage_run
    from lopd.policy.modeling import load_policy

    t0 = time.perf_counter()
    path = layout.policy_path(p)
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
        student, _ = load_policy(path, p.model.dtype)  # the untouched base: rollouts and the no-latent NLL
        composer = Composer.build(backbone, tokenizer, p.composer, seed=p.seed)
        targets = train_targets(p, tokenizer, bank)
        log.info("cold start: %d bank entries, %d targets, n_ret=%d, K=%d", len(bank), len(targets), p.retrieval.n_ret, p.composer.num_latents)

        def on_step(step, loss):
            mlflow.log_metric("cold_start_nll", loss, step=step)

        losses, timer = train(p, composer, tokenizer, targets, retriever, on_step)
        with atomic_path(layout.composer_dir(p)) as tmp:
            composer.save(tmp)

        dev_tasks = split_tasks(p, "dev", p.cold_start.eval_dev_tasks)
        engine = make_engine(p, student, tokenizer)
        trajs = engine.run(dev_tasks, seed=p.seed, id_prefix="cs-dev")
        dev_eps = to_episodes(p, dev_tasks, trajs)
        policy_wins = [e for e in dev_eps if e.success]
        if len(policy_wins) >= MIN_POLICY_WINS:
            nll_eps, nll_source = policy_wins, "base policy dev successes"
        else:
            # Too few of the base's own dev successes to measure an NLL on: say so and use the
            # scripted expert's successful trajectories on the same held-out dev tasks.
            log.warning("cold start: the base solved %d of %d dev tasks; NLLs are measured on scripted-expert dev trajectories",
                        len(policy_wins), len(dev_eps))
            nll_eps, nll_source = expert_dev_episodes(p, tokenizer, dev_tasks), "scripted-expert dev trajectories"
        metrics = privilege_metrics(p, composer, student, tokenizer, dev_eps, retriever, bank, nll_eps)
        metrics["nll_source"] = nll_source
        metrics.update(
            n_bank=len(bank),
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
