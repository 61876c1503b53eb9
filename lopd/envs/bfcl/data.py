"""BFCL v4 multi-turn tasks, ground truth and function docs, read from the installed ``bfcl-eval`` package."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

# Our benchmark name -> BFCL's test category.
CATEGORIES = {
    "bfcl_multi_turn_base": "multi_turn_base",
    "bfcl_multi_turn_long_context": "multi_turn_long_context",
    "bfcl_multi_turn_miss_func": "multi_turn_miss_func",
    "bfcl_multi_turn_miss_param": "multi_turn_miss_param",
}
VERSION_PREFIX = "BFCL_v4"


class BFCLNotInstalled(RuntimeError):
    pass


def _data_dir():
    try:
        return resources.files("bfcl_eval") / "data"
    except ModuleNotFoundError:
        raise BFCLNotInstalled("bfcl-eval is not installed: `make install` adds it (pip install --no-deps bfcl-eval==2026.3.23)") from None


def _read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _literal(value):
    """Some fields of the data files hold Python literals as strings; parse them without ``eval``."""
    return ast.literal_eval(value) if isinstance(value, str) else value


@dataclass(frozen=True)
class BFCLTask:
    """One multi-turn entry: user turns, backends to instantiate, ground truth per turn."""

    task_id: str
    category: str
    turns: list[list[dict]]  # per user turn, its messages ([] = the turn where held-out functions arrive)
    initial_config: dict
    involved_classes: list[str]
    ground_truth: list[list[str]]  # per turn, BFCL's python-style calls
    missed_function: dict[int, list[str]] = field(default_factory=dict)  # turn -> names held out until then
    family: str = "bfcl"
    split: str = "test"
    app: str = "bfcl"

    @property
    def text(self) -> str:
        """The first user message (what retrieval and logs show)."""
        return next((m["content"] for m in self.turns[0] if m["role"] == "user"), "")


@cache
def function_docs(class_name: str) -> tuple[dict, ...]:
    """BFCL's function docs of one backend class (``data/multi_turn_func_doc``)."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    return tuple(_read_jsonl(_data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


def load_tasks(benchmark: str, n: int | None = None) -> list[BFCLTask]:
    """The first ``n`` entries of a category (``benchmark`` is a key of :data:`CATEGORIES` or BFCL's own name)."""
    category = CATEGORIES.get(benchmark, benchmark)
    if category not in CATEGORIES.values():
        raise ValueError(f"unknown BFCL category {benchmark!r} (known: {', '.join(CATEGORIES)})")
    d = _data_dir()
    entries = _read_jsonl(d / f"{VERSION_PREFIX}_{category}.json")
    truth = {e["id"]: e["ground_truth"] for e in _read_jsonl(d / "possible_answer" / f"{VERSION_PREFIX}_{category}.json")}
    tasks = []
    for e in entries[: n or len(entries)]:
        missed = {int(k): list(v) for k, v in _literal(e.get("missed_function", {})).items()}
        tasks.append(BFCLTask(task_id=e["id"], category=category, turns=_literal(e["question"]),
                              initial_config=_literal(e.get("initial_config", {})), involved_classes=list(_literal(e["involved_classes"])),
                              ground_truth=truth[e["id"]], missed_function=missed))
    return tasks
