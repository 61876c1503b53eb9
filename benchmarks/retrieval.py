"""Benchmark: FAISS Flat vs HNSW vs IVF on synthetic unit vectors — build time, p50 single-query
top-k latency, recall@k against exact search.

Targets (issue #3): at 100k vectors, the approximate index answers a top-3 query in < 1 ms
(p50) with recall@3 >= 0.95. The knobs come from params (``retrieval.hnsw_*``, ``ivf_*``), so
``--set retrieval.hnsw_ef_search=32`` tries another setting.

Synthetic data: real sentence embeddings lie near a low-dimensional, clustered manifold, and
uniform random 384-d vectors (no structure at all) would make every ANN index look far worse
than on a bank. Each vector is ``normalise(A·z + noise)`` with ``z`` from a 64-centre Gaussian
mixture in 32 dimensions and ``A`` a fixed random projection; queries are fresh draws from the
same distribution (never bank members).

    .venv/bin/python benchmarks/retrieval.py [--sizes 10k,100k,1m] [--cases 384:10k,...] [--queries 200]

The HNSW graph is built multi-threaded here (the ``index`` stage builds it single-threaded, for a
reproducible graph); latency is measured one query per call, single-threaded, as the
``Retriever`` runs small batches.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from lopd.config import load_params
from lopd.memory import index as faiss_index

DEFAULT_CASES = "384:10k,384:100k,384:1m,4096:100k"
SWEEP_EF = (16, 32, 128)  # HNSW efSearch values also timed (query-time knob, same graph)
SWEEP_NPROBE = (4, 8, 32, 64)  # IVF nprobe values also timed (query-time knob, same cells)


def parse_n(s: str) -> int:
    s = s.strip().lower()
    mult = {"k": 10**3, "m": 10**6}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "km" else s) * mult)


def synthetic(n: int, dim: int, seed: int, data: str = "clustered", intrinsic: int = 32, centres: int = 64,
              chunk: int = 100_000) -> np.ndarray:
    """(n, dim) float32 unit rows: ``clustered`` low-dimensional source (see module doc) or
    ``random`` (isotropic Gaussian: no structure, the worst case for any ANN index)."""
    rng = np.random.default_rng(seed)
    basis = np.random.default_rng(12345).normal(size=(intrinsic, dim)).astype(np.float32) / np.sqrt(intrinsic)
    mus = np.random.default_rng(54321).normal(size=(centres, intrinsic)).astype(np.float32)
    out = np.empty((n, dim), dtype=np.float32)
    for s in range(0, n, chunk):  # chunks: 1M x 4096 would not fit twice in memory
        m = min(chunk, n - s)
        if data == "random":
            x = rng.normal(size=(m, dim)).astype(np.float32)
            out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
            continue
        z = mus[rng.integers(0, centres, m)] + 0.5 * rng.normal(size=(m, intrinsic)).astype(np.float32)
        x = z @ basis + 0.05 * rng.normal(size=(m, dim)).astype(np.float32)
        out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def run_case(dim: int, n: int, kinds: list[str], r, k: int, n_queries: int, seed: int, data: str,
             sweep: bool = True, flat_queries: int = 50) -> list[dict]:
    t0 = time.perf_counter()
    x = synthetic(n, dim, seed, data)
    q = synthetic(n_queries, dim, seed + 1, data)
    gen_s = time.perf_counter() - t0
    exact = faiss_index.build(x, "flat", use_gpu=False)
    _, truth = exact.search(q, k)  # one batched, multi-threaded exact search = ground truth
    rows = []
    for kind in kinds:
        t0 = time.perf_counter()
        index = exact if kind == "flat" else faiss_index.build(
            x, kind, hnsw_m=r.hnsw_m, hnsw_ef_construction=r.hnsw_ef_construction, hnsw_ef_search=r.hnsw_ef_search,
            nlist=r.ivf_nlist, nprobe=r.ivf_nprobe, seed=seed, use_gpu=r.faiss_gpu, deterministic=False)
        build_s = time.perf_counter() - t0 if kind != "flat" else np.nan
        nlist = faiss_index.ivf_nlist(n, r.ivf_nlist)
        # Query-time knobs need no rebuild: the params setting first, then a sweep on the same index.
        settings = {"flat": [None],
                    "hnsw": [r.hnsw_ef_search] + ([e for e in SWEEP_EF if e != r.hnsw_ef_search] if sweep else []),
                    "ivf": [min(r.ivf_nprobe, nlist)] + ([p for p in SWEEP_NPROBE if p < nlist and p != r.ivf_nprobe] if sweep else [])}[kind]
        for j, knob in enumerate(settings):
            if kind == "hnsw":
                index.hnsw.efSearch = knob
            elif kind == "ivf":
                index.nprobe = knob
            lat, found = [], []
            # Exact search is slow and its latency steady: fewer timed queries (its recall is 1 by definition).
            for i in range(min(n_queries, flat_queries) if kind == "flat" else n_queries):
                t1 = time.perf_counter()
                _, ids = faiss_index.search(index, q[i : i + 1], k)
                lat.append((time.perf_counter() - t1) * 1e3)
                found.append(ids[0])
            recall = float(np.mean([len(set(f.tolist()) & set(t.tolist())) / k for f, t in zip(found, truth[: len(found)])]))
            knobs = {"flat": "exact",
                     "hnsw": f"M={r.hnsw_m} efC={r.hnsw_ef_construction} efS={knob}",
                     "ivf": f"nlist={nlist} nprobe={knob}"}[kind]
            rows.append({"dim": dim, "n": n, "index": kind, "knobs": knobs + (" (params)" if j == 0 and kind != "flat" else ""),
                         "build_s": build_s if j == 0 else np.nan, "p50_ms": float(np.median(lat)),
                         "p95_ms": float(np.percentile(lat, 95)), f"recall@{k}": recall, "gpu": faiss_index.is_gpu(index)})
            print(_fmt(rows[-1], k), flush=True)
        if kind != "flat":
            del index
    del exact, x
    print(f"    (data generation {gen_s:.1f}s)", flush=True)
    return rows


HEADER = "| dim | n | index | knobs | build s | p50 ms | p95 ms | recall@{k} |"


def _fmt(row: dict, k: int) -> str:
    build = "—" if np.isnan(row["build_s"]) else f"{row['build_s']:.1f}"
    return (f"| {row['dim']} | {row['n']:,} | {row['index']}{' (gpu)' if row['gpu'] else ''} | {row['knobs']} | {build} | "
            f"{row['p50_ms']:.3f} | {row['p95_ms']:.3f} | {row[f'recall@{k}']:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default="none", help="params overlay (default: none = params.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="e.g. retrieval.hnsw_ef_search=32")
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"dim:n pairs (default {DEFAULT_CASES})")
    ap.add_argument("--sizes", default=None, help="keep only cases with these n, e.g. 10k,100k")
    ap.add_argument("--kinds", default="flat,hnsw,ivf")
    ap.add_argument("--queries", type=int, default=200, help="single-query searches timed per index")
    ap.add_argument("--data", choices=["clustered", "random"], default="clustered", help="synthetic distribution")
    ap.add_argument("--flat-queries", type=int, default=50, help="single-query searches timed for the exact index")
    ap.add_argument("--no-sweep", action="store_true", help="time only the params' efSearch / nprobe")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = ap.parse_args()
    p = load_params(a.params, None if a.profile in ("", "none") else a.profile, a.overrides)
    cases = [(int(d), parse_n(n)) for d, n in (c.split(":") for c in a.cases.split(","))]
    if a.sizes:
        keep = {parse_n(s) for s in a.sizes.split(",")}
        cases = [c for c in cases if c[1] in keep]
    k = p.retrieval.n_ret
    print(f"FAISS index benchmark: {a.data} data, top-{k}, {a.queries} single queries per index, "
          f"gpu available: {faiss_index.gpu_available()}")
    print(HEADER.format(k=k))
    print("|---|---|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    rows = []
    for dim, n in cases:
        rows += run_case(dim, n, a.kinds.split(","), p.retrieval, k, a.queries, p.seed, a.data, not a.no_sweep, a.flat_queries)
    print(f"total {time.perf_counter() - t0:.0f}s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
