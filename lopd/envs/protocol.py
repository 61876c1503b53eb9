"""The tool-call protocol shared by the environments and their experts (Qwen3/Hermes style): ToolWorld and BFCL.

A turn is either exactly one ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
or plain text, which is the final answer. Tool results and errors are compact JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL_RE = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The one canonical rendering of a tool call (experts and tests use it)."""
    body = json.dumps({"name": name, "arguments": arguments}, separators=(", ", ": "))
    return f"{OPEN}{body}{CLOSE}"


def parse_action(text: str) -> tuple[dict | None, str | None]:
    """Parse an assistant turn into ``(tool_call, error)``.

    Text without ``<tool_call>`` is a final answer: ``(None, None)``. A well-formed call
    gives ``({"name": str, "arguments": dict}, None)``; anything else ``(None, message)``.
    """
    if OPEN not in text:
        return None, None
    bodies = CALL_RE.findall(text)
    if not bodies:
        return None, "malformed tool call: missing </tool_call>"
    if len(bodies) > 1 or text.count(OPEN) > 1:
        return None, "exactly one tool call per turn"
    try:
        call = json.loads(bodies[0])
    except json.JSONDecodeError:
        return None, "malformed JSON in tool call"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None, "tool call needs a string 'name'"
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return None, "'arguments' must be an object"
    return {"name": call["name"], "arguments": arguments}, None


def dump(obj: Any) -> str:
    """Compact JSON for observations."""
    return json.dumps(obj, separators=(",", ":"))


def error_observation(message: str) -> str:
    """The observation for a failed tool call."""
    return dump({"error": message})


def load_observation(text: str | None) -> dict | None:
    """The JSON object in an observation, or None if it is absent, not JSON or an error."""
    if text is None:
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or "error" in obj:
        return None
    return obj
