"""The environment registry: ``env.name`` picks what every stage plays.

An :class:`Environment` is what the stages need from a domain and nothing more: its tasks per
split, a fresh episode per task, the success threshold, the observation-lite text of a trajectory
(what the bank keeps and the teacher reads), and optionally a grouping for reports, a scripted
expert (the bank's top-up, the expert checks) and hooks only ToolWorld has (the embedded base's
pre-training corpus, the chance row, convention tokens, the decisions its conventions set).

``env.name`` is a built-in (:data:`BUILTINS`, imported only when named) or a user's own as
``package.module:factory``; a factory takes the resolved params and returns an ``Environment``.
docs/environments.md shows how to add one; ``examples/echo_env`` is a worked example.

A task is anything with ``task_id`` (unique across splits) and ``text`` (what the agent reads, and
what retrieval embeds); ``family`` and ``app`` are read when present (per-family reports; the
retrieval scope ``retrieval.scope = app``). This module imports no environment and no other layer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from lopd.envs.episode import run_episode

SPLITS = ("train", "dev", "test")
# name -> "module:factory", imported only when chosen (a concrete environment is never imported elsewhere).
BUILTINS = {
    "toolworld": "lopd.envs.toolworld.environment:make",
    "code": "lopd.envs.code.environment:make",
    "bfcl_multi_turn": "lopd.envs.bfcl.environment:make",
}

Demo = tuple[list[dict], list[str], list[str | None]]  # (initial messages, actions, observations)


class EnvironmentNameError(ValueError):
    """``env.name`` names nothing usable; the message names the field and the fix."""


class Episode(Protocol):
    """One play of a task (``make_env(task)``): the messages the agent starts from, then one step per action.

    ``step`` returns an object with ``observation`` (str or None), ``reward`` (float in [0, 1]),
    ``done`` and ``info`` (``short``: the result in a few words, for observation-lite; on the last
    step ``success``; optionally ``checks``: item -> passed).
    """

    def initial_observation(self) -> list[dict]: ...

    def step(self, action: str) -> Any: ...


@dataclass(frozen=True)
class Pretraining:
    """How the embedded base is pre-trained on this environment (``bootstrap.source = train``).

    ``demos(params, frame)``: ``(demos, plain_demos, info)``; ``frame(demo, lites)`` puts
    observation-lite experiences in the teacher's framing sentence. ``words``: strings the
    embedded tokenizer keeps whole. ``finish(model, tokenizer, examples)``: run after training.
    """

    demos: Callable[[Any, Callable[[Demo, list[str]], Demo]], tuple[list[Demo], list[Demo], dict]]
    words: Callable[[], Sequence[str]] = tuple
    finish: Callable[[Any, Any, list], Any] | None = None


@dataclass(frozen=True)
class Environment:
    """What the stages need from a domain (see the module docstring)."""

    name: str
    tasks: Callable[[str, int], Sequence]  # (split, n) -> the split's first n tasks (fewer when the split is smaller)
    make_env: Callable[[Any], Episode]  # task -> a fresh episode
    lite_text: Callable[[str, list[str], list[str]], str]  # (task text, actions, short results) -> observation-lite
    success_threshold: float  # success = reward >= this and the agent finished
    groups: Mapping[str, str] = field(default_factory=dict)  # report group -> its label ({} = no grouping)
    group: Callable[[Any], str] | None = None  # task -> one of ``groups``
    expert: Callable[[], Any] | None = None  # a fresh scripted agent: ``act(task, history) -> action``
    pretraining: Pretraining | None = None  # None: pre-train on the expert's episodes of train tasks
    chance: Callable[[Sequence, Mapping[str, str]], dict] | None = None  # (tasks, task id -> group) -> the chance row
    convention_start: Callable[[Any, Sequence[str], Sequence[str | None], int], int | None] | None = None  # token kinds
    fingerprint: str | None = None  # short hash of the world's hidden rules: a base pre-trained in another world does not match it
    # (task, actions, observations, turn) -> {kind: (right action, wrong action)}: the decisions a hidden convention sets
    # at that turn (lopd.train.decisions); None = no decision probe
    decisions: Callable[[Any, Sequence[str], Sequence[str | None], int], dict[str, tuple[str, str]]] | None = None

    def play(self, task, agent) -> dict:
        """``agent`` through one episode of ``task``: actions, observations, shorts, reward, success."""
        return run_episode(self.make_env(task), agent, task)

    def group_of(self, tasks: Sequence) -> dict[str, str]:
        """task id -> group ({} when the environment has no grouping)."""
        return {t.task_id: self.group(t) for t in tasks} if self.group else {}


def resolve(name: str) -> Callable[[Any], Environment]:
    """The factory ``env.name`` names (a built-in, or ``package.module:factory``), imported now."""
    target = BUILTINS.get(name, name)
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise EnvironmentNameError(f"env.name = {name!r} is not an environment: use one of {sorted(BUILTINS)} "
                                "or your own as package.module:factory (docs/environments.md)")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise EnvironmentNameError(f"env.name = {name!r}: cannot import {module!r} ({e}); install the package or put it "
                                "on PYTHONPATH, or fix the module path") from None
    except AttributeError:
        raise EnvironmentNameError(f"env.name = {name!r}: module {module!r} has no {attr!r}; name the function that "
                                "returns the Environment (package.module:factory)") from None
    if not callable(factory):
        raise EnvironmentNameError(f"env.name = {name!r}: {target} is not callable; it must be a function params -> Environment")
    return factory


def check_name(name: str) -> str:
    """``name`` when it can be resolved (built-ins are only looked up, not imported), else a clear error."""
    if name not in BUILTINS:
        resolve(name)
    return name


_CACHE: dict[tuple[str, str], Environment] = {}


def get_environment(p, name: str | None = None) -> Environment:
    """The environment of params ``p`` (``env.name``, or ``name``), built once per (name, params)."""
    name = name or p.env.name
    key = (name, p.digest())
    if key not in _CACHE:
        env = resolve(name)(p)
        if not isinstance(env, Environment):
            raise EnvironmentNameError(f"env.name = {name!r}: the factory returned {type(env).__name__}, not "
                                    "lopd.envs.registry.Environment")
        _CACHE[key] = env
    return _CACHE[key]
