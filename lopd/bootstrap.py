"""Stage `bootstrap`: the embedded base policy — a tiny Qwen3 that is mediocre at ToolWorld.

Trains a BPE tokenizer on noisy-expert demonstrations, builds a randomly initialised
``Qwen3ForCausalLM`` from ``model.*`` params, pre-trains it on those demonstrations (loss on
the actions only) and saves a plain Hugging Face directory. The demonstrations are noisy on
purpose: the base should succeed sometimes, like the paper's vanilla models, so that the
bank has successes and distillation has room to improve. With ``model.path`` set, the
checkpoint there is the base and nothing is trained.
"""

from __future__ import annotations

import logging
import random
import re
import time

from lopd import layout
from lopd.config import Params
from lopd.envs.toolworld import NoisyExpert, ScriptedExpert, ToolWorldEnv, run_episode
from lopd.io import atomic_path, write_json
from lopd.lite import lite_text
from lopd.policy import make_engine, split_tasks
from lopd.teacher import LATENT_FRAMING, add_latent_placeholder

log = logging.getLogger(__name__)


def expert_success(p: Params) -> dict[str, float]:
    """Scripted-expert success per split: the environment is solvable as specified."""
    out = {}
    for split in ("train", "dev", "test"):
        tasks = split_tasks(p, split, p.bootstrap.expert_check_tasks)
        wins = sum(
            run_episode(ToolWorldEnv(t, p.env.max_turns, p.env.success_threshold), ScriptedExpert())["success"]
            for t in tasks
        )
        out[split] = wins / len(tasks)
    return out


def demonstrations(p: Params) -> tuple[list[tuple[list[dict], list[str], list[str]]], float]:
    """(initial messages, actions, observations) of noisy-expert episodes on train tasks,
    and the share of them that succeed. A share ``bootstrap.experience_frac`` of them carry
    past experiences in their system message (``with_experiences``)."""
    expert = NoisyExpert(p.bootstrap.demo_error_rate, seed=p.seed)
    demos, lites = [], []
    for task in split_tasks(p, "train", p.bootstrap.n_demos):
        env = ToolWorldEnv(task, p.env.max_turns, p.env.success_threshold)
        messages = env.initial_observation()
        ep = run_episode(env, expert)
        demos.append((messages, ep["actions"], ep["observations"]))
        lites.append((task.family, lite_text(task.text, ep["actions"], ep["shorts"]) if ep["success"] else None))
    demos = with_experiences(demos, lites, p.bootstrap.experience_frac, p.bootstrap.experience_max, seed=p.seed)
    return demos, sum(lite is not None for _, lite in lites) / len(demos)


def with_experiences(demos, lites, frac: float, n_max: int, seed: int, framing: str = LATENT_FRAMING) -> list:
    """``demos`` where a share ``frac`` carry 1..``n_max`` other successful demos of the same
    family, observation-lite, in the teacher's framing sentence at the end of the system message.

    Why: the teacher is this base with latents where that sentence's placeholder stands
    (``lopd.teacher``). A real LLM takes such context in its stride; a tiny model that only
    ever saw one fixed system prompt is thrown by the framing alone (+0.029 nats per action
    token on dev, measured; +0.005 after this). ``lites[i]`` is ``(family, lite text or None
    when demo i failed)``; a demo never sees itself.
    """
    if frac <= 0:
        return demos
    rng = random.Random(seed)
    by_family: dict[str, list[int]] = {}
    for i, (family, lite) in enumerate(lites):
        if lite is not None:
            by_family.setdefault(family, []).append(i)
    out = []
    for i, (messages, actions, observations) in enumerate(demos):
        peers = [j for j in by_family.get(lites[i][0], []) if j != i]
        if peers and rng.random() < frac:
            picked = rng.sample(peers, min(len(peers), rng.randint(1, n_max)))
            messages = add_latent_placeholder(messages, placeholder="\n\n".join(lites[j][1] for j in picked), framing=framing)
        out.append((messages, actions, observations))
    return out


# A JSON argument value inside a tool call's "arguments" object: a string or a number.
_ARG_VALUE = re.compile(r'(?<=": )("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?)')


def copy_spans(action: str) -> list[tuple[int, int]]:
    """Character spans of what an action copies from its context: the tool call's argument
    values (names, ids, amounts, dates), or the whole text of a final answer."""
    head = action.find('"arguments"')
    if "<tool_call>" not in action:
        return [(0, len(action))]
    if head < 0:
        return []
    return [m.span() for m in _ARG_VALUE.finditer(action, head)]


def episode_weights(tokenizer, ids: list[int], mask: list[int], actions: list[str], copy_weight: float) -> list[float]:
    """Per-token loss weights of a tokenised episode: ``copy_weight`` on the tokens of each
    action's ``copy_spans``, 1 on the rest of the action (and its eos), 0 off the action mask.

    Why: a small model learns the format of an episode long before it learns to look names and
    ids up in its context, and those few tokens are what success hinges on.
    """
    from lopd.probe import action_spans

    weights = [0.0] * len(ids)
    starts = [a for a, _ in action_spans(mask)]
    if len(starts) != len(actions):
        raise ValueError(f"{len(actions)} actions but {len(starts)} action segments in the episode's mask")
    for start, action in zip(starts, actions):
        enc = tokenizer(action, add_special_tokens=False, return_offsets_mapping=True)
        spans = copy_spans(action)
        for j, (a, b) in enumerate(enc["offset_mapping"]):
            weights[start + j] = copy_weight if any(a < e and b > s for s, e in spans) else 1.0
        weights[start + len(enc["input_ids"])] = 1.0  # the eos closing the action
    return weights


def episode_examples(tokenizer, demos, copy_weight: float = 1.0) -> list[tuple]:
    """``(ids, action_mask)`` of each whole demo (with per-token weights when ``copy_weight != 1``)."""
    from lopd.rollout import tokenize_episode

    out = []
    for messages, actions, observations in demos:
        ids, mask = tokenize_episode(tokenizer, messages, actions, observations)
        out.append((ids, mask) if copy_weight == 1.0 else (ids, mask, episode_weights(tokenizer, ids, mask, actions, copy_weight)))
    return out


def short_context_examples(tokenizer, demos) -> list[tuple[list[int], list[int]]]:
    """The curriculum's short contexts: one ``(ids, action_mask)`` per action of each demo, with
    the task (no system prompt), the previous action and its observation as context, and the
    loss on this action only."""
    from lopd.chat import encode
    from lopd.rollout import tokenize_episode

    out = []
    for messages, actions, observations in demos:
        task = [m for m in messages if m["role"] != "system"]
        for i, action in enumerate(actions):
            if i and observations[i - 1] is None:
                break
            prev, prev_obs = actions[max(0, i - 1) : i], observations[max(0, i - 1) : i]
            ids, mask = tokenize_episode(tokenizer, task, [*prev, action], prev_obs)
            if prev:  # the previous action is context here, not a target
                prev_end = mask.index(1) + len(encode(tokenizer, prev[0])) + 1  # its tokens and eos
                mask = [0] * prev_end + mask[prev_end:]
            out.append((ids, mask))
    return out


def pretrain_base(p: Params, demos, on_step=None):
    """Tokenizer + tiny Qwen3 trained on the demos; returns (model, tokenizer, losses)."""
    from lopd.lm_train import train_causal_lm
    from lopd.modeling import build_tiny_qwen3, train_tokenizer

    def corpus():
        for messages, actions, observations in demos:
            convo = list(messages)
            for i, action in enumerate(actions):
                convo.append({"role": "assistant", "content": action})
                if i < len(observations):
                    convo.append({"role": "tool", "content": observations[i]})
            yield "".join(f"{m['role']}\n{m['content']}\n" for m in convo)

    tokenizer = train_tokenizer(corpus(), p.model.vocab_size)
    tokenizer.padding_side = "left"

    model = build_tiny_qwen3(p.model, tokenizer, seed=p.seed)
    # Optional curriculum (why): with the ~150-token system prompt in front, attention starts
    # out spread over the whole prompt and a small model stays at the prior over the names in
    # the task for hundreds of steps; on short contexts (task, previous action and observation)
    # the copy circuit can form first and carry over to full prompts. Measured on first actions
    # (demo data, batch 16): copy accuracy stayed at the prior (0.21) for 400 full-prompt steps;
    # after 6 epochs on task + first action alone it was 0.76, and 0.72 on full prompts after
    # 2 full epochs. It did not lift dev success (README, known gaps), so it is off by default.
    phases = [(short_context_examples(tokenizer, demos), p.bootstrap.short_context_epochs, "pretrain short")] if p.bootstrap.short_context_epochs else []
    examples = episode_examples(tokenizer, demos, p.bootstrap.copy_weight)
    phases.append((examples, p.bootstrap.epochs, "pretrain"))
    losses: list[float] = []
    for phase_examples, epochs, desc in phases:
        offset = len(losses)
        losses += train_causal_lm(
            model,
            phase_examples,
            pad_id=tokenizer.pad_token_id,
            epochs=epochs,
            lr=p.bootstrap.lr,
            batch_size=p.bootstrap.batch_size,
            warmup_frac=p.bootstrap.warmup_frac,
            weight_decay=p.bootstrap.weight_decay,
            seed=p.seed + offset,
            on_step=(lambda step, loss, lr, o=offset: on_step(o + step, loss, lr)) if on_step else None,
            desc=desc,
        )
    return model, tokenizer, losses, examples


def run(p: Params) -> dict:
    """Build (or adopt) the base policy and measure it; writes ``metrics/bootstrap.json``."""
    import mlflow

    from lopd.modeling import load_policy, n_params
    from lopd.probe import action_accuracy, expert_episodes
    from lopd.tracking import stage_run

    t0 = time.perf_counter()
    path = layout.policy_path(p)  # a bad model.path fails here, before any compute
    with stage_run(p, "bootstrap"):
        expert = expert_success(p)
        mlflow.log_metrics({f"expert_success_{k}": v for k, v in expert.items()})
        log.info("scripted expert success: %s", expert)
        info: dict = {"skipped": bool(p.model.path)}
        if p.model.path:
            log.info("model.path = %s: using that checkpoint as the base, nothing to pre-train", path)
        else:
            td = time.perf_counter()
            demos, demo_success = demonstrations(p)

            def on_step(step, loss, lr):
                if step % 10 == 0:
                    mlflow.log_metrics({"pretrain_loss": loss, "pretrain_lr": lr}, step=step)

            model, tokenizer, losses, examples = pretrain_base(p, demos, on_step)
            with atomic_path(path) as tmp:
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            info.update(
                n_demos=len(demos),
                demo_success_rate=demo_success,
                demo_tokens=sum(len(ex[0]) for ex in examples),
                pretrain_steps=len(losses),
                final_loss=sum(losses[-10:]) / len(losses[-10:]),
                pretrain_s=time.perf_counter() - td,
            )
        model, tokenizer = load_policy(path, p.model.dtype)
        engine = make_engine(p, model, tokenizer)
        dev_tasks = split_tasks(p, "dev", p.bootstrap.eval_dev_tasks)
        trajs = engine.run(dev_tasks, seed=p.seed, id_prefix="dev")
        dev_success = sum(t.success for t in trajs) / len(trajs)
        dev_reward = sum(t.reward for t in trajs) / len(trajs)
        # Which step fails: teacher-forced exact match of each expert action (lopd.probe).
        action_acc = action_accuracy(model, expert_episodes(tokenizer, dev_tasks, p.env.max_turns, p.env.success_threshold))
        log.info("dev success %.3f; expert-action exact match by index: %s", dev_success,
                 {k: round(v, 2) for k, v in action_acc.items() if "/" not in k})
        metrics = {
            "params": p.flat(),
            "expert_success_rate": min(expert.values()),
            "expert_success_by_split": expert,
            "dev_success_rate": dev_success,
            "dev_mean_reward": dev_reward,
            "dev_action_accuracy": action_acc,
            "n_params": n_params(model),
            "model_path": str(path),
            **info,
            "wall_s": time.perf_counter() - t0,
        }
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        mlflow.log_metrics({f"dev_action_acc/{k}": v for k, v in action_acc.items()})
        write_json(layout.metrics_path(p, "bootstrap"), metrics)
    return metrics
