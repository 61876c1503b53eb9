"""Stage `index`: experience bank → embeddings → FAISS index in ``data/index/`` + ``metrics/index.json``.

Order matters for "bad input fails before compute, and never damages the previous index":
the embedder spec is checked and the bank is read and passes its Great Expectations suite
before any model loads; the embeddings pass the suite again (dimension, no NaN) before the
index is written; the index directory is swapped in atomically at the very end.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from lopd import layout
from lopd.config import Params

log = logging.getLogger(__name__)

LATENCY_QUERIES = 200  # single-query searches timed for query_ms_p50
RETRIEVE_QUERIES = 50  # end-to-end retrieve() calls (embed the text + search) timed for retrieve_ms_p50


def family_precision(retrieved: list[list[dict]], families: list[str]) -> float:
    """Share of retrieved entries whose family is the query's (over all queries' hits)."""
    hits = [h["family"] == f for rows, f in zip(retrieved, families) for h in rows]
    return float(np.mean(hits)) if hits else 0.0


def app_precision(retrieved: list[list[dict]], apps: list[str]) -> float:
    """Share of retrieved entries from the query's app."""
    hits = [h["app"] == a for rows, a in zip(retrieved, apps) for h in rows]
    return float(np.mean(hits)) if hits else 0.0


def run(p: Params) -> dict:
    """Embed the bank (cached by content), build and evaluate the index, write it atomically."""
    import faiss
    import mlflow

    from lopd.io import write_json
    from lopd.memory import index as faiss_index
    from lopd.memory.bank import EXPERT_MODEL, BankError, read_bank
    from lopd.memory.embed import embed_texts, embedder_source, make_embedder
    from lopd.memory.retrieval import Retriever, entry_texts, held_out_task_ids, scope_of, write_index_dir
    from lopd.ops.tracking import stage_run
    from lopd.ops.validation import validate_bank
    from lopd.policy.engine import split_tasks

    r = p.retrieval
    out_dir = layout.index_dir(p)
    embedder_source(p)  # a bad retrieval.embedder fails here, before anything loads
    bank = read_bank(layout.bank_dir(p))
    if bank.empty:
        raise BankError(
            f"experience bank {layout.bank_dir(p)} has 0 entries: the policy solved no train task "
            f"(see metrics/collect.json); nothing to index, any previous index at {out_dir} is left as it was. "
            "Fix: a stronger base policy, more collect.n_tasks, or bank.expert_top_up > 0"
        )
    forbidden = held_out_task_ids(p)
    validate_bank(bank, p.env.success_threshold, forbidden_task_ids=forbidden)
    if len(bank) < p.bank.min_size:
        log.warning("index: bank has %d entries < bank.min_size = %d (cold start will refuse it)", len(bank), p.bank.min_size)

    with stage_run(p, "index"):
        embedder = make_embedder(p)
        t0 = time.perf_counter()
        vecs, n_embedded = embed_texts(embedder, entry_texts(bank, r.embed_text), layout.embed_cache_dir(p),
                                       r.batch_size, progress=True)
        embed_s = time.perf_counter() - t0
        validate_bank(bank.assign(embedding=list(vecs)), p.env.success_threshold, forbidden_task_ids=forbidden,
                      embedding_dim=embedder.dim)

        t0 = time.perf_counter()
        index = faiss_index.from_params(vecs, r, seed=p.seed)
        build_s = time.perf_counter() - t0
        retriever = Retriever(index, bank, embedder, forbidden, r.n_ret, scope=scope_of(p))

        # Family precision over every dev task (tuning split only; test never touched).
        dev = split_tasks(p, "dev")
        t0 = time.perf_counter()
        qvecs, _ = embed_texts(embedder, [t.text for t in dev], batch_size=r.batch_size)
        query_embed_s = time.perf_counter() - t0
        hits = retriever.search(qvecs, r.n_ret, [t.task_id for t in dev], [t.app for t in dev])
        retrieved = [retriever.entries(h) for h in hits]
        precision = family_precision(retrieved, [t.family for t in dev])
        same_app = app_precision(retrieved, [t.app for t in dev])
        # The embedder alone, without the scope: how much of the precision the scope brings.
        plain = Retriever(index, bank, embedder, forbidden, r.n_ret)
        unscoped = app_precision([plain.entries(h) for h in plain.search(qvecs, r.n_ret, [t.task_id for t in dev])], [t.app for t in dev])

        lat = []
        for i in range(min(LATENCY_QUERIES, len(dev))):
            t0 = time.perf_counter()
            faiss_index.search(index, qvecs[i : i + 1], r.n_ret)
            lat.append((time.perf_counter() - t0) * 1e3)
        e2e = []
        for task in dev[:RETRIEVE_QUERIES]:
            t0 = time.perf_counter()
            retriever.retrieve(task)
            e2e.append((time.perf_counter() - t0) * 1e3)

        manifest = {
            "embedder": embedder.name,
            "embedder_fingerprint": embedder.fingerprint,
            "dim": embedder.dim,
            "embed_text": r.embed_text,
            "index": r.index,
            "index_class": type(faiss_index.to_cpu(index)).__name__,
            "gpu": faiss_index.is_gpu(index),
            "n_entries": len(bank),
            "knobs": {k: getattr(r, k) for k in ("hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "ivf_nlist", "ivf_nprobe")},
            "faiss_version": faiss.__version__,
            "seed": p.seed,
        }
        write_index_dir(out_dir, index, vecs, bank, manifest)

        metrics = {
            "n_entries": len(bank),
            "n_expert_entries": int((bank["model"] == EXPERT_MODEL).sum()),
            "entries_by_family": bank["family"].value_counts().sort_index().to_dict(),
            "dim": embedder.dim,
            "embedder": embedder.name,
            "embed_text": r.embed_text,
            "index": r.index,
            "gpu": faiss_index.is_gpu(index),
            "n_embedded": n_embedded,
            "n_cached": len(set(entry_texts(bank, r.embed_text))) - n_embedded,
            "embed_s": embed_s,
            "build_s": build_s,
            "query_ms_p50": float(np.median(lat)) if lat else 0.0,
            "retrieve_ms_p50": float(np.median(e2e)) if e2e else 0.0,
            "query_embed_ms_mean": query_embed_s * 1e3 / max(len(dev), 1),
            f"family_precision_at_{r.n_ret}": precision,
            f"app_precision_at_{r.n_ret}": same_app,
            f"app_precision_at_{r.n_ret}_unscoped": unscoped,
            "scope": r.scope,
            "entries_by_app": bank["app"].value_counts().sort_index().to_dict(),
            "n_dev_queries": len(dev),
            "lite_chars_mean": float(bank["lite_text"].str.len().mean()),
        }
        mlflow.log_metrics({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        write_json(layout.metrics_path(p, "index"), metrics)
    log.info("index: %d entries, dim %d, %s; family / app precision@%d on dev %.3f / %.3f", len(bank), embedder.dim,
             r.index, r.n_ret, precision, same_app)
    return metrics
