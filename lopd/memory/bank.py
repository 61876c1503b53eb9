"""The experience bank on disk: observation-lite successes in append-only round files.

``data/bank/round-NNN.parquet`` holds the successes added in round NNN (0 = the base policy's,
written by ``collect``; later distillation rounds append). One row = one successful trajectory,
columns :data:`BANK_COLUMNS`: ``bank_id, task_id, family, app`` (the app the task ran in, which
scoped retrieval matches), ``task_text, steps_json`` (a JSON list
of ``{"action", "result"}`` with the short result), ``lite_text`` (``Task: ...`` then one
``tool {args} -> short result`` line per step), ``reward, success, source_round, model``
(which policy or checkpoint produced it).

Files are never rewritten: an append writes a *new* round file, published with a hard link
that fails if the name exists, so a reader (or a crash) sees either the old bank or the old
bank plus the complete new file. Appends drop entries already in the bank (same task and
same steps, or same ``bank_id``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

import pandas as pd

from lopd.ops.validation import DataValidationError

# The columns of a bank round file (what `collect` writes and the distillers append).
BANK_COLUMNS = ("bank_id", "task_id", "family", "app", "task_text", "steps_json", "lite_text", "reward", "success", "source_round", "model")

log = logging.getLogger(__name__)

ROUND_GLOB = "round-*.parquet"
EXPERT_MODEL = "scripted-expert"  # ``model`` of top-up entries, so they are never mistaken for the policy's


class BankError(DataValidationError):
    """The bank on disk is missing, unreadable, empty or malformed (the message says which file and the fix).

    A :class:`DataValidationError` of suite ``bank``, so every caller that reports bad data
    (the CLI, the flow) reports this one the same way.
    """

    def __init__(self, message: str) -> None:
        super().__init__("bank", [{"expectation": "readable, non-empty bank", "unexpected_count": 0, "detail": message}])

    def __reduce__(self):
        return (type(self), (self.failures[0]["detail"],))


def round_path(bank_dir: str | Path, round_: int) -> Path:
    return Path(bank_dir) / f"round-{round_:03d}.parquet"


def round_numbers(bank_dir: str | Path) -> list[int]:
    """The bank's round file numbers, ascending."""
    return sorted(int(f.stem.split("-")[1]) for f in Path(bank_dir).glob("round-*.parquet"))


def read_bank(bank_dir: str | Path) -> pd.DataFrame:
    """Every round file concatenated, rows sorted by ``bank_id`` (a stable order for the index).

    Raises :class:`BankError` naming the file when the directory is missing or has no round
    file, a file cannot be read, or a file lacks bank columns; 0 rows is returned as is (the
    caller decides whether an empty bank is an error).
    """
    bank_dir = Path(bank_dir)
    if not bank_dir.is_dir():
        raise BankError(f"no experience bank at {bank_dir}: run `lopd collect` first")
    files = sorted(bank_dir.glob(ROUND_GLOB))
    if not files:
        raise BankError(f"experience bank {bank_dir} holds no {ROUND_GLOB} file: run `lopd collect` first")
    frames = []
    for f in files:
        try:
            df = pd.read_parquet(f)
        except Exception as e:  # pyarrow raises several types for truncated/garbled files
            raise BankError(f"bank file {f} is unreadable ({type(e).__name__}: {e}); re-run `lopd collect` "
                            "or remove that round file") from None
        missing = [c for c in BANK_COLUMNS if c not in df.columns]
        if missing:
            raise BankError(f"bank file {f} lacks columns {missing} (expected {list(BANK_COLUMNS)}); "
                            "it was not written by `lopd collect`: re-run it")
        frames.append(df[list(BANK_COLUMNS)])
    bank = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return bank.sort_values("bank_id", kind="stable").reset_index(drop=True)


def bank_frame(trajs: Sequence, tasks_by_id: dict, policy: str, round_: int, lite_text) -> pd.DataFrame:
    """Bank rows (:data:`BANK_COLUMNS`) of the successful trajectories among ``trajs``, observation-lite
    (``lite_text``: the environment's, ``lopd.envs.registry.Environment.lite_text``)."""
    rows = []
    for t in trajs:
        if not t.success:
            continue
        task = tasks_by_id[t.task_id]
        rows.append(
            {
                "bank_id": t.rollout_id,
                "task_id": t.task_id,
                "family": t.family,
                "app": task.app,
                "task_text": task.text,
                "steps_json": json.dumps([{"action": a, "result": s} for a, s in zip(t.actions, t.shorts)]),
                "lite_text": lite_text(task.text, t.actions, t.shorts),
                "reward": float(t.reward),
                "success": True,
                "source_round": round_,
                "model": policy,
            }
        )
    return pd.DataFrame(rows, columns=list(BANK_COLUMNS))


def content_key(df: pd.DataFrame) -> pd.Series:
    """Identity of an experience regardless of id: the task and the exact steps taken."""
    return (df["task_id"].astype(str) + "\x1f" + df["steps_json"].astype(str)).map(
        lambda s: hashlib.sha256(s.encode()).hexdigest()[:20]
    )


def append_round(
    bank_dir: str | Path,
    rows: pd.DataFrame,
    round_: int,
    success_threshold: float,
    forbidden_task_ids: AbstractSet[str] = frozenset(),
) -> pd.DataFrame:
    """Add ``rows`` (bank-format successes) as ``round-NNN.parquet``; return the rows written.

    Duplicates of existing entries (or of each other) are dropped first; when nothing new
    remains no file is written. The rows pass the Great Expectations bank suite before any
    write. Raises :class:`BankError` if that round's file already exists (files are never
    rewritten in place).
    """
    from lopd.ops.validation import validate_bank

    bank_dir = Path(bank_dir)
    path = round_path(bank_dir, round_)
    if path.exists():
        raise BankError(f"{path} already exists: bank files are never rewritten; append as round {round_ + 1}")
    existing = read_bank(bank_dir) if bank_dir.is_dir() and any(bank_dir.glob(ROUND_GLOB)) else None
    new = rows[list(BANK_COLUMNS)].copy()
    keys = content_key(new)
    keep = ~keys.duplicated()
    if existing is not None and len(existing):
        keep &= ~keys.isin(set(content_key(existing))) & ~new["bank_id"].isin(set(existing["bank_id"]))
    new = new[keep.to_numpy()].reset_index(drop=True)
    if new.empty:
        log.info("bank: round %d adds nothing new (all %d entries already in the bank)", round_, len(rows))
        return new
    validate_bank(new, success_threshold, forbidden_task_ids=forbidden_task_ids)
    bank_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=bank_dir)
    os.close(fd)
    try:
        new.to_parquet(tmp, index=False)
        os.link(tmp, path)  # unlike rename, fails when the name exists: a concurrent append cannot clobber it
    except FileExistsError:
        raise BankError(f"{path} appeared while appending: another writer added round {round_}") from None
    finally:
        os.unlink(tmp)
    log.info("bank: round %d adds %d entries (%d duplicates dropped)", round_, len(new), len(rows) - len(new))
    from lopd.ops.events import bank_grew

    bank_grew(bank_dir, round_, len(new), len(new) + (len(existing) if existing is not None else 0))  # no-op without a Prefect server
    return new


def expert_top_up(p, bank: pd.DataFrame, round_: int = 0) -> pd.DataFrame:
    """``bank`` plus scripted-expert successes on train tasks up to ``bank.expert_top_up`` entries.

    A stand-in while the base policy solves nothing (see docs/results.md, Known gaps): the smoke
    and demo profiles need a non-empty bank for the stages after collect. Off (0) by default,
    as in the paper; the entries carry ``model = "scripted-expert"``. Tasks already in the bank
    are skipped; train tasks only, in their deterministic order, so the result is reproducible.
    """
    from lopd.policy.engine import environment, split_tasks

    need = p.bank.expert_top_up - len(bank)
    if need <= 0:
        return bank
    env = environment(p)
    if env.expert is None:
        raise BankError(f"bank.expert_top_up = {p.bank.expert_top_up}, but env.name = {p.env.name} has no scripted expert: "
                        "set bank.expert_top_up=0")
    used, rows = set(bank["task_id"]), []
    for task in split_tasks(p, "train"):
        if len(rows) == need:
            break
        if task.task_id in used:
            continue
        ep = env.play(task, env.expert())
        if not ep["success"]:
            continue  # e.g. env.max_turns shorter than the family's plan
        rows.append({
            "bank_id": f"expert-{task.task_id}",
            "task_id": task.task_id,
            "family": task.family,
            "app": task.app,
            "task_text": task.text,
            "steps_json": json.dumps([{"action": a, "result": s} for a, s in zip(ep["actions"], ep["shorts"])]),
            "lite_text": env.lite_text(task.text, ep["actions"], ep["shorts"]),
            "reward": float(ep["reward"]),
            "success": True,
            "source_round": round_,
            "model": EXPERT_MODEL,
        })
    if len(rows) < need:
        log.warning("bank: expert top-up found %d of %d train tasks it could add (env.n_train = %d)",
                    len(rows), need, p.env.n_train)
    log.info("bank: %d policy successes + %d scripted-expert entries (bank.expert_top_up = %d)",
             len(bank), len(rows), p.bank.expert_top_up)
    top = pd.DataFrame(rows, columns=list(BANK_COLUMNS))
    return pd.concat([bank, top], ignore_index=True) if len(bank) else top
