"""Benchmark: what the teacher's prompt costs the base, and what retrieved experiences can give it.

NLL per action token of successful scripted-expert dev trajectories (the cold-start NLL set)
under the base model with:

- the student's prompt (bare);
- the teacher's framing sentence with nothing in it, and with ``n_ret·K`` zero slots;
- ``n_ret·K`` latents of an untrained composer (retrieved experiences);
- the retrieved / random bank entries as *text* in the framing sentence (no composer): the
  privilege a base that reads its context could get from those experiences.

Each line is split into the tokens an action copies from its context (argument values,
answers: ``lopd.bootstrap.copy_spans``) and the rest. Needs ``models/base``, ``data/bank`` and
``data/index`` (``lopd bootstrap``, ``collect``, ``index``); writes nothing.

    .venv/bin/python benchmarks/privilege_ceiling.py [--profile demo] [--tasks 64] [--set k=v ...]
"""

from __future__ import annotations

import argparse
import random

import torch

from lopd import layout
from lopd.bank import read_bank
from lopd.bootstrap import episode_weights
from lopd.chat import encode, render_prompt
from lopd.cold_start import expert_dev_episodes, n_latents
from lopd.composer import Composer
from lopd.config import load_params
from lopd.episodes import student_batch, teacher_batch
from lopd.modeling import load_policy
from lopd.policy import split_tasks
from lopd.probe import action_spans
from lopd.retrieval import open_retriever
from lopd.scoring import token_logprobs
from lopd.teacher import TeacherPrompt, add_latent_placeholder, align_to_student, collate_teacher, teacher_logprobs


def copied_BT(tokenizer, episodes, mask_BT: torch.Tensor) -> torch.Tensor:
    """True at the action tokens inside each action's ``copy_spans`` (student layout).

    ``bootstrap.episode_weights`` marks them (weight 2 here, 1 elsewhere on the actions).
    """
    out = torch.zeros_like(mask_BT)
    for i, e in enumerate(episodes):
        actions = [tokenizer.decode(e.token_ids[a : b - 1]) for a, b in action_spans(e.action_mask)]  # each without its eos
        weights = episode_weights(tokenizer, e.token_ids, e.action_mask, actions, copy_weight=2.0)
        out[i, : len(weights)] = torch.tensor(weights) == 2.0
    return out & mask_BT


def text_prompt_logp(model, tokenizer, episodes, texts, ids_BT, mask_BT) -> torch.Tensor:
    """The base's log-probs with ``texts[i]`` (joined experiences, maybe empty) in the framing sentence."""
    examples = []
    for e, text in zip(episodes, texts):
        prompt_ids = encode(tokenizer, render_prompt(tokenizer, add_latent_placeholder(e.messages, placeholder=text)))
        examples.append(align_to_student(TeacherPrompt(prompt_ids, [0] * len(prompt_ids)), e.token_ids, e.action_mask, e.prompt_len))
    batch = collate_teacher(examples, tokenizer.pad_token_id)
    empty = torch.zeros(len(episodes), 0, model.config.hidden_size)
    return teacher_logprobs(model, batch, empty, ids_BT, mask_BT).token_logp_BT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--tasks", type=int, default=64, help="dev tasks (the scripted expert's successes on them are scored)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    a = ap.parse_args()
    p = load_params(a.params, a.profile, a.overrides)
    torch.manual_seed(p.seed)

    model, tokenizer = load_policy(layout.policy_path(p), p.model.dtype)
    model.eval()
    episodes = expert_dev_episodes(p, tokenizer, split_tasks(p, "dev", a.tasks))
    lite = read_bank(layout.bank_dir(p))["lite_text"].tolist()
    retrieved = [[x["lite_text"] for x in hits] for hits in open_retriever(p).retrieve_batch([e.task for e in episodes], p.retrieval.n_ret)]
    rng = random.Random(p.seed + 1)
    random_exps = [rng.sample(lite, p.retrieval.n_ret) for _ in episodes]

    ids_BT, attn_BT, mask_BT = student_batch(episodes, tokenizer.pad_token_id)
    copy_BT = copied_BT(tokenizer, episodes, mask_BT)
    rest_BT = mask_BT & ~copy_BT
    L = n_latents(p)
    slots = teacher_batch(tokenizer, episodes, L, p.composer.placeholder)

    def with_latents(latents_BLD):
        return teacher_logprobs(model, slots, latents_BLD, ids_BT, mask_BT).token_logp_BT

    rows = {}
    with torch.no_grad():
        rows["bare (student prompt)"] = token_logprobs(model, ids_BT, attn_BT, mask_BT)[1]
        rows["framing sentence, no slots"] = text_prompt_logp(model, tokenizer, episodes, [""] * len(episodes), ids_BT, mask_BT)
        rows[f"framing + {L} zero slots"] = with_latents(torch.zeros(len(episodes), L, model.config.hidden_size))
        composer = Composer.build(model, tokenizer, p.composer, seed=p.seed)
        rows[f"framing + {L} untrained composer latents"] = with_latents(composer([e.task.text for e in episodes], retrieved))
        rows["framing + retrieved experiences as text"] = text_prompt_logp(model, tokenizer, episodes, ["\n\n".join(x) for x in retrieved], ids_BT, mask_BT)
        rows["framing + random experiences as text"] = text_prompt_logp(model, tokenizer, episodes, ["\n\n".join(x) for x in random_exps], ids_BT, mask_BT)

    print(f"{len(episodes)} scripted-expert dev trajectories; action tokens: {int(copy_BT.sum())} copied, {int(rest_BT.sum())} other")
    print(f"{'teacher prompt':45s} {'all':>8s} {'copied':>8s} {'other':>8s}")
    for name, logp_BT in rows.items():
        nll = [-(logp_BT[m].mean().item()) for m in (mask_BT, copy_BT, rest_BT)]
        print(f"{name:45s} {nll[0]:8.4f} {nll[1]:8.4f} {nll[2]:8.4f}")
    bare = rows["bare (student prompt)"]
    share = (bare[copy_BT].sum() / bare[mask_BT].sum()).item()
    print(f"share of the bare NLL on copied tokens: {share:.2f}")


if __name__ == "__main__":
    main()
