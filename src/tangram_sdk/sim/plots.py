"""PNG figures (matplotlib is imported lazily: install the ``plot`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .engine import Result
from .metrics import act_array, timeline

__all__ = ["plot_runs", "plot_sweep"]


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover
        raise SystemExit("--plot needs matplotlib: pip install 'tangram-sdk[plot]'") from exc
    return plt


def plot_runs(results: Sequence[Result], path: str) -> None:
    """ACT CDF (log x) and utilisation timeline of every policy, side by side."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        a = np.sort(act_array(r))
        if len(a):
            ax1.plot(np.maximum(a, 1e-3), np.arange(1, len(a) + 1) / len(a), label=r.policy)
        tl = timeline(r, bins=200)
        gpu = r.pool_gpus > 0 and (r.pool_cpus == 0 or tl["gpu_busy"].max() > 0)
        key, total = ("gpu", r.pool_gpus) if gpu else ("cpu", r.pool_cpus)
        line = ax2.plot(tl["t"], tl[f"{key}_busy"] / max(1, total), label=f"{r.policy} busy")[0]
        if np.any(tl[f"{key}_alloc"] - tl[f"{key}_busy"] > 1e-9):
            ax2.plot(tl["t"], tl[f"{key}_alloc"] / max(1, total), ls="--", color=line.get_color(),
                     label=f"{r.policy} allocated")
    ax1.set_xscale("log")
    ax1.set_xlabel("action completion time (s)")
    ax1.set_ylabel("CDF")
    ax1.grid(alpha=0.3)
    ax1.legend()
    ax2.set_xlabel("simulated time (s)")
    ax2.set_ylabel("fraction of pool")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    if results:
        fig.suptitle(f"{results[0].workload}: {len(results[0].traj_end)} trajectories")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(rows: Sequence[dict[str, Any]], path: str, metric: str = "act_mean_s") -> None:
    """Mean ACT per policy against batch size (and the ratio to tangram)."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    pols = sorted({r["policy"] for r in rows})
    batches = sorted({r["trajectories"] for r in rows})
    val = {(r["policy"], r["trajectories"]): r[metric] for r in rows}
    for p in pols:
        ax1.plot(batches, [val.get((p, b), np.nan) for b in batches], marker="o", label=p)
        if p != "tangram":
            ax2.plot(batches, [val.get((p, b), np.nan) / val.get(("tangram", b), np.nan) for b in batches],
                     marker="o", label=f"{p} / tangram")
    ax1.set_yscale("log")
    ax1.set_xlabel("batch (trajectories)")
    ax1.set_ylabel(metric)
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.set_xlabel("batch (trajectories)")
    ax2.set_ylabel("ACT ratio (baseline / tangram)")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
