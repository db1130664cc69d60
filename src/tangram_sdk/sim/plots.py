"""PNG figures of a simulation (matplotlib is imported lazily: install the ``plot`` extra).

``write_plots(results, sweep_rows, dir)`` writes a small set of figures into ``dir``:

* ``act-cdf.png`` -- the distribution of action completion times, one curve per policy;
* ``act-breakdown.png`` -- mean ACT split into queueing, system overhead and execution;
* ``utilisation.png`` -- busy and allocated (dotted) units over time, CPU and GPU in
  separate panels (a mixed pool gets both);
* ``sweep.png`` -- mean ACT and the ratio to Tangram against batch size (with a batch sweep).

Every policy keeps one colour, line style and marker in all figures; Tangram is drawn thick and
underneath, the others thinner on top with markers at staggered points, so curves that coincide
stay visible. ``plots.json`` beside them lists each
figure's legend entries and axis labels, read from the figure objects (a PNG cannot be searched
for text), for tests and for anyone post-processing the run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .engine import Result
from .metrics import act_array, summarise, timeline

__all__ = ["write_plots", "figure_act_cdf", "figure_breakdown", "figure_utilisation", "figure_sweep"]

_STYLE = {  # policy -> (colour, line style, marker)
    "tangram": ("#d62728", "-", "o"),
    "static": ("#1f77b4", "--", "s"),
    "isolated": ("#9467bd", "-.", "D"),
    "fifo1": ("#2ca02c", ":", "^"),
    "fifo4": ("#ff7f0e", "--", "v"),
    "fifo16": ("#8c564b", "-.", "P"),
}
_EXTRA = [("#17becf", ":", "X"), ("#bcbd22", "--", "*"), ("#7f7f7f", "-.", "h"), ("#e377c2", ":", "<")]


def _plt() -> Any:
    from .._optional import require

    matplotlib = require("matplotlib", needed_by="--plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(policy: str, order: Sequence[str]) -> dict[str, Any]:
    if policy in _STYLE:
        c, ls, m = _STYLE[policy]
    else:
        others = [p for p in order if p not in _STYLE]
        c, ls, m = _EXTRA[others.index(policy) % len(_EXTRA)] if policy in others else _EXTRA[0]
    # Tangram thick and underneath, the others thinner on top: where curves coincide both stay visible
    wide = policy == "tangram"
    return {"color": c, "linestyle": ls, "marker": m, "linewidth": 3.2 if wide else 1.4,
            "zorder": 1 if wide else 3, "markersize": 5, "alpha": 0.85 if wide else 1.0}


def _title(results: Sequence[Result]) -> str:
    r = results[0]
    pool = " + ".join(x for x in (f"{r.pool_cpus} cores" if r.pool_cpus else "",
                                  f"{r.pool_gpus} GPUs" if r.pool_gpus else "") if x)
    return f"{r.workload}: {len(r.traj_end)} trajectories, pool {pool or 'empty'}"


def figure_act_cdf(results: Sequence[Result]) -> Any:
    """Cumulative distribution of action completion times (log x), one curve per policy."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    order = [r.policy for r in results]
    for i, r in enumerate(results):
        a = np.sort(act_array(r))
        if not len(a):
            continue
        st = _style(r.policy, order)
        step = max(1, len(a) // 10)
        ax.plot(np.maximum(a, 1e-3), np.arange(1, len(a) + 1) / len(a), label=r.policy,
                markevery=(min(len(a) - 1, (i * step) // max(1, len(results))), step), **st)
    ax.set_xscale("log")
    ax.set_xlabel("action completion time, queueing + overhead + execution (seconds, log scale)")
    ax.set_ylabel("fraction of actions completed within that time")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="both")
    ax.legend(title="policy", loc="lower right")
    if results:
        ax.set_title(_title(results))
    fig.tight_layout()
    return fig


def figure_breakdown(results: Sequence[Result]) -> Any:
    """Mean ACT per policy as stacked bars: queueing, system overhead, execution."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    rows = [summarise(r) for r in results]
    names = [r["policy"] for r in rows]
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for key, label, colour, hatch in (("queue_mean_s", "queueing", "#c7c7c7", "//"),
                                      ("overhead_mean_s", "system overhead", "#ffbb78", ".."),
                                      ("exec_mean_s", "execution", "#6baed6", "")):
        vals = np.array([max(0.0, r[key]) for r in rows])
        ax.bar(x, vals, bottom=bottom, label=label, color=colour, hatch=hatch, edgecolor="#444444")
        bottom += vals
    ax.set_xticks(x, names)
    ax.set_xlabel("policy")
    ax.set_ylabel("mean action completion time (seconds)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(title="part of ACT")
    if results:
        ax.set_title(_title(results))
    fig.tight_layout()
    return fig


def figure_utilisation(results: Sequence[Result]) -> Any:
    """Busy and allocated (dotted) share of the pool over time; CPU and GPU panels apart."""
    plt = _plt()
    kinds = [k for k, attr in (("cpu", "pool_cpus"), ("gpu", "pool_gpus"))
             if any(getattr(r, attr) for r in results)] or ["cpu"]
    fig, axes = plt.subplots(len(kinds), 1, figsize=(10, 1.0 + 3.6 * len(kinds)), squeeze=False, sharex=True)
    order = [r.policy for r in results]
    for ax, kind in zip(axes[:, 0], kinds):
        for r in results:
            total = r.pool_cpus if kind == "cpu" else r.pool_gpus
            if not total:
                continue
            tl = timeline(r, bins=120)
            st = _style(r.policy, order)
            st.pop("marker")
            busy = 100 * tl[f"{kind}_busy"] / total
            ax.plot(tl["t"], busy, label=f"{r.policy} busy", **st)
            alloc = 100 * tl[f"{kind}_alloc"] / total
            if np.any(alloc - busy > 1e-6):
                ax.plot(tl["t"], alloc, label=f"{r.policy} allocated",
                        **{**st, "linestyle": (0, (1, 1)), "linewidth": 1.2, "alpha": 0.9})
        unit = "cores" if kind == "cpu" else "GPUs"
        ax.set_ylabel(f"{unit} in use (% of pool)")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=f"{kind.upper()} pool")
        ax.set_title(f"{'CPU' if kind == 'cpu' else 'GPU'}: busy = running an action, "
                     "allocated = held (e.g. an idle static sandbox)", fontsize=9)
    axes[-1, 0].set_xlabel("simulated time since the step started (seconds)")
    if results:
        fig.suptitle(_title(results))
    fig.tight_layout()
    return fig


def figure_sweep(rows: Sequence[dict[str, Any]]) -> Any:
    """Mean ACT per policy against batch size, and each baseline's ratio to Tangram."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    pols = sorted({r["policy"] for r in rows}, key=lambda p: (p == "tangram", p))  # tangram last: on top
    batches = sorted({r["trajectories"] for r in rows})
    val = {(r["policy"], r["trajectories"]): r["act_mean_s"] for r in rows}
    for p in pols:
        st = _style(p, pols)
        ax1.plot(batches, [val.get((p, b), np.nan) for b in batches], label=p, **st)
        if p != "tangram":
            ratio = [val.get((p, b), np.nan) / val.get(("tangram", b), np.nan) for b in batches]
            ax2.plot(batches, ratio, label=f"{p} / tangram", **st)
    vals = [v for v in val.values() if v > 0]
    log = bool(vals) and max(vals) / min(vals) > 10
    if log:
        from matplotlib.ticker import ScalarFormatter

        ax1.set_yscale("log")
        ax1.yaxis.set_major_formatter(ScalarFormatter())
    ax1.set_xlabel("batch size (trajectories per RL step)")
    ax1.set_ylabel("mean action completion time (seconds" + (", log scale)" if log else ")"))
    ax1.legend(title="policy")
    ax1.grid(alpha=0.3, which="both")
    ax2.axhline(1.0, color="#444444", linewidth=0.8)
    ax2.set_xlabel("batch size (trajectories per RL step)")
    ax2.set_ylabel("mean ACT of the baseline / mean ACT of tangram (x)")
    if len(ax2.lines) > 1:
        ax2.legend(title="above 1: tangram faster")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _describe(fig: Any) -> dict[str, Any]:
    axes = []
    for ax in fig.axes:
        leg = ax.get_legend()
        axes.append({"xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "title": ax.get_title(),
                     "xticklabels": [t.get_text() for t in ax.get_xticklabels() if t.get_text()],
                     "legend": [t.get_text() for t in leg.get_texts()] if leg is not None else []})
    return {"axes": axes}


def write_plots(results: Sequence[Result], sweep_rows: Sequence[dict[str, Any]], directory: str) -> list[str]:
    """Write the figures (and ``plots.json``) into ``directory``; returns the PNG paths."""
    plt = _plt()
    os.makedirs(directory, exist_ok=True)
    figs: list[tuple[str, Any]] = []
    if results:
        figs += [("act-cdf.png", figure_act_cdf(results)), ("act-breakdown.png", figure_breakdown(results)),
                 ("utilisation.png", figure_utilisation(results))]
    if sweep_rows:
        figs.append(("sweep.png", figure_sweep(sweep_rows)))
    paths, meta = [], {}
    for name, fig in figs:
        path = os.path.join(directory, name)
        meta[name] = _describe(fig)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    with open(os.path.join(directory, "plots.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    return paths
