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
import os
import random
import time

import torch

from lopd import layout
from lopd.config import Params, ParamsError
from lopd.envs.toolworld import NoisyExpert, ScriptedExpert, ToolWorldEnv, run_episode
from lopd.io import atomic_path, write_json
from lopd.latent.teacher import LATENT_FRAMING, add_latent_placeholder
from lopd.memory.lite import lite_text
from lopd.policy.engine import make_engine, split_tasks, success_by_group

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


Demo = tuple[list[dict], list[str], list[str]]  # (initial messages, actions, observations)


def demo_tasks(p: Params) -> list:
    """Train tasks on the pre-training apps only (``env.pretrain_apps`` per family)."""
    from lopd.envs.toolworld import FAMILIES, make_tasks, pretrain_apps

    families = p.env.families or FAMILIES
    apps = {f: pretrain_apps(f, p.env.pretrain_apps) for f in families}
    return make_tasks("train", p.bootstrap.n_demos, seed=p.env.task_seed, families=families, apps=apps,
                      world_seed=p.env.world_seed, tag="demo", pretrain_apps=p.env.pretrain_apps)


def play(p: Params, task, agent) -> tuple[Demo, str | None]:
    """An agent's episode on ``task`` as a demo, and its observation-lite text when it succeeded."""
    env = ToolWorldEnv(task, p.env.max_turns, p.env.success_threshold)
    messages = env.initial_observation()
    ep = run_episode(env, agent)
    return (messages, ep["actions"], ep["observations"]), (lite_text(task.text, ep["actions"], ep["shorts"]) if ep["success"] else None)


def demonstrations(p: Params) -> tuple[list[Demo], list[Demo], dict]:
    """The pre-training demonstrations, the same demos without experiences, and what they hold.

    Noisy-expert episodes on train tasks of the pre-training apps. A share
    ``bootstrap.experience_frac`` of them carry 1..``bootstrap.experience_max`` experiences in
    the teacher's framing sentence: other successful demos of the *same app* (so the app's
    conventions can be read off them), or, for a share ``bootstrap.fresh_app_frac`` of those, a
    whole example at a synthetic app whose conventions are drawn fresh for it
    (``fresh_app_demo``). Why both: the teacher is this base with experiences where that
    sentence's placeholder stands (``lopd.latent.teacher``), so the base must be at home with the
    framing and must *use* what experiences show; on a fresh app nothing else predicts the
    conventions. A share ``bootstrap.unseen_app_frac`` of all demos is set at a synthetic app with
    fresh conventions and *no* experiences: that is where a new app without experiences stands,
    and the base should act there (guess what it cannot know, read the errors), not stall.
    """
    expert = NoisyExpert(p.bootstrap.demo_error_rate, seed=p.seed)
    tasks = demo_tasks(p)
    played = [play(p, task, expert) for task in tasks]
    rng = random.Random(p.seed)
    by_app: dict[str, list[int]] = {}
    for i, (task, (_, lite)) in enumerate(zip(tasks, played)):
        if lite is not None:
            by_app.setdefault(task.app, []).append(i)
    demos, kinds = [], {"plain": 0, "same_app": 0, "fresh_app": 0, "unseen_app": 0, "distractors": 0}
    pool = [j for ids in by_app.values() for j in ids]  # every successful demo: the distractors' source
    for task, (demo, _) in zip(tasks, played):
        if rng.random() < p.bootstrap.unseen_app_frac:
            demos.append(fresh_app_demo(p, task.family, 0, expert, rng)[0])
            kinds["unseen_app"] += 1
            continue
        if rng.random() >= p.bootstrap.experience_frac:
            demos.append(demo)
            kinds["plain"] += 1
            continue
        n_exp = rng.randint(1, p.bootstrap.experience_max)
        if rng.random() < p.bootstrap.fresh_app_frac:
            demo, lites = fresh_app_demo(p, task.family, n_exp, expert, rng)
            kinds["fresh_app"] += 1
        else:
            peers = [j for j in by_app.get(task.app, []) if played[j][0] is not demo]
            lites = [played[j][1] for j in rng.sample(peers, min(len(peers), n_exp))]
            kinds["same_app" if lites else "plain"] += 1
        # Distractors (why): retrieval is not perfect and a random bank entry is almost never from
        # the task's app. A base that copies conventions from any experience is misled by them
        # (measured: 3 random experiences cut dev success on the pre-training apps from 0.79 to
        # 0.41), so some slots hold another app's success, and the target still follows its own app.
        others = [j for j in pool if tasks[j].app != task.app]
        for k in range(len(lites)):
            if others and rng.random() < p.bootstrap.distractor_frac:
                lites[k] = played[rng.choice(others)][1]
                kinds["distractors"] += 1
        demos.append(with_experiences(demo, lites))
    return demos, [demo for demo, _ in played], {"n_demos": len(demos), "demo_success_rate": sum(lite is not None for _, lite in played) / len(played),
                   **{f"demos_{k}": v for k, v in kinds.items()}}


def with_experiences(demo: Demo, lites: list[str], framing: str = LATENT_FRAMING) -> Demo:
    """``demo`` with ``lites`` (observation-lite experiences) in the teacher's framing sentence
    at the end of its system message; unchanged when ``lites`` is empty."""
    messages, actions, observations = demo
    if not lites:
        return demo
    return add_latent_placeholder(messages, placeholder="\n\n".join(lites), framing=framing), actions, observations


def fresh_app_demo(p: Params, family: str, n_exp: int, expert, rng: random.Random) -> tuple[Demo, list[str]]:
    """A noisy-expert demo at a synthetic app with freshly drawn conventions, and ``n_exp`` (maybe 0)
    successful episodes of other tasks at that same app (observation-lite) to show it with."""
    from lopd.envs.toolworld import SYNTHETIC_APPS, Task, random_conventions
    from lopd.envs.toolworld.families import REGISTRY

    fam, app = REGISTRY[family], rng.choice(SYNTHETIC_APPS)
    conventions = random_conventions(family, rng)

    def task(k: int):
        text, goal = fam.sample_goal(rng, app)
        return Task(f"fresh-{app}-{rng.getrandbits(32):08x}-{k}", family, "train", text, rng.getrandbits(32), goal, conventions)

    lites = []
    for k in range(8 * n_exp):  # noisy successes, as a bank holds; the scripted expert if they run short
        if len(lites) == n_exp:
            break
        lite = play(p, task(k + 1), expert if k < 4 * n_exp else ScriptedExpert())[1]
        if lite is not None:
            lites.append(lite)
    return play(p, task(0), expert)[0], lites


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

    from lopd.envs.toolworld import entity_words
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

    tokenizer = train_tokenizer(corpus(), p.model.vocab_size, entity_words())
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
    unseen_apps_as_unknown(model, tokenizer, examples)
    return model, tokenizer, losses, examples


@torch.no_grad()
def unseen_apps_as_unknown(model, tokenizer, examples) -> list[str]:
    """Give every app name the demos never contain (the new apps) the mean embedding of the
    synthetic apps'; returns those names.

    Why: a token pre-training never shows keeps its random initial embedding, and the base reads
    it as nothing in particular, not as "an app I do not know". The synthetic apps are exactly
    that (their conventions were drawn fresh every time), so their mean is what a new app should
    look like. This uses no knowledge of the new apps' conventions. (Hugging Face initialises
    added tokens at the mean embedding for the same reason.)
    """
    from lopd.envs.toolworld import SYNTHETIC_APPS
    from lopd.envs.toolworld.families import REGISTRY

    seen = {i for ids, _ in examples for i in ids}
    ids = lambda names: [tokenizer.convert_tokens_to_ids(n) for n in names]  # noqa: E731
    apps = [a for fam in REGISTRY.values() for a in fam.apps]
    unseen = [a for a, i in zip(apps, ids(apps)) if i not in seen]
    if unseen:
        emb = model.get_input_embeddings().weight
        emb[ids(unseen)] = emb[ids(SYNTHETIC_APPS)].mean(0)
    return unseen


def train_base(p: Params, path, on_step=None) -> dict:
    """Pre-train the embedded base from scratch and save it (model + tokenizer) at ``path``; what it took."""
    td = time.perf_counter()
    demos, plain, demo_info = demonstrations(p)
    model, tokenizer, losses, examples = pretrain_base(p, demos, plain, on_step)
    with atomic_path(path) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return {**demo_info, "demo_tokens": sum(len(ex[0]) for ex in examples), "pretrain_steps": len(losses),
            "final_loss": sum(losses[-10:]) / len(losses[-10:]), "pretrain_s": time.perf_counter() - td}


def measure(p: Params, path) -> dict:
    """The base at ``path`` on dev: sampled success (overall and per app group), mean reward, and
    teacher-forced exact match of each scripted-expert action (which step fails). Deterministic
    for given params on CPU."""
    from lopd.envs.toolworld.chance import chance_row
    from lopd.policy.engine import app_group
    from lopd.policy.modeling import load_policy, n_params
    from lopd.policy.probe import action_accuracy, expert_episodes

    model, tokenizer = load_policy(path, p.model.dtype)
    dev_tasks = split_tasks(p, "dev", p.bootstrap.eval_dev_tasks)
    trajs = make_engine(p, model, tokenizer).run(dev_tasks, seed=p.seed, id_prefix="dev")
    chance = chance_row(dev_tasks, {t.task_id: app_group(p, t) for t in dev_tasks}, p.env.max_turns, p.env.success_threshold)
    r = p.rollout
    return {
        "dev_success_rate": sum(t.success for t in trajs) / len(trajs),
        "dev_success_by_group": success_by_group(p, dev_tasks, trajs),
        "dev_mean_reward": sum(t.reward for t in trajs) / len(trajs),
        "dev_chance": {k: v for k, v in chance.items() if k != "policies"},  # the best policy that learns nothing
        "dev_action_accuracy": action_accuracy(model, expert_episodes(tokenizer, dev_tasks, p.env.max_turns, p.env.success_threshold)),
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
        acc = measured["dev_action_accuracy"]
        chance = measured["dev_chance"]
        log.info("dev success %.3f (pre-training apps %s, new apps %s; chance %s, %s, %s); expert-action exact match by index: %s",
                 measured["dev_success_rate"], measured["dev_success_by_group"]["pretrain"], measured["dev_success_by_group"]["new"],
                 chance["success_rate"], chance["success_by_group"]["pretrain"], chance["success_by_group"]["new"],
                 {k: round(v, 2) for k, v in acc.items() if "/" not in k})
        if record is not None and record["metrics"]["eval"] == measured["eval"]:
            info["reproduces_committed_record"] = measured["dev_success_rate"] == record["metrics"]["dev_success_rate"]
        metrics = {
            "params": p.flat(),
            "expert_success_rate": min(expert.values()),
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
    if info.get("base_source") != "train" or base_asset.recipe(p) != {k: info.get("params", {}).get(k) for k in base_asset.recipe(p)}:
        raise ParamsError(f"export-base: {src} was not pre-trained with these params and bootstrap.source=train "
                          f"(see {info_path}): run `lopd bootstrap --set bootstrap.source=train` with them first")
    model, tokenizer = load_policy(src, "float32")
    with tempfile.TemporaryDirectory() as td:  # measure exactly what is committed: the float16 weights
        record = {"recipe": base_asset.recipe(p), "pretrain_s": info["pretrain_s"], "pretrain_steps": info["pretrain_steps"],
                  "machine": f"{platform.machine()}, {os.cpu_count()} CPU threads, torch {torch_version()}",
                  "command": f"lopd bootstrap --profile {p.profile} --set bootstrap.source=train && lopd export-base --profile {p.profile}"}
        base_asset.write_asset(model, tokenizer, Path(td) / "base", {**record, "metrics": {}}, "")
        record["metrics"] = {"expert_success_rate": info["expert_success_rate"], **measure(p, Path(td) / "base")}
        base_asset.write_asset(model, tokenizer, out, record, base_asset.model_card(record))
    log.info("export-base: wrote %s (dev success %.3f)", out, record["metrics"]["dev_success_rate"])
    return record


def torch_version() -> str:
    import torch

    return torch.__version__
