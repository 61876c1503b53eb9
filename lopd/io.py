"""Atomic writes: a reader (or a crash) never sees half a file or half a directory.

Everything is written to a temporary sibling first and then renamed into place; a rename
within one filesystem is atomic, so the previous version stays intact until the new one is
complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pandas as pd


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it replaces ``path`` (file or directory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)) / path.name
    try:
        yield tmp
        replace_path(tmp, path)
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)


def replace_path(tmp: Path, path: Path) -> None:
    """Put ``tmp`` (a finished file or directory) at ``path``; an old directory there is moved aside, never deleted first."""
    if path.is_dir() and tmp.is_dir():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)  # two renames: a crash in between leaves the old dir beside, not lost
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n")


def write_parquet(path: str | Path, df: pd.DataFrame) -> None:
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
