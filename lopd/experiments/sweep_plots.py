"""A sweep's plots: dev curves and LOPD's per-step dynamics, mean ± 1 std over seeds.

Pure functions over each seed's ``distill.json`` ``details`` (method → curve, history);
:mod:`lopd.experiments.sweep_report` calls them and logs the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from lopd.io import atomic_path

DYNAMICS = (("beta", "β (dual variable)"), ("delta", "Δ: trajectory margin (nats)"), ("kl", "KL(π_S ‖ π_T) per token"),
            ("margin_violation", "margin violation m − Δ"))
COLORS = {"lopd": "C0", "opsd": "C1", "grpo": "C2", "sft": "C3", "vanilla": "gray"}


def stacked(details: Mapping[int, Mapping], method: str, series: str, x: str, y: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x_P, y_SP)``: ``series`` (``curve`` or ``history``) of ``method`` over seeds, aligned by index.

    Every seed evaluates at the same steps, so point i is the same step in each seed; x is the
    mean over seeds (identical for generations, the mean wall-clock for seconds).
    """
    rows = [d[method][series] for d in details.values() if d.get(method, {}).get(series)]
    n = min(len(r) for r in rows)
    xs = np.array([[pt[x] for pt in r[:n]] for r in rows], dtype=float)
    ys = np.array([[np.nan if pt.get(y) is None else pt[y] for pt in r[:n]] for r in rows], dtype=float)
    return xs.mean(axis=0), ys


def _band(ax, x, ys, label, color, marker="o"):
    mean, std = np.nanmean(ys, axis=0), np.nanstd(ys, axis=0, ddof=1) if len(ys) > 1 else np.zeros(ys.shape[1])
    ax.plot(x, mean, marker=marker, ms=3, label=label, color=color)
    ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=color)


def plot_dev_curves(details: Mapping[int, Mapping], methods: Sequence[str], x: str, path: Path) -> Path:
    """Dev success and reward against ``x`` (``rollouts_cum`` or ``train_wall_s``), mean ± 1 std over seeds."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, y in zip(axes, ("dev_success", "dev_reward")):
        for m in methods:
            if m == "vanilla":
                base = [d["vanilla"]["curve"][0][y] for d in details.values() if "vanilla" in d]
                if base:
                    ax.axhline(float(np.mean(base)), ls="--", c=COLORS["vanilla"], label="vanilla (base)")
                continue
            xs, ys = stacked(details, m, "curve", x, y)
            _band(ax, xs, ys, m, COLORS.get(m))
        xlabel = "generations (cumulative rollouts)" if x == "rollouts_cum" else "training wall-clock (s, mean over seeds)"
        ax.set(xlabel=xlabel, ylabel=y.replace("_", " "), title=f"{y.replace('_', ' ')}: mean ± 1 std over {len(details)} seeds")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def plot_dynamics(runs: Mapping[str, Mapping[int, Mapping]], path: Path, keys: Sequence[str] | None = None,
                  method_of: Mapping[str, str] | None = None) -> Path:
    """β, Δ, KL and margin violation over steps, one line (mean ± 1 std over seeds) per run label.

    ``method_of``: the method each label plots (default lopd), e.g. OPSD's Δ and KL beside LOPD's.
    """
    import matplotlib.pyplot as plt

    panels = [(k, t) for k, t in DYNAMICS if keys is None or k in keys]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (key, title) in zip(np.atleast_1d(axes), panels):
        for i, (label, details) in enumerate(runs.items()):
            method = (method_of or {}).get(label, "lopd")
            if not any(key in (d.get(method, {}).get("history") or [{}])[0] for d in details.values()):
                continue  # OPSD has no β or margin
            xs, ys = stacked(details, method, "history", "step", key)
            _band(ax, xs, ys, label, f"C{i}", marker=".")
        ax.axhline(0.0, c="k", lw=0.5)
        ax.set(xlabel="step", title=title)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


