"""Building blocks shared by all ToolWorld families: tools, the app backend and the family template.

Every family follows one plan with four tools, and each *app* of a family (Northwind Bank,
Bluefin Bank, ...) has its own hidden conventions about that plan:

1. **lookup** an entity named in the task (one result: its id, sometimes a price);
2. **prereq**: some apps insist on a check before the main call (``prereq: required``); the
   main call then fails with an error message until it is done. The other apps have no such
   check, and calling it gets an error message too. Either way a retry fixes it;
3. **main**: the call that does the task. One of its arguments has an app-specific
   **format** (cents or dollars, °C or °F, 12h or 24h). A wrong format is accepted silently
   and only costs the ``value`` checklist item;
4. **commit**: some apps stage the main call until it is committed (``commit: required``).
   Forgetting it is silent and costs the ``committed`` item. In the other apps the main call
   takes effect at once, and a commit call submits it a second time (the endpoint is not
   idempotent): silent too, it costs the ``single`` item. Neither way can an agent play safe.

The checklist has four items (``entity``, ``value``, ``committed``, ``single``), so with the
spec's success threshold of 0.8 an episode succeeds only when all four hold. Backends are
plain stateful objects; each family only says how its goals, texts and arguments look.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from ...protocol import format_tool_call

ID_RE = re.compile(r"^[a-z]+_\d+$")
ID_RANGE = (10, 59)  # two digits: ids stay short, and the embedded tokenizer keeps each one whole
FIRST_NAMES = ("Alice", "Bob", "Carol", "Dan", "Erin", "Frank", "Grace", "Hugo", "Ivy", "Jack", "Kate", "Liam",
               "Mia", "Noah", "Olga", "Paul", "Rosa", "Sam", "Tina", "Umar", "Vera", "Will", "Yara", "Zoe")
ROLES = ("lookup", "prereq", "main", "commit")
CONVENTIONS = ("format", "prereq", "commit")  # every app fixes one option of each

# What the plan has observed so far: successful (tool_call, result) pairs, in order.
Done = list[tuple[dict, dict]]
# A planned step: (tool name, arguments) or the final answer text.
Step = tuple[str, dict] | str

_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "num": (int, float)}


class ToolError(Exception):
    """A tool refused the call; the message becomes the error observation."""


@dataclass(frozen=True)
class Tool:
    """A tool's name, typed parameters (``str``, ``int`` or ``num``) and role in the family's plan."""

    name: str
    params: dict[str, str]
    role: str

    def signature(self) -> str:
        return f"{self.name}({', '.join(self.params)})"

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
            if not isinstance(value, _TYPES[kind]) or isinstance(value, bool):
                return f"{key} must be {kind}"
        return None


def new_id(rng: random.Random, prefix: str, taken: set[str]) -> str:
    """A fresh random id like ``py_37``: two digits, so ids stay short to copy."""
    while True:
        ident = f"{prefix}_{rng.randint(*ID_RANGE)}"
        if ident not in taken:
            taken.add(ident)
            return ident


def typo_id(ident: str, rng: random.Random) -> str:
    """The id with its number changed (unknown to a backend that never issued it)."""
    head, digits = ident.rsplit("_", 1)
    lo, hi = ID_RANGE
    return f"{head}_{lo + (int(digits) - lo + rng.randint(1, hi - lo)) % (hi - lo + 1)}"


def call(tool: str, /, **arguments: Any) -> str:
    """Shorthand for ``format_tool_call``."""
    return format_tool_call(tool, arguments)


def results(done: Done, name: str) -> list[tuple[dict, dict]]:
    """``(arguments, result)`` of every successful call of ``name``."""
    return [(c["arguments"], res) for c, res in done if c["name"] == name]


class Backend:
    """An app's state: entities ``{id: key}``, the prerequisite checks done, and the records the
    main call created ``{id: {"args", "committed"}}``. Successful calls are logged."""

    def __init__(self, family: "Family", conventions: dict[str, str], entities: dict[str, str],
                 extras: dict[str, dict], rng: random.Random) -> None:
        self.family, self.conventions = family, conventions
        self.entities, self.extras = entities, extras
        self.checked: set[str] = set()
        self.records: dict[str, dict] = {}
        self.log: list[tuple[str, dict]] = []
        self.final_answer: str | None = None
        self._rng, self._ids = rng, set(entities)

    def call(self, name: str, args: dict[str, Any]) -> dict:
        role = self.family.tool(name).role
        result = getattr(self, f"_{role}")(args)
        self.log.append((name, args))
        return result

    def _entity(self, ident: str) -> str:
        if ident not in self.entities:
            raise ToolError(f"unknown {self.family.entity_noun} id {ident}")
        return ident

    def _lookup(self, args: dict) -> dict:
        key = self.family.lookup_key(args)
        found = [i for i, k in self.entities.items() if k.lower() == key.strip().lower()]
        if not found:
            raise ToolError(f"no {self.family.entity_noun} named {key}")
        return {"id": found[0], **self.extras.get(found[0], {})}

    def _prereq(self, args: dict) -> dict:
        if self.conventions["prereq"] != "required":
            raise ToolError(f"{self.family.role('prereq').name} is not available here")
        ident = self._entity(args[self.family.id_arg])
        self.checked.add(ident)
        return {"id": ident, self.family.prereq_word: True}

    def _main(self, args: dict) -> dict:
        ident = self._entity(args[self.family.id_arg])
        if self.conventions["prereq"] == "required" and ident not in self.checked:
            raise ToolError(self.family.prereq_error)
        rid = new_id(self._rng, self.family.record_prefix, self._ids)
        staged = self.conventions["commit"] == "required"
        self.records[rid] = {"args": dict(args), "committed": not staged}
        return {"id": rid}  # no status: whether it waits for a commit is the app's hidden convention

    def _commit(self, args: dict) -> dict:
        rid = args[self.family.record_arg]
        if rid not in self.records:
            raise ToolError(f"unknown {self.family.record_arg.removesuffix('_id')} id {rid}")
        record = self.records[rid]
        if record["committed"] and self.conventions["commit"] == "required":
            raise ToolError(f"{rid} is already done")
        if record["committed"]:  # an app without a commit step takes it as a second submission
            self.records[new_id(self._rng, self.family.record_prefix, self._ids)] = dict(record)
        record["committed"] = True
        return {"id": rid, "status": "done"}


class Family(ABC):
    """One family of apps: tools (one per role), apps, the options of each convention, and how
    goals, task texts and the main call's arguments look."""

    name: str  # e.g. "banking"
    prefix: str  # task-id prefix
    apps: tuple[str, ...]  # app names, one word each
    formats: tuple[str, str]  # the two options of the ``format`` convention
    literal_format: str  # the option the task text (or the lookup) already states the value in
    tools: tuple[Tool, ...]  # lookup, prereq, main, commit (in that order)
    entity_noun: str  # "payee"
    entity_prefix: str  # id prefix of looked-up entities
    record_prefix: str  # id prefix of what the main call creates
    prereq_word: str  # key of the prerequisite's result, e.g. "verified"
    prereq_error: str  # the main call's error while the prerequisite is missing
    words: tuple[str, ...] = ()  # entity words of this family's texts (names, rooms, products...)

    @property
    def options(self) -> dict[str, tuple[str, str]]:
        return {"format": self.formats, "prereq": ("required", "none"), "commit": ("required", "auto")}

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def role(self, role: str) -> Tool:
        return next(t for t in self.tools if t.role == role)

    @property
    def id_arg(self) -> str:
        """The argument of the prereq and main calls that carries the looked-up id."""
        return next(iter(self.role("prereq").params))

    @property
    def record_arg(self) -> str:
        return next(iter(self.role("commit").params))

    # ------------------------------------------------------------------ what a family defines

    @abstractmethod
    def sample_goal(self, rng: random.Random, app: str) -> tuple[str, dict]:
        """A task text naming ``app`` and its JSON-serialisable goal (``goal["app"] == app``)."""

    @abstractmethod
    def entity_key(self, goal: dict) -> str:
        """The name the lookup finds the goal's entity by."""

    @abstractmethod
    def lookup_args(self, goal: dict) -> dict:
        """Arguments of the lookup call for the goal's entity."""

    def lookup_key(self, args: dict) -> str:
        return str(next(iter(args.values())))

    @abstractmethod
    def main_args(self, goal: dict, fmt: str, ident: str, found: dict) -> dict:
        """Arguments of the main call in format ``fmt``; ``found`` is the lookup's result."""

    def extras(self, rng: random.Random) -> dict:
        """Extra fields the lookup returns for an entity (e.g. a price)."""
        return {}

    def distractors(self, goal: dict, rng: random.Random) -> list[str]:
        """Keys of other entities in the backend (never the goal's)."""
        pool = [w for w in self.words if w != self.entity_key(goal)]
        return rng.sample(pool, 2)

    # ------------------------------------------------------------------ shared machinery

    def make_backend(self, goal: dict, conventions: dict[str, str], rng: random.Random) -> Backend:
        keys = [self.entity_key(goal), *self.distractors(goal, rng)]
        rng.shuffle(keys)
        taken: set[str] = set()
        entities = {new_id(rng, self.entity_prefix, taken): k for k in keys}
        return Backend(self, conventions, entities, {i: self.extras(rng) for i in entities}, rng)

    def checks(self, backend: Backend, goal: dict) -> dict[str, bool]:
        """The four checklist items: the right entity, the value in the app's format, committed, one record."""
        target = next(i for i, k in backend.entities.items() if k == self.entity_key(goal))
        last = list(backend.records.values())[-1] if backend.records else None
        if last is None:
            return {"entity": False, "value": False, "committed": False, "single": False}
        want = self.main_args(goal, backend.conventions["format"], target, {"id": target, **backend.extras[target]})
        return {
            "entity": last["args"][self.id_arg] == target,
            "value": {k: v for k, v in last["args"].items() if k != self.id_arg} == {k: v for k, v in want.items() if k != self.id_arg},
            "committed": last["committed"],
            "single": len(backend.records) == 1,
        }

    def known(self, goal: dict, done: Done) -> dict | None:
        """The lookup result for the goal's entity, if one was observed."""
        lookup = self.role("lookup").name
        key = self.entity_key(goal).lower()
        return next((res for args, res in results(done, lookup) if self.lookup_key(args).strip().lower() == key), None)

    def next_step(self, goal: dict, conventions: dict[str, str], done: Done) -> Step:
        """The plan under ``conventions``, from the goal and what was observed (recovers from errors).

        It never reads the main call's status: planned under wrong conventions (the noisy
        expert's misconceptions), it acts on the belief, not on the app's answer.
        """
        found = self.known(goal, done)
        if found is None:
            return self.role("lookup").name, self.lookup_args(goal)
        ident = found["id"]
        made = [res["id"] for args, res in results(done, self.role("main").name)]
        if not made:  # a main call that went through is taken as the one intended
            checked = any(a[self.id_arg] == ident for a, _ in results(done, self.role("prereq").name))
            if conventions["prereq"] == "required" and not checked:
                return self.role("prereq").name, {self.id_arg: ident}
            return self.role("main").name, self.main_args(goal, conventions["format"], ident, found)
        committed = any(a[self.record_arg] == made[-1] for a, _ in results(done, self.role("commit").name))
        if conventions["commit"] == "required" and not committed:
            return self.role("commit").name, {self.record_arg: made[-1]}
        return "Done."

    def mistakes(self, goal: dict, conventions: dict[str, str], done: Done, step: Step, rng: random.Random) -> list[str]:
        """Wrong actions instead of ``step``: the plan under one wrong convention (a misconception
        about this app), a misspelt lookup, or a repeated main call."""
        out = []
        for key, (a, b) in self.options.items():
            believed = {**conventions, key: b if conventions[key] == a else a}
            wrong = self.next_step(goal, believed, done)
            if wrong != step:
                out.append(wrong if isinstance(wrong, str) else call(wrong[0], **wrong[1]))
        if isinstance(step, tuple) and step[0] == self.role("lookup").name:
            arg, value = next(iter(step[1].items()))
            out.append(call(step[0], **{arg: str(value)[:-1]}))
        if isinstance(step, tuple) and step[0] == self.role("commit").name:
            again = next(a for a, _ in reversed(results(done, self.role("main").name)))
            out.append(call(self.role("main").name, **again))
        return out
