"""Where each stage reads and writes, relative to ``paths.root`` (one place, so DVC, the CLI
and the tests agree)."""

from __future__ import annotations

from pathlib import Path

from lopd.config import Params, ParamsError


def models_dir(p: Params) -> Path:
    return p.root() / "models"


def base_model_dir(p: Params) -> Path:
    return models_dir(p) / "base"


def policy_path(p: Params) -> Path:
    """The base policy: ``model.path`` when set (a real checkpoint), else the bootstrapped tiny model."""
    if p.model.path:
        path = Path(p.model.path).expanduser()
        if not (path / "config.json").exists():
            raise ParamsError(
                f"params: model.path = {p.model.path!r} is not a local Hugging Face checkpoint "
                "(no config.json there); point it at a downloaded model directory or set it to null"
            )
        return path
    return base_model_dir(p)


def champion_dir(p: Params) -> Path:
    """The registered champion's checkpoint, copied from the MLflow registry (``lopd.ops.registry.fetch_champion``)."""
    return models_dir(p) / "champion"


def init_path(p: Params) -> Path:
    """Where training starts (``distill.init``): the base policy, or the champion's local copy."""
    if p.distill.init == "champion":
        path = champion_dir(p)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"distill.init = champion, but there is no champion checkpoint at {path}: "
                                    "register one with `lopd promote` after a run with distill.init=base")
        return path
    return policy_path(p)


def data_dir(p: Params) -> Path:
    return p.root() / "data"


def rollouts_dir(p: Params) -> Path:
    return data_dir(p) / "rollouts"


def bank_dir(p: Params) -> Path:
    return data_dir(p) / "bank"


def index_dir(p: Params) -> Path:
    """The retrieval index built from the bank (FAISS index, embeddings, metadata, manifest)."""
    return data_dir(p) / "index"


def embed_cache_dir(p: Params) -> Path:
    """Embeddings keyed by content hash; outside ``data/index`` because DVC deletes a stage's
    outputs before re-running it, and the cache must survive that to make re-indexing cheap."""
    return p.root() / ".cache" / "embeddings"


def ingest_dir(p: Params) -> Path:
    """What ``lopd ingest`` keeps beside the bank: one report per ingested file, its quarantined rows."""
    return data_dir(p) / "ingest"


def metrics_path(p: Params, stage: str) -> Path:
    return p.root() / "metrics" / f"{stage}.json"


def composer_dir(p: Params) -> Path:
    """The cold-start composer φ₀ (encoder LoRA + resampler, safetensors): the distillation anchor."""
    return models_dir(p) / "composer"


def student_dir(p: Params, method: str) -> Path:
    """LOPD's student is ``models/student``; a baseline's is ``models/students/<method>``; vanilla = the base."""
    if method == "vanilla":
        return policy_path(p)
    return models_dir(p) / ("student" if method == "lopd" else f"students/{method}")


def checkpoint_dir(p: Params, method: str) -> Path:
    """A method's last distill checkpoint (student, optimiser states, loop state, RNG)."""
    return models_dir(p) / "checkpoints" / "distill" / method


def distill_bank_dir(p: Params, method: str = "lopd") -> Path:
    """A method's growing bank: ``data/bank`` copied at the start, then one round file per distill round.

    LOPD's is ``data/distill/bank``; the text-privilege baseline grows its own (``data/distill/opsd/bank``).
    """
    return data_dir(p) / "distill" / ("" if method == "lopd" else method) / "bank"


def distill_index_dir(p: Params, method: str = "lopd") -> Path:
    return data_dir(p) / "distill" / ("" if method == "lopd" else method) / "index"


def distill_curve_path(p: Params) -> Path:
    """Dev curves of every method on one generations grid (``dvc plots``)."""
    return p.root() / "metrics" / "distill_curve.csv"
