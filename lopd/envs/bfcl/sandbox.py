"""Safe execution of tool calls against BFCL's backend instances: nothing is ever passed to ``eval``/``exec``.

A call reaches a backend only if

- it parses: JSON inside ``<tool_call>…</tool_call>`` (what the policy writes), or a single Python call
  expression checked with ``ast`` (BFCL's ground truth, e.g. ``mv(source='a', destination='b')``);
- its name is a plain identifier, not private or dunder, listed in the task's function docs *now*
  (``miss_func`` holds some back) and a public method of one of the task's involved instances;
- every argument is a literal (str, int, float, bool, None, and lists / tuples / dicts of them), keyword
  names are plain identifiers, and the whole call is at most :data:`MAX_CALL_CHARS` characters;
- the arguments bind to the method's signature.

Anything else is rejected with an ``Error: …`` observation and the episode goes on. An exception
raised inside a backend method becomes BFCL's own ``Error during execution: …`` result.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from typing import Any, Iterable

from lopd.envs.protocol import CALL_RE, OPEN

MAX_CALL_CHARS = 20_000  # one call's JSON (or source); BFCL's longest ground-truth call is far shorter
MAX_DEPTH = 8  # nesting of literal containers
BACKEND_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code."


class Rejected(ValueError):
    """A call that is never dispatched; its message is the error observation."""


def _check_name(name: Any, what: str = "function name") -> str:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise Rejected(f"{what} {str(name)[:60]!r} is not a public identifier")
    return name


def check_literal(value: Any, depth: int = 0) -> None:
    """Raise :class:`Rejected` unless ``value`` is built only of JSON-like literals."""
    if depth > MAX_DEPTH:
        raise Rejected("argument nested too deeply")
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            check_literal(v, depth + 1)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)):
                raise Rejected("dictionary keys must be literals")
            check_literal(v, depth + 1)
        return
    raise Rejected(f"argument of type {type(value).__name__} is not a literal")


def parse_tool_calls(text: str) -> tuple[list[tuple[str, tuple, dict]], list[str]]:
    """Every ``<tool_call>`` of an assistant message → ``([(name, (), kwargs)], errors)`` (JSON, keyword arguments)."""
    calls, errors = [], []
    if OPEN in text and not CALL_RE.search(text):
        return [], ["malformed tool call: missing </tool_call>"]
    for body in CALL_RE.findall(text):
        try:
            if len(body) > MAX_CALL_CHARS:
                raise Rejected(f"tool call of {len(body)} characters (limit {MAX_CALL_CHARS})")
            try:
                call = json.loads(body)
            except json.JSONDecodeError:
                raise Rejected("malformed JSON in tool call") from None
            if not isinstance(call, dict):
                raise Rejected("a tool call is a JSON object with 'name' and 'arguments'")
            args = call.get("arguments", {})
            if not isinstance(args, dict):
                raise Rejected("'arguments' must be a JSON object")
            for k in args:
                _check_name(k, "argument name")
            calls.append((_check_name(call.get("name")), (), args))
        except Rejected as e:
            errors.append(str(e))
    return calls, errors


def parse_python_call(source: str) -> tuple[str, tuple, dict]:
    """One BFCL-style call ``f(a, b=1)`` → ``(name, args, kwargs)``; literals only, checked with ``ast``."""
    if len(source) > MAX_CALL_CHARS:
        raise Rejected(f"call of {len(source)} characters (limit {MAX_CALL_CHARS})")
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except SyntaxError:
        raise Rejected("not a call expression") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise Rejected("only a plain call name(...) is allowed (no attributes, no nested calls)")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        if any(k.arg is None for k in node.keywords):
            raise Rejected("**kwargs are not allowed")
        kwargs = {_check_name(k.arg, "argument name"): ast.literal_eval(k.value) for k in node.keywords}
    except ValueError:
        raise Rejected("arguments must be literals") from None
    return _check_name(node.func.id), args, kwargs


def format_result(result: Any) -> str:
    """A backend's return value as BFCL's executor formats it (str as is, dict as JSON, else ``str``)."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class Sandbox:
    """The task's backend instances, built from its ``initial_config``, and the only door into them."""

    def __init__(self, involved_classes: Iterable[str], initial_config: dict, long_context: bool = False):
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        self.instances: dict[str, object] = {}
        self.methods: dict[str, tuple[str, object]] = {}  # method name -> (class name, bound method)
        for cls_name in involved_classes:
            module = CLASS_FILE_PATH_MAPPING[cls_name]
            if not module.startswith(BACKEND_PREFIX):
                raise ValueError(f"backend {cls_name} outside BFCL's func_source_code: {module}")
            instance = getattr(importlib.import_module(module), cls_name)()
            if cls_name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(initial_config.get(cls_name, {})), long_context=long_context)
            self.instances[cls_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = (cls_name, method)

    def call(self, name: str, args: tuple, kwargs: dict, allowed: set[str] | None = None) -> str:
        """Dispatch one parsed call; a rejection raises :class:`Rejected`, a backend error is BFCL's error string."""
        _check_name(name)
        if allowed is not None and name not in allowed:
            raise Rejected(f"{name} is not one of this task's functions")
        if name not in self.methods:
            raise Rejected(f"{name} is not a method of this task's involved classes ({', '.join(self.instances)})")
        for k in kwargs:
            _check_name(k, "argument name")
        check_literal(list(args))
        check_literal(kwargs)
        if len(repr((args, kwargs))) > MAX_CALL_CHARS:
            raise Rejected(f"arguments over {MAX_CALL_CHARS} characters")
        method = self.methods[name][1]
        try:
            inspect.signature(method).bind(*args, **kwargs)
        except TypeError as e:
            raise Rejected(f"{name}: {e}") from None
        try:
            return format_result(method(*copy.deepcopy(args), **copy.deepcopy(kwargs)))
        except Exception as e:  # a backend's own failure: BFCL's executor reports it the same way
            return f"Error during execution: {e}"

    def keywords(self, name: str, args: tuple, kwargs: dict) -> dict:
        """Positional arguments of a call named by keyword (how a JSON tool call must pass them)."""
        bound = inspect.signature(self.methods[name][1]).bind(*args, **kwargs)
        return dict(bound.arguments)
