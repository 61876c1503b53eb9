"""What each action token of an episode is: copied from context, set by the app's conventions, or other.

Privilege is measured per kind (``lopd.stages.privilege``): experiences can only help where the base is
unsure and the experience knows better, which in ToolWorld is the app's conventions.

- **convention**: an action token from the first character at which the scripted plan under
  one flipped convention would write something else (e.g. ``00}}`` after a dollar amount in a
  cents app, or a whole ``verify_payee`` call that an app without checks does not want). Only
  actions that follow the plan of the app's real conventions are marked. The environment says
  where (``Environment.convention_start``); one without it has no convention tokens.
- **copied**: the other tokens of a tool call's argument values (names, ids, numbers taken from
  the task or a tool result: :func:`copy_spans`).
- **other**: the rest (format, tool names, the end-of-turn token).
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

from lopd.policy.probe import action_spans

KINDS = ("copied", "convention", "other")

# A JSON argument value inside a tool call's "arguments" object: a string or a number.
_ARG_VALUE = re.compile(r'(?<=": )("(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?)')


def copy_spans(action: str) -> list[tuple[int, int]]:
    """Character spans of what an action copies from its context: the tool call's argument
    values (names, ids, amounts, dates; without their quotes), or the whole text of a final answer."""
    head = action.find('"arguments"')
    if "<tool_call>" not in action:
        return [(0, len(action))]
    if head < 0:
        return []
    return [(a + 1, b - 1) if action[a] == '"' else (a, b) for a, b in (m.span() for m in _ARG_VALUE.finditer(action, head))]


def action_token_kinds(tokenizer, task, token_ids: Sequence[int], action_mask: Sequence[int],
                       actions: Sequence[str], observations: Sequence[str | None],
                       convention_start: Callable | None = None) -> list[str | None]:
    """One kind per token of a tokenised episode (``None`` off the action mask).

    ``actions`` / ``observations``: the episode's texts, in order (as in a ``Trajectory``). Token
    offsets come from decoding the episode's own ids, so sampled tokenisations work too.
    ``convention_start``: the environment's (``Environment.convention_start``); None = no convention tokens.
    """
    kinds: list[str | None] = [None] * len(token_ids)
    spans = action_spans(action_mask)
    if len(spans) != len(actions):
        raise ValueError(f"{len(actions)} actions but {len(spans)} action segments in the episode's mask")
    for i, (start, end) in enumerate(spans):
        ids = list(token_ids[start:end])
        ends = [len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) for k in range(len(ids))]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        lead = len(text) - len(text.lstrip())
        conv = convention_start(task, actions, observations, i) if convention_start else None
        copies = copy_spans(text.strip())
        for k in range(len(ids)):
            a, b = (ends[k - 1] if k else 0) - lead, ends[k] - lead
            if a == b:  # the end-of-turn token and other text-less tokens
                kinds[start + k] = "other"
            elif conv is not None and b > conv:
                kinds[start + k] = "convention"
            elif any(a < e and b > s for s, e in copies):
                kinds[start + k] = "copied"
            else:
                kinds[start + k] = "other"
    return kinds
