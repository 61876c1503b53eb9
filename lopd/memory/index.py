"""FAISS inner-product indexes over L2-normalised vectors (inner product = cosine).

``flat`` (exact, the default: a bank of 10^3–10^5 entries searches in well under a millisecond),
``hnsw`` and ``ivf`` (approximate, for large banks; knobs ``retrieval.hnsw_*`` / ``ivf_*``).
With faiss-gpu installed and a CUDA device visible, flat and IVF indexes are searched on the
GPU through the same calls; HNSW has no GPU implementation in FAISS and stays on the CPU.
Indexes are always persisted in their CPU form, so a GPU-built index loads anywhere.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

log = logging.getLogger(__name__)

KINDS = ("flat", "hnsw", "ivf")
MIN_POINTS_PER_CELL = 39  # FAISS k-means warns (and clusters badly) below 39 training points per centroid
# FAISS samples up to 256 training points per centroid; 64 keeps the k-means cost (∝ points × cells)
# 4x lower on big banks (1M vectors: ~2 min instead of ~9 on 2 cores) for a negligible recall change.
MAX_POINTS_PER_CELL = 64


def gpu_available() -> bool:
    """faiss-gpu is installed and sees at least one CUDA device."""
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def ivf_nlist(n: int, nlist: int = 0) -> int:
    """IVF cells for ``n`` vectors: ``nlist`` or 4·√n when 0, at most n/39 and at least 1."""
    want = nlist or int(4 * math.sqrt(n))
    return max(1, min(want, n // MIN_POINTS_PER_CELL))


def build(
    vectors: np.ndarray,
    kind: str = "flat",
    *,
    hnsw_m: int = 32,
    hnsw_ef_construction: int = 40,
    hnsw_ef_search: int = 64,
    nlist: int = 0,
    nprobe: int = 16,
    seed: int = 0,
    use_gpu: bool = True,
    deterministic: bool = True,
):
    """A FAISS inner-product index holding ``vectors`` (n, d) float32 at ids 0..n-1.

    ``deterministic``: build HNSW single-threaded (its parallel insertion order, hence the
    graph, varies run to run); IVF k-means is seeded with ``seed``. With ``use_gpu`` and a GPU
    (see :func:`gpu_available`), flat and IVF indexes are moved to device 0.
    """
    import faiss

    if kind not in KINDS:
        raise ValueError(f"retrieval.index = {kind!r}: expected one of {KINDS}")
    x = np.ascontiguousarray(vectors, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"cannot index vectors of shape {x.shape}: need (n >= 1, dim)")
    n, d = x.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = hnsw_ef_construction
        index.hnsw.efSearch = hnsw_ef_search
    else:
        cells = ivf_nlist(n, nlist)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, cells, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        index.cp.max_points_per_centroid = MAX_POINTS_PER_CELL
        index.nprobe = min(nprobe, cells)
    if use_gpu and kind != "hnsw" and gpu_available():
        index = to_gpu(index)
    if kind == "ivf":
        index.train(x)
    if kind == "hnsw" and deterministic:
        with faiss_threads(1):
            index.add(x)
    else:
        index.add(x)
    return index


SMALL_BATCH = 20  # below this many queries FAISS gains nothing from threads (its own flat-search cut-off)


@contextmanager
def faiss_threads(n: int) -> Iterator[None]:
    """Run FAISS with ``n`` OpenMP threads inside the block.

    Why: faiss-cpu and torch each bundle an OpenMP runtime whose idle workers spin; waking
    FAISS's pool for a one-query search and then running a torch forward makes the two fight
    for the cores (measured here: MiniLM encode + flat search of one query 245 ms with FAISS's
    pool vs 22 ms single-threaded, on 2 cores).
    """
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def search(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``index.search`` (scores (q, k), ids (q, k)), single-threaded for small batches (see faiss_threads)."""
    if len(queries) < SMALL_BATCH and not is_gpu(index):
        with faiss_threads(1):
            return index.search(queries, k)
    return index.search(queries, k)


_GPU_RESOURCES = None


def to_gpu(index):
    """The same index on GPU 0 (one shared StandardGpuResources per process)."""
    import faiss

    global _GPU_RESOURCES
    if _GPU_RESOURCES is None:
        _GPU_RESOURCES = faiss.StandardGpuResources()
    log.info("faiss: using the GPU (faiss-gpu, device 0)")
    return faiss.index_cpu_to_gpu(_GPU_RESOURCES, 0, index)


def is_gpu(index) -> bool:
    return type(index).__name__.startswith("GpuIndex")


def to_cpu(index):
    import faiss

    return faiss.index_gpu_to_cpu(index) if is_gpu(index) else index


def save(index, path: str | Path) -> None:
    """Write the CPU form of ``index`` to ``path`` (the caller makes the write atomic)."""
    import faiss

    faiss.write_index(to_cpu(index), str(path))


def load(path: str | Path, use_gpu: bool = True, nprobe: int | None = None, ef_search: int | None = None):
    """Read an index; query-time knobs (``nprobe``, ``ef_search``) can differ from build time."""
    import faiss

    index = faiss.read_index(str(path))
    if nprobe is not None and hasattr(index, "nprobe"):
        index.nprobe = min(nprobe, index.nlist)
    if ef_search is not None and hasattr(index, "hnsw"):
        index.hnsw.efSearch = ef_search
    if use_gpu and not hasattr(index, "hnsw") and gpu_available():
        index = to_gpu(index)
    return index


def from_params(vectors: np.ndarray, r, seed: int = 0, deterministic: bool = True):
    """:func:`build` with the ``retrieval`` params section ``r``."""
    return build(
        vectors, r.index, hnsw_m=r.hnsw_m, hnsw_ef_construction=r.hnsw_ef_construction,
        hnsw_ef_search=r.hnsw_ef_search, nlist=r.ivf_nlist, nprobe=r.ivf_nprobe, seed=seed,
        use_gpu=r.faiss_gpu, deterministic=deterministic,
    )
