"""Building blocks shared by all ToolWorld families (apps).

A family defines its tools, its conventions, how goals and backends are sampled, the
goal-state checklist, the scripted expert's next step and the realistic mistakes a noisy
expert makes at that step. Backends are plain stateful objects whose tools are methods
named ``tool_<name>``.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from ..protocol import format_tool_call

ID_RE = re.compile(r"^[a-z]+_\d+$")
MONTHS = ["January", "February", "March", "April", "May", "June", "July",
          "August", "September", "October", "November", "December"]
FIRST_NAMES = ["Alice", "Bob", "Carol", "Dan", "Erin", "Frank", "Grace", "Hugo", "Ivy",
               "Jack", "Kate", "Liam", "Mia", "Noah", "Olga", "Paul", "Rosa", "Sam",
               "Tina", "Umar", "Vera", "Will", "Yara", "Zoe"]
LAST_NAMES = ["Ruiz", "Lee", "Kim", "Novak", "Smith", "Brown", "Costa", "Ito", "Weber",
              "Haas", "Okafor", "Singh", "Moreau", "Silva", "Berg", "Khan"]

# What the plan has observed so far: successful (tool_call, result) pairs, in order.
Done = list[tuple[dict, dict]]
# A planned step: (tool name, arguments) or the final answer text.
Step = tuple[str, dict] | str

_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "num": (int, float)}


class ToolError(Exception):
    """A tool refused the call; the message becomes the error observation."""


@dataclass(frozen=True)
class Tool:
    """A tool's name, typed parameters (``str``, ``int``, ``num`` or ``ids``) and one-line doc."""

    name: str
    params: dict[str, str]
    doc: str

    def signature(self) -> str:
        args = ", ".join(f"{k}: {v}" for k, v in self.params.items())
        return f"{self.name}({args}) - {self.doc}"

    def validate(self, args: dict[str, Any]) -> str | None:
        """An error message if ``args`` do not fit the parameters, else None."""
        missing = [k for k in self.params if k not in args]
        if missing:
            return f"missing argument {missing[0]}"
        extra = [k for k in args if k not in self.params]
        if extra:
            return f"unexpected argument {extra[0]}"
        for key, kind in self.params.items():
            value = args[key]
            if kind == "ids":
                ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            else:
                ok = isinstance(value, _TYPES[kind]) and not isinstance(value, bool)
            if not ok:
                return f"{key} must be {'a list of ids' if kind == 'ids' else kind}"
        return None


class Backend:
    """Mutable app state. Successful calls are logged; the final answer is stored."""

    def __init__(self) -> None:
        self.log: list[tuple[str, dict]] = []
        self.final_answer: str | None = None

    def call(self, name: str, args: dict[str, Any]) -> dict:
        result = getattr(self, f"tool_{name}")(**args)
        self.log.append((name, args))
        return result

    def called(self, name: str) -> list[dict]:
        """Arguments of every successful call of ``name``."""
        return [args for tool, args in self.log if tool == name]


def new_id(rng: random.Random, prefix: str, taken: set[str]) -> str:
    """A fresh random id like ``acc_482``.

    Three digits keep the ids a small model must copy short; lookups list the distinguishing
    attribute (type, name) *before* each id, so a causal model reading an id already knows
    which entity it names.
    """
    while True:
        ident = f"{prefix}_{rng.randint(100, 999)}"
        if ident not in taken:
            taken.add(ident)
            return ident


def results(done: Done, name: str) -> list[tuple[dict, dict]]:
    """``(arguments, result)`` of every successful call of ``name``."""
    return [(call["arguments"], res) for call, res in done if call["name"] == name]


def answer_has(answer: str | None, token: str) -> bool:
    """Whether the final answer contains ``token`` as a whole word/number."""
    return answer is not None and re.search(rf"(?<![\w.]){re.escape(token)}(?![\w])", answer) is not None


def typo_id(ident: str, rng: random.Random) -> str:
    """The id with one digit changed (almost surely unknown to the backend)."""
    head, digits = ident.rsplit("_", 1)
    i = rng.randrange(len(digits))
    new = str((int(digits[i]) + rng.randint(1, 9)) % 10)
    return f"{head}_{digits[:i]}{new}{digits[i + 1:]}"


def call(tool: str, /, **arguments: Any) -> str:
    """Shorthand for ``format_tool_call``."""
    return format_tool_call(tool, arguments)


class Family(ABC):
    """One app: tools, conventions, task sampling, checks, expert plan and mistakes."""

    name: str
    prefix: str
    tools: tuple[Tool, ...]
    rules: str

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    @abstractmethod
    def sample_goal(self, rng: random.Random) -> tuple[str, dict]:
        """A task text and its JSON-serialisable goal."""

    @abstractmethod
    def make_backend(self, goal: dict, rng: random.Random) -> Backend:
        """A fresh backend that contains the goal's entities plus distractors."""

    @abstractmethod
    def checks(self, backend: Backend, goal: dict) -> dict[str, bool]:
        """The goal-state checklist (3-5 booleans)."""

    @abstractmethod
    def next_step(self, goal: dict, done: Done) -> Step:
        """The expert's next step, derived only from the goal and what was observed."""

    @abstractmethod
    def mistakes(self, goal: dict, done: Done, step: Step, rng: random.Random) -> list[str]:
        """Family-specific wrong actions a careless agent might take instead of ``step``."""
