"""Stage `ingest`: trajectories a deployed agent played (JSONL, ``ingest.files``) → validated → a new bank round.

``lopd ingest FILE.jsonl [FILE ...]`` (= ``--set ingest.files=[...]``); with no file (the default, e.g.
inside ``lopd run``) the stage adds nothing. Each line (the format: ``lopd.memory.experience`` and
docs/operate.md) is replayed in the environment, then validated by a Great Expectations suite
(``lopd.ops.validation.experience_reasons``). Every line ends in exactly one place:

- ``banked``: a valid success, appended to ``data/bank`` as one new round file for this ingest
  (``lopd.memory.bank.append_round``: atomic, validated by the bank suite, emits ``lopd.bank.grew``),
  copied to ``data/ingest/rounds`` (``collect`` puts it back when it rewrites the bank);
- ``already_in_bank``: a valid success ingested before (its id comes from its content);
- ``failure``: a valid row whose verdict is failure (the bank keeps successes only);
- ``quarantined``: malformed JSON or any failed expectation, written with its first reason (and
  all of them) to ``data/ingest/quarantine/<file>-<sha>.jsonl``.

A report per file (``data/ingest/reports/<file>-<sha>.json``: every line's outcome) and
``metrics/ingest.json`` (the counts) say where each line went. Ingesting the same file again adds
nothing. In a DVC workspace whose ``dvc.lock`` records ``data/bank`` (and outside ``dvc repro``),
``dvc commit collect`` then records the grown bank, so the next ``dvc repro`` re-runs from ``index``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd

from lopd import layout
from lopd.config import Params, ParamsError
from lopd.io import atomic_path, write_json
from lopd.memory.bank import append_round, read_bank, round_numbers, round_path
from lopd.memory.experience import all_tasks, bank_id, bank_rows, experience_frame, parse_lines

log = logging.getLogger(__name__)


def check_files(p: Params) -> list[Path]:
    """``ingest.files`` as paths, each an existing file (else a ParamsError naming it), before any compute."""
    paths = [Path(f).expanduser() for f in p.ingest.files]
    bad = [str(f) for f in paths if not f.is_file()]
    if bad:
        raise ParamsError(f"params: ingest.files names no file at {bad}: give JSONL files of deployed trajectories "
                          "(`lopd ingest FILE.jsonl`; the format is in docs/operate.md)")
    return paths


def _outcomes(frame: pd.DataFrame, reasons: dict, known_ids: set[str]) -> dict[int, dict]:
    """line -> {"outcome", "reason"?, "reasons"?, "bank_id"?} for the parsed lines."""
    out = {}
    for line, r in frame.iterrows():
        if line in reasons:
            why = [f"{x}: {r['replay_error']}" if x.startswith("the messages do not replay") and r["replay_error"] else x for x in reasons[line]]
            out[line] = {"outcome": "quarantined", "reason": why[0], "reasons": why}
        elif r["verdict"] != "success":
            out[line] = {"outcome": "failure"}
        else:
            bid = bank_id(r["key"])
            out[line] = {"outcome": "already_in_bank" if bid in known_ids else "banked", "bank_id": bid}
    return out


def ingest_file(p: Params, path: Path, env, tasks: dict, bank: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    """One file: (its report, the frame of the lines to bank); writes its quarantine file and report."""
    from lopd.ops.validation import experience_reasons

    text = path.read_text()
    sha = hashlib.sha256(text.encode()).hexdigest()[:12]
    lines = text.splitlines()
    rows, bad = parse_lines(text)
    frame = experience_frame(rows, env, tasks, bank)
    reasons = experience_reasons(frame, p.env.success_threshold) if len(frame) else {}
    outcomes = _outcomes(frame, reasons, set(bank["bank_id"])) if len(frame) else {}
    for line, _, why in bad:
        outcomes[line] = {"outcome": "quarantined", "reason": why, "reasons": [why]}
    quarantine = [{"line": n, "reason": o["reason"], "reasons": o["reasons"], "row": lines[n - 1]}
                  for n, o in sorted(outcomes.items()) if o["outcome"] == "quarantined"]
    stem = f"{path.stem}-{sha}"
    qpath = layout.ingest_dir(p) / "quarantine" / f"{stem}.jsonl"
    if quarantine:
        with atomic_path(qpath) as tmp:
            tmp.write_text("".join(json.dumps(q) + "\n" for q in quarantine))
    counts = Counter(o["outcome"] for o in outcomes.values())
    report = {"file": path.name, "sha256": sha, "lines": len(outcomes),
              **{k: counts.get(k, 0) for k in ("banked", "already_in_bank", "failure", "quarantined")},
              "reasons": dict(Counter(o["reason"].split(":")[0] for o in outcomes.values() if o["outcome"] == "quarantined")),
              "quarantine": qpath.relative_to(p.root()).as_posix() if quarantine else None,
              "outcomes": {str(n): o for n, o in sorted(outcomes.items())}}
    write_json(layout.ingest_dir(p) / "reports" / f"{stem}.json", report)
    keep = [n for n, o in outcomes.items() if o["outcome"] == "banked"]
    return report, frame.loc[keep]


def _dvc_commit(p: Params) -> str:
    """Record the grown bank in ``dvc.lock`` (``dvc commit collect``) when DVC tracks it here; what happened, in a word or a line."""
    from lopd.ops.tracking import dvc_lock_hash

    if os.environ.get("DVC_STAGE"):
        return "inside dvc repro: DVC records it"
    root = p.root()
    if dvc_lock_hash(root / "dvc.lock", "data/bank") is None or not (root / ".dvc").is_dir():
        return "not tracked: no dvc.lock entry for data/bank here"
    dvc = Path(sys.executable).parent / "dvc"
    r = subprocess.run([str(dvc) if dvc.exists() else "dvc", "commit", "-f", "-q", "collect"], cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        log.warning("ingest: `dvc commit collect` failed (%s); the next `dvc repro` re-runs collect, which keeps every ingested round",
                    (r.stderr or r.stdout).strip()[-300:])
        return "dvc commit failed"
    return "committed"


def run(p: Params) -> dict:
    """Ingest ``ingest.files``: validate every line, bank the valid successes as one new round, quarantine the rest."""
    import mlflow

    from lopd.ops.tracking import stage_run
    from lopd.policy.engine import environment

    paths = check_files(p)
    with stage_run(p, "ingest"):
        out = {"files": [], "round": None, "added": 0, "dvc": None}
        if paths:
            bank_dir = layout.bank_dir(p)
            bank = read_bank(bank_dir)  # no bank yet: a BankError that says to run `lopd collect`
            env, tasks = environment(p), all_tasks(p)
            pending = []
            for path in paths:
                seen = pd.concat([bank, *[bank_rows(f, tasks, -1) for f in pending]], ignore_index=True) if pending else bank
                report, frame = ingest_file(p, path, env, tasks, seen)
                pending.append(frame)
                out["files"].append({k: v for k, v in report.items() if k != "outcomes"})
                log.info("ingest %s: %d lines: %d banked, %d already in the bank, %d failures, %d quarantined %s", path.name, report["lines"],
                         report["banked"], report["already_in_bank"], report["failure"], report["quarantined"], report["reasons"] or "")
            new = pd.concat([bank_rows(f, tasks, 0) for f in pending], ignore_index=True) if pending else pd.DataFrame()
            if len(new):
                round_ = max(round_numbers(bank_dir), default=-1) + 1
                new["source_round"] = round_
                dev_test = {t for t, (_, split) in tasks.items() if split != "train"}
                added = append_round(bank_dir, new, round_, p.env.success_threshold, forbidden_task_ids=dev_test)
                keep = layout.ingest_dir(p) / "rounds" / round_path(bank_dir, round_).name  # collect puts it back after a re-collect
                with atomic_path(keep) as tmp:
                    shutil.copy2(round_path(bank_dir, round_), tmp)
                out.update(round=round_, added=len(added), dvc=_dvc_commit(p))
            out["bank_size"] = len(read_bank(bank_dir))
        totals = Counter()
        for f in out["files"]:
            totals.update({k: f[k] for k in ("lines", "banked", "already_in_bank", "failure", "quarantined")})
        out.update({k: totals.get(k, 0) for k in ("lines", "banked", "already_in_bank", "failure", "quarantined")})
        mlflow.log_metrics({k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and v is not None})
        write_json(layout.metrics_path(p, "ingest"), out)
    return out
