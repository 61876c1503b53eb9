"""Top-k retrieval of bank entries for a task, and the index directory on disk.

Guarantees of :meth:`Retriever.retrieve` / :meth:`Retriever.retrieve_batch`:

- never the task itself: entries whose ``task_id`` equals the query's are skipped (spec step 2);
- never a dev or test task: entries whose ``task_id`` is in ``forbidden_task_ids`` are skipped
  (the bank suite already refuses them at build time; this is the second line of defence);
- deterministic: hits are ordered by (score desc, bank_id asc); when scores tie at the k-th
  place the search widens until every tied candidate is seen, so which one wins never depends
  on FAISS's internal heap order;
- scoped (``retrieval.scope: app``): entries from the query task's own app come first, and
  entries from other apps only fill the k places the app's own cannot. An agent platform knows
  which environment a task runs in; a dense embedding of the task text does not weigh that one
  word enough (measured on ToolWorld dev: same-app precision@3 0.47 unscoped, MiniLM, 496
  entries).

Exclusions and the scope are applied by over-fetching and filtering rather than with FAISS ``IDSelector``
search parameters: a selector is per call, so per-query exclusions would serialise a batch
into one call per query, and GPU indexes do not take selectors.

The index directory (``data/index``): ``index.faiss`` (CPU form), ``embeddings.npy`` (n, dim)
float32, ``metadata.parquet`` (the bank rows, row i = FAISS id i, sorted by ``bank_id``) and
``manifest.json`` (embedder, dim, index kind and knobs); written as one atomic directory swap.
"""

from __future__ import annotations

import json
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from lopd import layout
from lopd.io import atomic_path
from lopd.memory import index as faiss_index

INDEX_FILE, EMBEDDINGS_FILE, METADATA_FILE, MANIFEST_FILE = "index.faiss", "embeddings.npy", "metadata.parquet", "manifest.json"


def entry_texts(bank: pd.DataFrame, embed_text: str) -> list[str]:
    """What is embedded per entry: ``task+trajectory`` = the observation-lite text (it starts with
    ``Task: ...``, the paper's choice) or ``task`` = the task text alone."""
    column = {"task+trajectory": "lite_text", "task": "task_text"}[embed_text]
    return bank[column].astype(str).tolist()


def held_out_task_ids(p) -> frozenset[str]:
    """Every dev and test task id of the configured task sets: never retrievable."""
    from lopd.policy.engine import split_tasks

    return frozenset(t.task_id for s in ("dev", "test") for t in split_tasks(p, s))


def _query(task: Any, scope: str | None = None) -> tuple[str | None, str, str | None]:
    """(task_id or None, text, value of the ``scope`` field or None) from a Task-like object, a mapping or a bare string."""
    if isinstance(task, str):
        return None, task, None
    if isinstance(task, dict):
        return task.get("task_id"), task["text"] if "text" in task else task["task_text"], task.get(scope) if scope else None
    return getattr(task, "task_id", None), task.text, getattr(task, scope, None) if scope else None


class Retriever:
    """Top-k search over one index whose id i is ``metadata.iloc[i]``."""

    def __init__(self, index, metadata: pd.DataFrame, embedder=None, forbidden_task_ids: AbstractSet[str] = frozenset(),
                 n_ret: int = 3, scope: str | None = None):
        if index.ntotal != len(metadata):
            raise ValueError(f"index holds {index.ntotal} vectors but metadata {len(metadata)} rows: rebuild with `lopd index`")
        if scope is not None and scope not in metadata.columns:
            raise ValueError(f"retrieval scope {scope!r} is not a bank column ({list(metadata.columns)}): re-run `lopd collect` "
                             "and `lopd index`, or set retrieval.scope=none")
        self.index, self.meta, self.embedder, self.n_ret = index, metadata.reset_index(drop=True), embedder, n_ret
        self.scope = scope
        self._scopes = self.meta[scope].astype(str).to_numpy() if scope else None
        self._task_ids = self.meta["task_id"].astype(str).to_numpy()
        self._blocked = np.isin(self._task_ids, list(forbidden_task_ids)) if forbidden_task_ids else np.zeros(len(self.meta), bool)
        # Worst case to skip per query: every entry of the query's own task plus every blocked one.
        self._slack = int(self.meta["task_id"].value_counts().max()) + int(self._blocked.sum()) if len(self.meta) else 0

    # ------------------------------------------------------------------ vectors in, positions out

    def search(self, queries: np.ndarray, k: int, exclude_task_ids: Sequence[str | None] | None = None,
               scopes: Sequence[str | None] | None = None) -> list[list[tuple[int, float]]]:
        """``queries`` (q, dim) float32 → per query up to ``k`` ``(position, score)``, best first.

        ``scopes``: per query, the value of the retriever's scope column its hits should share
        (None: unscoped); in-scope hits rank before all others.
        """
        q = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.index.d)
        exclude = list(exclude_task_ids) if exclude_task_ids is not None else [None] * len(q)
        scopes = list(scopes) if scopes is not None and self._scopes is not None else [None] * len(q)
        n = self.index.ntotal
        out: list[list[tuple[int, float]] | None] = [None] * len(q)
        todo = np.arange(len(q))
        fetch = min(n, k + self._slack)
        while len(todo):
            D, I = faiss_index.search(self.index, q[todo], fetch)
            again = []
            for row, qi in enumerate(todo):
                hits, complete = self._filter(D[row], I[row], exclude[qi], k, fetch >= n, scopes[qi])
                if complete:
                    out[qi] = hits
                else:
                    again.append(qi)
            todo = np.array(again, dtype=int)
            fetch = min(n, fetch * 2)
        return out  # type: ignore[return-value]

    def _filter(self, scores: np.ndarray, ids: np.ndarray, own: str | None, k: int, saw_all: bool, scope: str | None = None):
        """Kept hits of one query and whether they are final (no unseen candidate could change them)."""
        valid = ids >= 0  # approximate indexes pad with -1 when they find fewer
        ids, scores = ids[valid], scores[valid]
        keep = ~self._blocked[ids]
        if own is not None:
            keep &= self._task_ids[ids] != own
        ids, scores = ids[keep], scores[keep]
        outside = (self._scopes[ids] != scope) if scope is not None else np.zeros(len(ids), bool)
        # (out of scope, −score, position): in-scope first, ties → bank_id order.
        kept = sorted(zip(outside.tolist(), (-scores).tolist(), ids.tolist()))
        hits = [(i, -s) for _, s, i in kept[:k]]
        if saw_all or not valid.any():
            return hits, True
        worst_fetched = float(scores.min()) if len(scores) else float("inf")
        # Final only if the k-th hit beats the worst fetched score strictly (else an unfetched
        # candidate could tie it); out-of-scope fill is final only once every in-scope entry is in.
        inside = [(-s, i) for out, s, i in kept if not out]
        if len(inside) >= k:
            return hits, -inside[k - 1][0] > worst_fetched
        if scope is not None and len(inside) < self._eligible(scope, own):
            return hits, False
        return hits, len(kept) >= k and -kept[k - 1][1] > worst_fetched

    def _eligible(self, scope: str, own: str | None) -> int:
        """Entries of ``scope`` a query of task ``own`` may retrieve."""
        ok = (self._scopes == scope) & ~self._blocked
        if own is not None:
            ok &= self._task_ids != own
        return int(ok.sum())

    # ------------------------------------------------------------------ tasks in, bank entries out

    def entries(self, hits: list[tuple[int, float]]) -> list[dict]:
        """Bank rows (dicts: bank columns + ``score``, ``rank``) for one query's :meth:`search` hits."""
        rows = []
        for rank, (pos, score) in enumerate(hits):
            row = self.meta.iloc[pos].to_dict()
            row.update(score=float(score), rank=rank)
            rows.append(row)
        return rows

    def retrieve_batch(self, tasks: Sequence[Any], k: int | None = None, batch_size: int = 64) -> list[list[dict]]:
        """Top-``k`` bank entries (dicts: bank columns + ``score``, ``rank``) for each task.

        A task is a ToolWorld ``Task`` (or anything with ``task_id`` and ``text``), a dict with
        those keys, or a bare string (no self-exclusion then). Query = the task's text; with a
        scope, the task's field of that name (e.g. ``app``) picks the in-scope entries.
        """
        if self.embedder is None:
            raise ValueError("this Retriever has no embedder: pass one, or call search() with query vectors")
        k = k or self.n_ret
        ids, texts, scopes = zip(*(_query(t, self.scope) for t in tasks)) if tasks else ((), (), ())
        if not texts:
            return []
        vecs = self.embedder.encode(list(texts), batch_size=batch_size)
        return [self.entries(h) for h in self.search(vecs, k, list(ids), list(scopes))]

    def retrieve(self, task: Any, k: int | None = None) -> list[dict]:
        """Top-``k`` bank entries for one task (see :meth:`retrieve_batch`)."""
        return self.retrieve_batch([task], k)[0]


# ----------------------------------------------------------------------------- the directory


def write_index_dir(path: str | Path, index, embeddings: np.ndarray, metadata: pd.DataFrame, manifest: dict) -> None:
    """Write the four files into a temp dir and swap it in: the previous index stays whole until then."""
    with atomic_path(path) as tmp:
        tmp.mkdir()
        faiss_index.save(index, tmp / INDEX_FILE)
        np.save(tmp / EMBEDDINGS_FILE, np.ascontiguousarray(embeddings, dtype=np.float32))
        metadata.reset_index(drop=True).to_parquet(tmp / METADATA_FILE, index=False)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, default=str) + "\n")


def load_retriever(
    path: str | Path,
    embedder=None,
    forbidden_task_ids: AbstractSet[str] = frozenset(),
    n_ret: int = 3,
    use_gpu: bool = True,
    nprobe: int | None = None,
    ef_search: int | None = None,
    scope: str | None = None,
) -> Retriever:
    """A Retriever over the index directory at ``path``.

    Raises FileNotFoundError when a file is missing (run ``lopd index``) and ValueError when
    ``embedder`` is not the one the index was built with (its vectors would not be comparable).
    """
    path = Path(path)
    missing = [f for f in (INDEX_FILE, METADATA_FILE, MANIFEST_FILE) if not (path / f).exists()]
    if missing:
        raise FileNotFoundError(f"no complete retrieval index at {path} (missing {missing}): run `lopd index`")
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    if embedder is not None and embedder.fingerprint != manifest.get("embedder_fingerprint"):
        raise ValueError(
            f"index at {path} was built with embedder {manifest.get('embedder')!r} "
            f"(fingerprint {manifest.get('embedder_fingerprint')}), not {embedder.name!r} ({embedder.fingerprint}): "
            "re-run `lopd index` with the current retrieval.embedder"
        )
    index = faiss_index.load(path / INDEX_FILE, use_gpu=use_gpu, nprobe=nprobe, ef_search=ef_search)
    return Retriever(index, pd.read_parquet(path / METADATA_FILE), embedder, forbidden_task_ids, n_ret, scope=scope)


def scope_of(p) -> str | None:
    """The bank column retrieval is scoped by (``retrieval.scope``), or None."""
    return None if p.retrieval.scope == "none" else p.retrieval.scope


def open_retriever(p, embedder=None, index_dir: Path | None = None) -> Retriever:
    """The Retriever the params describe: ``data/index`` (or ``index_dir``), the configured embedder, dev/test ids blocked."""
    from lopd.memory.embed import make_embedder

    r = p.retrieval
    return load_retriever(index_dir or layout.index_dir(p), embedder or make_embedder(p), held_out_task_ids(p), r.n_ret,
                          use_gpu=r.faiss_gpu, nprobe=r.ivf_nprobe, ef_search=r.hnsw_ef_search,
                          scope=scope_of(p))


def refresh_retriever(p, bank_dir: Path, index_dir: Path, embedder) -> Retriever:
    """Re-embed (cached by content) and re-index the bank at ``bank_dir``; write the index to ``index_dir``.

    A light version of the ``index`` stage: no MLflow run, no dev metrics.
    """
    import faiss

    from lopd.memory.bank import read_bank
    from lopd.memory.embed import embed_texts

    r = p.retrieval
    bank = read_bank(bank_dir)
    vecs, _ = embed_texts(embedder, entry_texts(bank, r.embed_text), layout.embed_cache_dir(p), r.batch_size)
    index = faiss_index.from_params(vecs, r, seed=p.seed)
    manifest = {"embedder": embedder.name, "embedder_fingerprint": embedder.fingerprint, "dim": embedder.dim,
                "embed_text": r.embed_text, "index": r.index, "n_entries": len(bank), "faiss_version": faiss.__version__,
                "seed": p.seed, "source": str(bank_dir)}
    write_index_dir(index_dir, index, vecs, bank, manifest)
    return Retriever(index, bank, embedder, held_out_task_ids(p), r.n_ret, scope=scope_of(p))
