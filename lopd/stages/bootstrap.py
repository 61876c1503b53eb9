"""Stage `bootstrap`: the embedded base policy — a tiny Qwen3 that is mediocre at ``env.name``'s environment.

Trains a BPE tokenizer on the environment's demonstrations, builds a randomly initialised
``Qwen3ForCausalLM`` from ``model.*`` params, pre-trains it on those demonstrations (loss on
the actions only) and saves a plain Hugging Face directory. ToolWorld's demonstrations are noisy
on purpose (``lopd.envs.toolworld.pretraining``): the base should succeed sometimes, like the
paper's vanilla models, so that the bank has successes and distillation has room to improve. An
environment without its own corpus is pre-trained on its scripted expert's episodes of train
tasks. With ``model.path`` set, the checkpoint there is the base and nothing is trained.
"""

from __future__ import annotations

import logging
import os
import time


from lopd import layout
from lopd.config import Params, ParamsError
from lopd.envs.registry import Demo
from lopd.io import atomic_path, write_json
from lopd.latent.teacher import LATENT_FRAMING, add_latent_placeholder
from lopd.policy.engine import environment, make_engine, split_tasks, success_by_group

log = logging.getLogger(__name__)


def expert_success(p: Params) -> dict[str, float]:
    """Scripted-expert success per split: the environment is solvable as specified ({} without an expert)."""
    env = environment(p)
    out = {}
    for split in ("train", "dev", "test") if env.expert else ():
        tasks = split_tasks(p, split, p.bootstrap.expert_check_tasks)
        wins = sum(env.play(t, env.expert())["success"] for t in tasks)
        out[split] = wins / len(tasks)
    return out


def demonstrations(p: Params) -> tuple[list[Demo], list[Demo], dict]:
    """The pre-training demonstrations, the same demos without experiences, and what they hold: the
    environment's corpus (``Environment.pretraining``, ToolWorld's: ``lopd.envs.toolworld.pretraining``),
    else the scripted expert's episodes of the first ``bootstrap.n_demos`` train tasks, plain."""
    env = environment(p)
    if env.pretraining is not None:
        return env.pretraining.demos(p, with_experiences)
    if env.expert is None:
        raise ParamsError(f"params: env.name = {p.env.name} has neither a pre-training corpus nor a scripted expert, so the "
                          "embedded base cannot be pre-trained on it: set model.path to a checkpoint")
    demos = []
    for task in split_tasks(p, "train", p.bootstrap.n_demos):
        ep = env.play(task, env.expert())
        demos.append((env.make_env(task).initial_observation(), ep["actions"], ep["observations"]))
    return demos, demos, {"n_demos": len(demos), "demo_success_rate": 1.0, "demos_plain": len(demos)}


def with_experiences(demo: Demo, lites: list[str], framing: str = LATENT_FRAMING) -> Demo:
    """``demo`` with ``lites`` (observation-lite experiences) in the teacher's framing sentence
    at the end of its system message; unchanged when ``lites`` is empty."""
    messages, actions, observations = demo
    if not lites:
        return demo
    return add_latent_placeholder(messages, placeholder="\n\n".join(lites), framing=framing), actions, observations


def episode_examples(tokenizer, demos) -> list[tuple[list[int], list[int]]]:
    """``(ids, action_mask)`` of each whole demo, tokenised exactly as a rollout would be."""
    from lopd.policy.rollout import tokenize_episode

    return [tokenize_episode(tokenizer, messages, actions, observations) for messages, actions, observations in demos]


def pretrain_base(p: Params, demos: list[Demo], plain: list[Demo], on_step=None):
    """Tokenizer + tiny Qwen3 trained on the demos; returns (model, tokenizer, losses, examples).

    Two phases (why): a small model learns to copy a name or an id out of its context in a
    sudden transition, which comes hundreds of steps sooner on short contexts with one
    candidate per entity (a copy-mechanism probe measured when the base was designed: behind 120
    fixed prompt tokens the copy came about three times later, and a schedule that had decayed
    before the transition left it unformed). So ``bootstrap.plain_epochs`` over the plain
    demos come first, at a constant learning rate (a decayed one can stop the transition);
    then ``bootstrap.epochs`` over all demos, experiences included, decaying over the last
    ``bootstrap.decay_frac`` of that phase. Measured on plain demos alone (demo data, batch 32,
    lr 3e-3 cosine over 940 steps): the name copy went 0.31 -> 1.0 between steps 400 and 600,
    and the copy of an id out of a tool result only started (0.17) as the rate ran out.
    """
    from jinja2 import Template

    from lopd.policy.chat import QWEN3_LITE_TEMPLATE
    from lopd.policy.modeling import build_tiny_qwen3, train_tokenizer
    from lopd.train.lm_train import train_causal_lm

    template = Template(QWEN3_LITE_TEMPLATE)

    def corpus():  # the demos as the chat template renders them
        for messages, actions, observations in demos:
            convo = list(messages)
            for i, action in enumerate(actions):
                convo.append({"role": "assistant", "content": action})
                if i < len(observations) and observations[i] is not None:
                    convo.append({"role": "tool", "content": observations[i]})
            yield template.render(messages=convo, add_generation_prompt=False)

    pretraining = environment(p).pretraining
    tokenizer = train_tokenizer(corpus(), p.model.vocab_size, list(pretraining.words()) if pretraining else [])
    tokenizer.padding_side = "left"
    model = build_tiny_qwen3(p.model, tokenizer, seed=p.seed)
    b = p.bootstrap
    examples = episode_examples(tokenizer, demos)
    phases = [(episode_examples(tokenizer, plain), b.plain_epochs, b.warmup_frac, 0.0, "pretrain plain")] if b.plain_epochs else []
    phases.append((examples, b.epochs, 0.0 if phases else b.warmup_frac, b.decay_frac, "pretrain"))
    losses: list[float] = []
    for phase_examples, epochs, warmup_frac, decay_frac, desc in phases:
        offset = len(losses)
        losses += train_causal_lm(
            model,
            phase_examples,
            pad_id=tokenizer.pad_token_id,
            epochs=epochs,
            lr=b.lr,
            batch_size=b.batch_size,
            warmup_frac=warmup_frac,
            decay_frac=decay_frac,
            weight_decay=b.weight_decay,
            seed=p.seed + offset,
            on_step=(lambda step, loss, lr, o=offset: on_step(o + step, loss, lr)) if on_step else None,
            desc=desc,
        )
    if pretraining is not None and pretraining.finish is not None:
        pretraining.finish(model, tokenizer, examples)  # ToolWorld: the new apps' names read as "an app I do not know"
    return model, tokenizer, losses, examples


def train_base(p: Params, path, on_step=None) -> dict:
    """Pre-train the embedded base from scratch and save it (model + tokenizer) at ``path``; what it took."""
    td = time.perf_counter()
    demos, plain, demo_info = demonstrations(p)
    model, tokenizer, losses, examples = pretrain_base(p, demos, plain, on_step)
    with atomic_path(path) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return {**demo_info, "demo_tokens": sum(len(ex[0]) for ex in examples), "pretrain_steps": len(losses),
            "final_loss": sum(losses[-10:]) / len(losses[-10:]), "pretrain_s": time.perf_counter() - td,
            "pretrain_threads": torch_threads()}


def measure(p: Params, path) -> dict:
    """The base at ``path`` on dev: sampled success (overall and per app group), mean reward, and
    teacher-forced exact match of each scripted-expert action (which step fails). Deterministic
    for given params on CPU."""
    from lopd.policy.modeling import load_policy, n_params
    from lopd.policy.probe import action_accuracy, expert_episodes

    env = environment(p)
    model, tokenizer = load_policy(path, p.model.dtype)
    dev_tasks = split_tasks(p, "dev", p.bootstrap.eval_dev_tasks)
    trajs = make_engine(p, model, tokenizer).run(dev_tasks, seed=p.seed, id_prefix="dev")
    chance = env.chance(dev_tasks, env.group_of(dev_tasks)) if env.chance else None
    r = p.rollout
    return {
        "dev_success_rate": sum(t.success for t in trajs) / len(trajs),
        "dev_success_by_group": success_by_group(p, dev_tasks, trajs),
        "dev_mean_reward": sum(t.reward for t in trajs) / len(trajs),
        **({"dev_chance": {k: v for k, v in chance.items() if k != "policies"}} if chance else {}),  # the best policy that learns nothing
        "dev_action_accuracy": action_accuracy(model, expert_episodes(tokenizer, dev_tasks, env)) if env.expert else {},
        "n_params": n_params(model),
        "eval": {"dev_tasks": len(dev_tasks), "seed": p.seed, "temperature": r.temperature, "top_p": r.top_p,
                 "max_new_tokens": r.max_new_tokens, "batch_size": r.batch_size, "backend": r.backend},
    }


def run(p: Params) -> dict:
    """Build, install or adopt the base policy and measure it; writes ``metrics/bootstrap.json``.

    ``model.path`` set: that checkpoint is the base. Else ``bootstrap.source``: ``committed``
    copies the committed base (``lopd.policy.base_asset``) to ``models/base``; ``train`` pre-trains one.
    """
    import mlflow

    from lopd.ops.tracking import stage_run
    from lopd.policy import base_asset

    t0 = time.perf_counter()
    path = layout.policy_path(p)  # a bad model.path fails here, before any compute
    if not p.model.path and p.bootstrap.source == "committed":
        base_asset.check_recipe(p)  # params that do not match the committed base fail here, before any compute
    with stage_run(p, "bootstrap"):
        expert = expert_success(p)
        mlflow.log_metrics({f"expert_success_{k}": v for k, v in expert.items()})
        log.info("scripted expert success: %s", expert)
        info: dict = {"skipped": bool(p.model.path), "base_source": "model.path" if p.model.path else p.bootstrap.source}
        record = None
        if p.model.path:
            log.info("model.path = %s: using that checkpoint as the base, nothing to pre-train", path)
        elif p.bootstrap.source == "committed":
            record = base_asset.install(p, path)
            log.info("bootstrap: installed the committed base (pre-trained in %.1f min; bootstrap.source=train rebuilds it)",
                     record["pretrain_s"] / 60)
            info.update(committed_pretrain_s=record["pretrain_s"], committed_pretrain_steps=record["pretrain_steps"])
        else:
            def on_step(step, loss, lr):
                if step % 10 == 0:
                    mlflow.log_metrics({"pretrain_loss": loss, "pretrain_lr": lr}, step=step)

            info.update(train_base(p, path, on_step))
        measured = measure(p, path)
        acc, labels = measured["dev_action_accuracy"], environment(p).groups
        chance = measured.get("dev_chance")
        log.info("dev success %.3f%s%s; expert-action exact match by index: %s", measured["dev_success_rate"],
                 "".join(f", {labels[g]} {v}" for g, v in measured["dev_success_by_group"].items()),
                 f" (chance {chance['success_rate']}, {chance['success_by_group']})" if chance else "",
                 {k: round(v, 2) for k, v in acc.items() if "/" not in k})
        if record is not None and record["metrics"]["eval"] == measured["eval"]:
            info["reproduces_committed_record"] = measured["dev_success_rate"] == record["metrics"]["dev_success_rate"]
        metrics = {
            "params": p.flat(),
            "recipe": base_asset.recipe(p),  # what a committed base must match, the world's conventions included
            "expert_success_rate": min(expert.values()) if expert else None,
            "expert_success_by_split": expert,
            **measured,
            "model_path": str(p.model.path) if p.model.path else str(path.relative_to(p.root())),
            **info,
            "wall_s": time.perf_counter() - t0,
        }
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        mlflow.log_metrics({f"dev_action_acc/{k}": v for k, v in acc.items()})
        mlflow.log_metrics({f"dev_success_{g}": v for g, v in measured["dev_success_by_group"].items() if v is not None})
        write_json(layout.metrics_path(p, "bootstrap"), metrics)
    return metrics


def export_base(p: Params, out=None) -> dict:
    """Write ``models/base`` (pre-trained with ``bootstrap.source=train``) as the committed base:
    float16 weights, re-measured as exported, with its record and model card (``lopd.policy.base_asset``)."""
    import platform
    import tempfile
    from pathlib import Path

    from lopd.io import read_json
    from lopd.policy import base_asset
    from lopd.policy.modeling import load_policy

    src, out = layout.base_model_dir(p), Path(out or base_asset.ASSET_DIR)
    info_path = layout.metrics_path(p, "bootstrap")
    info = read_json(info_path) if info_path.exists() else {}
    if info.get("base_source") != "train" or info.get("recipe") != base_asset.recipe(p):
        raise ParamsError(f"export-base: {src} was not pre-trained with these params and bootstrap.source=train "
                          f"(see {info_path}): run `lopd bootstrap --set bootstrap.source=train` with them first")
    model, tokenizer = load_policy(src, "float32")
    with tempfile.TemporaryDirectory() as td:  # measure exactly what is committed: the float16 weights
        record = {"recipe": base_asset.recipe(p), "pretrain_s": info["pretrain_s"], "pretrain_steps": info["pretrain_steps"],
                  "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {info.get('pretrain_threads', '?')} torch thread(s), torch {torch_version()}",
                  "command": f"lopd bootstrap --profile {p.profile} --set bootstrap.source=train && lopd export-base --profile {p.profile}"}
        base_asset.write_asset(model, tokenizer, Path(td) / "base", {**record, "metrics": {}}, "")
        record["metrics"] = {"expert_success_rate": info["expert_success_rate"], **measure(p, Path(td) / "base")}
        base_asset.write_asset(model, tokenizer, out, record, base_asset.model_card(record))
    log.info("export-base: wrote %s (dev success %.3f)", out, record["metrics"]["dev_success_rate"])
    return record


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def torch_version() -> str:
    import torch

    return torch.__version__
