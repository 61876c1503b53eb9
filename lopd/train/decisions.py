"""Where learning stops: the decisions an app's hidden conventions set, tracked over training.

At the apps the base was not pre-trained on (report group ``new``), three choices decide an
episode: ``format`` (which value format the main call writes), ``check`` (whether the check tool
comes first: the ``prereq`` convention) and ``commit`` (whether the commit tool is called). The
environment names them (``Environment.decisions``: at a turn, ``{kind: (right action, wrong
action)}``). This module measures, per kind:

- **P(right)** of a model: on the scripted expert's episode of a fixed set of dev tasks, at each
  decision the two continuations (right and wrong action after the same prefix) are scored, and
  ``P(right) = σ(log π(right) − log π(wrong))``, the probability of the right choice between the
  two. Only the tokens from the first one the continuations differ in count (the shared ones cancel).
  Scored for the student (every dev evaluation), the text teacher (the frozen base reading the
  retrieved experiences as text, ``text_teacher_batch``) and the latent teacher (the frozen base
  with the cold-start composer φ₀'s latents, ``teacher_batch``); the teachers are fixed, so once.
- **loss share**: in the method's own training batch (``trainer.token_loss``, a
  :class:`lopd.train.episodes.TokenLoss`), the fraction of the per-token loss mass
  ``Σ|loss_t|`` over all action tokens that falls on the decision tokens of new-app rows
  (where an action is either of a decision's two options: from its first differing character on).

Shapes as in ``lopd.train.losses``: B rows, T positions (target layout), N decision pairs.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from lopd import layout
from lopd.envs.registry import get_environment
from lopd.latent.teacher import teacher_logprobs, text_teacher_batch
from lopd.policy.probe import action_spans
from lopd.policy.rollout import tokenize_episode
from lopd.policy.scoring import token_logprobs
from lopd.train.episodes import Episode, student_batch, teacher_batch

log = logging.getLogger(__name__)

GROUP = "new"  # the report group probed (ToolWorld: apps the base was not pre-trained on); all tasks without groups
ROLES = ("student", "teacher_text", "teacher_latent", "loss_share")  # decision/<kind>/<role>
_TEACHER_CACHE: dict[tuple, dict[str, float]] = {}  # the fixed teachers' P(right), once per params and task set


# ----------------------------------------------------------------------------- pure functions


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index at which token sequences ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def suffix_mask(n: int, start: int) -> list[int]:
    """``[0] * start + [1] * (n - start)``: a continuation's decision tokens, from ``start`` to the end."""
    return [0] * start + [1] * (n - start)


def continuation_logp(token_logp_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """``Σ_t log π(x_t | x_<t)`` over each row's masked tokens: ``(B, T), (B, T) -> (B,)``."""
    return (token_logp_BT * mask_BT.to(token_logp_BT.dtype)).sum(-1)


def p_right(logp_right_N: Tensor, logp_wrong_N: Tensor) -> Tensor:
    """``σ(log π(right) − log π(wrong))`` = π(right) / (π(right) + π(wrong)): ``(N,), (N,) -> (N,)``."""
    return torch.sigmoid(logp_right_N - logp_wrong_N)


def loss_share(loss_BT: Tensor, mask_BT: Tensor, decision_BT: Tensor) -> float:
    """``Σ |loss|·decision / Σ |loss|·mask``: the share of a batch's per-token loss mass on the decision tokens.

    ``loss_BT``: per-token loss (target layout), ``mask_BT``: the action tokens the loss is taken on,
    ``decision_BT``: the decision tokens (a subset). NaN when the batch carries no loss at all.
    """
    mass_BT = loss_BT.detach().abs() * mask_BT.to(loss_BT.dtype)
    total = float(mass_BT.sum())
    return float((mass_BT * decision_BT.to(loss_BT.dtype)).sum()) / total if total > 0 else float("nan")


def by_kind(kinds: Sequence[str], values_N: Tensor) -> dict[str, float]:
    """The mean of ``values_N`` per kind: ``{kind: mean}`` in first-seen order."""
    out: dict[str, list[float]] = {}
    for k, v in zip(kinds, values_N.tolist()):
        out.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in out.items()}


# ----------------------------------------------------------------------------- decision pairs and tokens


@dataclass
class DecisionPair:
    kind: str
    right: Episode  # the prefix + the right action; action_mask marks its decision tokens only
    wrong: Episode  # the prefix + the wrong action, likewise


def decision_pairs(tokenizer, env, tasks: Sequence) -> list[DecisionPair]:
    """Every decision on the scripted expert's episode of each task, as two scored continuations.

    ``env``: a ``lopd.envs.registry.Environment`` with ``expert`` and ``decisions``. A turn's
    continuation is the expert's prefix (actions and observations before it) + one action; its
    mask marks the tokens from the first that the two continuations differ in to the action's end.
    """
    out = []
    for task in tasks:
        messages = env.make_env(task).initial_observation()
        ep = env.play(task, env.expert())
        acts, obs = ep["actions"], ep["observations"]
        for i in range(len(acts)):
            for kind, (right, wrong) in env.decisions(task, acts, obs, i).items():
                rows = [tokenize_episode(tokenizer, messages, [*acts[:i], a], obs[:i])[0] for a in (right, wrong)]
                start = first_difference(*rows)
                prompt_len = len(tokenize_episode(tokenizer, messages, [], [])[0])
                r, w = (Episode(task, messages, ids, suffix_mask(len(ids), start), prompt_len, 0.0) for ids in rows)
                out.append(DecisionPair(kind, r, w))
    return out


def episode_decision_tokens(tokenizer, env, episode) -> dict[str, list[int]]:
    """``{kind: 0/1 per token}``: the decision tokens of any episode (a rollout, a bank replay).

    Its actions are decoded from its action spans and replayed in a fresh episode of its task (for
    the observations the plan reads). At each turn whose action is one of a decision's two options,
    the tokens from the first that reaches past the options' common prefix to the action's end count.
    """
    spans = action_spans(episode.action_mask)
    ids = list(episode.token_ids)
    actions = [tokenizer.decode(ids[a:b], skip_special_tokens=True) for a, b in spans]
    sim, observations = env.make_env(episode.task), []
    for act in actions:
        result = sim.step(act.strip())
        observations.append(result.observation)
        if result.done:
            break
    out: dict[str, list[int]] = {}
    plain = [a.strip() for a in actions]
    for i, (a, b) in enumerate(spans[: len(observations)]):
        for kind, (right, wrong) in env.decisions(episode.task, plain, observations, i).items():
            if plain[i] not in (right, wrong):
                continue
            common = first_difference(right, wrong)  # characters the two options share
            lead = len(actions[i]) - len(actions[i].lstrip())
            first = next((k for k in range(b - a) if len(tokenizer.decode(ids[a : a + k + 1], skip_special_tokens=True)) - lead > common), b - a)
            mask = out.setdefault(kind, [0] * len(ids))
            mask[a + first : b] = [1] * (b - a - first)
    return out


def batch_decision_masks(tokenizer, env, episodes: Sequence, width: int, group: str | None = GROUP) -> dict[str, Tensor]:
    """``{kind: (B, T) bool}`` over a right-padded batch of ``width`` positions; rows outside ``group`` stay empty."""
    out: dict[str, Tensor] = {}
    for row, e in enumerate(episodes):
        if group is not None and env.group is not None and env.group(e.task) != group:
            continue
        for kind, mask in episode_decision_tokens(tokenizer, env, e).items():
            out.setdefault(kind, torch.zeros(len(episodes), width, dtype=torch.bool))[row, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    return out


# ----------------------------------------------------------------------------- scoring


def _chunks(rows: Sequence, n: int):
    return (rows[i : i + n] for i in range(0, len(rows), n))


@torch.no_grad()
def score_pairs(pairs: Sequence[DecisionPair], score, batch: int = 32) -> Tensor:
    """P(right) per pair ``(N,)``; ``score(rows) -> (len(rows),)`` is a model's log π of each row's masked tokens."""
    rows = [e for pr in pairs for e in (pr.right, pr.wrong)]
    logp = torch.cat([score(list(chunk)).float().cpu() for chunk in _chunks(rows, batch)]) if rows else torch.zeros(0)
    return p_right(logp[0::2], logp[1::2])


def student_scorer(model, pad_id: int):
    """log π_S of each row's masked tokens (the student reads the plain prompt)."""
    device = next(model.parameters()).device

    def score(rows):
        ids_BT, attn_BT, mask_BT = (t.to(device) for t in student_batch(rows, pad_id))
        return continuation_logp(token_logprobs(model, ids_BT, attn_BT, mask_BT)[1], mask_BT)

    return score


def teacher_scorer(backbone, tokenizer, texts: dict[str, str] | None = None, latents=None, n_latents: int = 0, placeholder: str = ""):
    """log π_T of each row's masked tokens: the frozen base reading ``texts[task_id]`` as text, or,
    with ``latents(rows) -> (B, n_latents, D)``, the latents in its placeholder slots."""
    device = next(backbone.parameters()).device

    def score(rows):
        ids_BT, _, mask_BT = (t.to(device) for t in student_batch(rows, tokenizer.pad_token_id))
        if latents is None:
            tb = text_teacher_batch(tokenizer, rows, [texts[e.task.task_id] for e in rows])
            lat_BLD = torch.zeros(len(rows), 0, backbone.config.hidden_size, device=device)
        else:
            tb, lat_BLD = teacher_batch(tokenizer, rows, n_latents, placeholder), latents(rows)
        return teacher_logprobs(backbone, tb.to(device), lat_BLD, ids_BT, mask_BT).token_logp_BT.sum(-1)

    return score


# ----------------------------------------------------------------------------- the loop's probe


class DecisionProbe:
    """What the distillation loop calls: ``at_eval(student)`` at each dev evaluation, ``loss_shares(trainer)`` per step.

    Keys: ``decision/<kind>/student``, ``decision/<kind>/teacher_text``, ``decision/<kind>/teacher_latent``
    (the same every evaluation: the teachers are fixed) and ``decision/<kind>/loss_share``.
    """

    def __init__(self, p, tokenizer, tasks: Sequence, teachers: dict[str, float]):
        self.p, self.tokenizer, self.env = p, tokenizer, get_environment(p)
        self.pairs = decision_pairs(tokenizer, self.env, tasks)
        self.kinds = [pr.kind for pr in self.pairs]
        self.teachers = teachers

    @classmethod
    def maybe(cls, p, tokenizer, trainer=None) -> "DecisionProbe | None":
        """The probe on the first ``distill.decision_tasks`` dev tasks of the group; None when off or unsupported."""
        from lopd.policy.engine import split_tasks

        env, n = get_environment(p), p.distill.decision_tasks
        if n == 0 or env.decisions is None or env.expert is None:
            return None
        tasks = [t for t in split_tasks(p, "dev") if env.group is None or env.group(t) == GROUP][:n]
        probe = cls(p, tokenizer, tasks, {})
        key = (p.digest(), tuple(t.task_id for t in tasks))
        if key not in _TEACHER_CACHE:
            # loading models may draw from the global RNGs: a measurement must leave the run's numbers (and a resume's) alone
            state, devices = random.getstate(), [torch.cuda.current_device()] if torch.cuda.is_available() else []
            with torch.random.fork_rng(devices=devices):
                _TEACHER_CACHE[key] = probe.teacher_scores(trainer)
            random.setstate(state)
        probe.teachers = _TEACHER_CACHE[key]
        return probe

    def at_eval(self, student) -> dict[str, float]:
        was = student.training
        student.eval()
        scores = by_kind(self.kinds, score_pairs(self.pairs, student_scorer(student, self.tokenizer.pad_token_id)))
        student.train(was)
        return {**{f"decision/{k}/student": v for k, v in scores.items()}, **self.teachers}

    def loss_shares(self, trainer, dp=None) -> dict[str, float]:
        """Each kind's share of the step's per-token loss mass (``trainer.token_loss``; none for a trainer without it)."""
        tl = getattr(trainer, "token_loss", None)
        if tl is None:
            return {}
        masks = batch_decision_masks(self.tokenizer, self.env, tl.episodes, tl.loss_BT.shape[1])
        mass_BT = tl.loss_BT.detach().float().abs().cpu() * tl.mask_BT.cpu()
        total = dp.sum(float(mass_BT.sum())) if dp else float(mass_BT.sum())
        out = {}
        for kind in dict.fromkeys(self.kinds):
            local = float((mass_BT * masks[kind]).sum()) if kind in masks else 0.0
            part = dp.sum(local) if dp else local
            out[f"decision/{kind}/loss_share"] = part / total if total > 0 else float("nan")
        return out

    def teacher_scores(self, trainer=None) -> dict[str, float]:
        """P(right) of the text and the latent teacher (φ₀), per kind; reuses the trainer's composer and embedder."""
        from lopd.latent.composer import Composer
        from lopd.memory.retrieval import INDEX_FILE, open_retriever
        from lopd.policy.modeling import load_policy

        p, out = self.p, {}
        if not (layout.index_dir(p) / INDEX_FILE).exists():
            log.info("decision probe: no retrieval index at %s: no teacher references", layout.index_dir(p))
            return out
        old = getattr(trainer, "retriever", None)
        retriever = open_retriever(p, old.embedder if old is not None else None)
        tasks = list({pr.right.task.task_id: pr.right.task for pr in self.pairs}.values())
        exps = {t.task_id: [h["lite_text"] for h in hits] for t, hits in zip(tasks, retriever.retrieve_batch(tasks, p.retrieval.n_ret))}
        composer = getattr(trainer, "composer", None)
        anchor = getattr(trainer, "anchor", None)
        if composer is None and (layout.composer_dir(p) / "composer.json").exists():
            backbone, _ = load_policy(layout.init_path(p), p.model.dtype)
            composer = Composer.load(backbone.eval(), self.tokenizer, layout.composer_dir(p)).eval()
        base = composer.backbone if composer is not None else getattr(trainer, "teacher", None)
        if base is None:
            base = load_policy(layout.init_path(p), p.model.dtype)[0].eval()
        text = {tid: "\n\n".join(e) for tid, e in exps.items()}
        scores = {"teacher_text": score_pairs(self.pairs, teacher_scorer(base, self.tokenizer, texts=text))}
        if composer is not None:
            encode = anchor.latents if anchor is not None else composer  # φ₀: the cold start, also when φ trains
            cache: dict[str, Tensor] = {}

            def latents(rows):  # once per task, however many of its rows a chunk holds
                todo = list(dict.fromkeys(e.task.task_id for e in rows if e.task.task_id not in cache))
                if todo:
                    by_id = {e.task.task_id: e.task for e in rows}
                    cache.update(zip(todo, encode([by_id[t].text for t in todo], [exps[t] for t in todo])))
                return torch.stack([cache[e.task.task_id] for e in rows])

            n_latents = p.retrieval.n_ret * p.composer.num_latents
            scores["teacher_latent"] = score_pairs(self.pairs, teacher_scorer(base, self.tokenizer, latents=latents, n_latents=n_latents,
                                                                              placeholder=p.composer.placeholder))
        for role, values in scores.items():
            out.update({f"decision/{k}/{role}": v for k, v in by_kind(self.kinds, values).items()})
        return out
