"""The MLflow model registry: every trained student is a version of one registered model per environment.

The registered model is ``registry.model_name`` (default ``lopd-<env.name>``). A version is a pyfunc
model whose artifact ``checkpoint`` is the student's Hugging Face directory, with its model card
(``README.md``) beside the weights; the pyfunc wrapper is passed in by the caller
(``lopd.policy.served.PolicyModel``; this layer loads no model). Each version carries its lineage as
tags (``lopd promote`` sets them: training run, git commit, params hash, bank version, environment,
base checkpoint, method, seed, dev and test figures) and ``checkpoint_sha``, the hash of the weights
and tokenizer files, so registering the same checkpoint twice returns the version it already is.

The alias :data:`CHAMPION` names the deployed version: ``models:/<name>@champion`` loads it, and
:func:`fetch_champion` copies its checkpoint to ``models/champion`` (``distill.init: champion``
trains from there). The gate (``lopd.ops.gate``) decides when the alias moves.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from lopd import layout
from lopd.config import Params
from lopd.io import atomic_path

CHAMPION = "champion"
CHECKPOINT = "checkpoint"  # the pyfunc artifact that holds the HF directory
CARD = "README.md"
MARKER = "registry.json"  # in models/champion: which version the copy is
_NOT_WEIGHTS = {CARD, MARKER}


class RegistryError(FileNotFoundError):
    """The registry lacks what was asked for (a version, the champion); the message says what exists and the fix.

    A missing input like a missing file: the CLI reports it in one line, the flow never retries it."""


def model_name(p: Params) -> str:
    """``registry.model_name``, or ``lopd-<env.name>`` (a ``package.module:factory`` name with its punctuation as '-')."""
    return p.registry.model_name or "lopd-" + re.sub(r"[^A-Za-z0-9._-]+", "-", p.env.name).strip("-")


def checkpoint_sha(path: str | Path) -> str:
    """SHA-256 (first 16 hex digits) of a checkpoint's files (names and bytes; not its card or registry marker)."""
    path, h = Path(path), hashlib.sha256()
    for f in sorted(q for q in path.rglob("*") if q.is_file() and q.name not in _NOT_WEIGHTS):
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def client(p: Params):
    """An ``MlflowClient`` on the project's store (``lopd.ops.tracking``)."""
    from mlflow.tracking import MlflowClient

    from lopd.ops.tracking import ensure_experiment, tracking_uri

    ensure_experiment(p)
    return MlflowClient(tracking_uri(p))


def versions(p: Params) -> list:
    """Every version of the registered model, oldest first ([] before the first registration)."""
    found = client(p).search_model_versions(f"name = '{model_name(p)}'")
    return sorted(found, key=lambda v: int(v.version))


def find_checkpoint(p: Params, sha: str):
    """The version whose ``checkpoint_sha`` is ``sha``, if any."""
    return next((v for v in versions(p) if v.tags.get("checkpoint_sha") == sha), None)


def get_version(p: Params, version: int | str):
    """One version, or a :class:`RegistryError` listing the versions there are."""
    from mlflow.exceptions import MlflowException

    try:
        return client(p).get_model_version(model_name(p), str(version))
    except MlflowException:
        have = [v.version for v in versions(p)]
        raise RegistryError(f"registered model {model_name(p)!r} has no version {version} (versions: {have or 'none yet'}); "
                            "list them in the MLflow UI (`make ui`, Models) or run `lopd promote` after a run to register some") from None


def champion(p: Params):
    """The version holding the alias ``champion``, or None (no registered model or no alias yet)."""
    from mlflow.exceptions import MlflowException

    try:
        return client(p).get_model_version_by_alias(model_name(p), CHAMPION)
    except MlflowException:
        return None


def requirements() -> list[str]:
    """The pip requirements recorded with each version (given, so MLflow does not infer them by loading the model)."""
    out = []
    for pkg in ("torch", "transformers", "tokenizers", "safetensors", "mlflow"):
        try:
            out.append(f"{pkg}=={metadata.version(pkg).split('+')[0]}")
        except metadata.PackageNotFoundError:
            continue
    return out


def register(p: Params, checkpoint: str | Path, python_model, *, artifact_name: str, card: str, tags: Mapping[str, Any],
             description: str, signature=None):
    """Log ``checkpoint`` (with ``card`` as its README.md) as a pyfunc model in the active MLflow run and register it.

    Returns the version; when a version already holds the same checkpoint (``checkpoint_sha``), that
    version with ``tags`` updated and nothing logged again.
    """
    import mlflow

    sha = checkpoint_sha(checkpoint)
    tags = {**{k: str(v) for k, v in tags.items()}, "checkpoint_sha": sha}
    existing = find_checkpoint(p, sha)
    if existing is not None:
        set_tags(p, existing.version, tags)
        return get_version(p, existing.version)
    with tempfile.TemporaryDirectory(prefix="lopd-register-") as td:
        copy = Path(td) / CHECKPOINT
        shutil.copytree(checkpoint, copy, ignore=shutil.ignore_patterns(MARKER))
        (copy / CARD).write_text(card)
        info = mlflow.pyfunc.log_model(name=artifact_name, python_model=python_model, artifacts={CHECKPOINT: str(copy)},
                                       pip_requirements=requirements(), registered_model_name=model_name(p), signature=signature)
    version = info.registered_model_version
    set_tags(p, version, tags)
    describe(p, version, description)
    return get_version(p, version)


def set_tags(p: Params, version: int | str, tags: Mapping[str, Any]) -> None:
    c = client(p)
    for k, v in tags.items():
        c.set_model_version_tag(model_name(p), str(version), k, str(v))


def describe(p: Params, version: int | str, text: str) -> None:
    client(p).update_model_version(model_name(p), str(version), description=text)


def set_champion(p: Params, version: int | str) -> None:
    """Move the alias ``champion`` to ``version`` (which must exist), then copy its checkpoint to ``models/champion``."""
    get_version(p, version)
    client(p).set_registered_model_alias(model_name(p), CHAMPION, str(version))
    fetch_champion(p)


def download_checkpoint(uri: str, dest: str | Path, marker: dict | None = None) -> Path:
    """The HF checkpoint of model ``uri`` (``models:/<name>/<version>`` or ``models:/<name>@champion``) at ``dest``, atomically
    (with ``marker`` as its ``registry.json`` when given)."""
    import mlflow

    with tempfile.TemporaryDirectory(prefix="lopd-download-") as td:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=td))
        found = [d for d in local.rglob(CHECKPOINT) if (d / "config.json").exists()]
        if not found:
            raise RegistryError(f"model {uri} holds no '{CHECKPOINT}' artifact with a config.json: it was not registered by lopd")
        with atomic_path(dest) as tmp:
            shutil.copytree(found[0], tmp)
            if marker is not None:
                (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return Path(dest)


def fetch_champion(p: Params) -> Path:
    """``models/champion``: the champion's checkpoint, downloaded again only when the alias has moved.

    Its ``registry.json`` records the name, version and ``checkpoint_sha``. Raises
    :class:`RegistryError` when there is no champion yet.
    """
    mv = champion(p)
    if mv is None:
        raise RegistryError(f"registered model {model_name(p)!r} has no '{CHAMPION}' alias yet: run the pipeline with "
                            "distill.init=base and `lopd promote` (the best student on dev becomes the first champion)")
    dest = layout.champion_dir(p)
    want = {"name": model_name(p), "version": int(mv.version), "checkpoint_sha": mv.tags.get("checkpoint_sha")}
    marker = dest / MARKER
    if marker.exists() and json.loads(marker.read_text()) == want:
        return dest
    return download_checkpoint(f"models:/{model_name(p)}/{mv.version}", dest, marker=want)
