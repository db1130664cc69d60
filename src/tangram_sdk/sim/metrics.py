"""Numbers from a simulation :class:`~.engine.Result`: ACT (mean/p50/p99) split into queueing,
execution and system overhead; RL step duration; resource use and utilisation over time; and the
smallest pool that meets a latency target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .engine import Result

__all__ = ["summarise", "timeline", "min_pool_for", "act_array"]


def act_array(r: Result) -> np.ndarray:
    out: np.ndarray = np.asarray(r.end, dtype=float) - np.asarray(r.submit, dtype=float)
    return out


def summarise(r: Result) -> dict[str, Any]:
    """One flat dict per run (JSON-friendly)."""
    end = np.asarray(r.end)
    sub = np.asarray(r.submit)
    gr = np.asarray(r.grant)
    act = end - sub
    n = len(act)
    step = float(np.nanmax(r.traj_end)) if r.traj_end else 0.0
    tl = timeline(r, bins=1)
    out: dict[str, Any] = {
        "workload": r.workload, "policy": r.policy, "actions": n, "trajectories": len(r.traj_end),
        "act_mean_s": float(act.mean()) if n else 0.0,
        "act_p50_s": float(np.percentile(act, 50)) if n else 0.0,
        "act_p99_s": float(np.percentile(act, 99)) if n else 0.0,
        "queue_mean_s": float((gr - sub).mean()) if n else 0.0,
        "exec_mean_s": float(np.mean(r.exec_s)) if n else 0.0,
        "overhead_mean_s": float(np.mean(r.overhead)) if n else 0.0,
        "step_s": step,
        "pool_cpus": r.pool_cpus, "pool_gpus": r.pool_gpus,
        "cpu_alloc_mean": float(tl["cpu_alloc"][0]) if step else 0.0,
        "cpu_busy_mean": float(tl["cpu_busy"][0]) if step else 0.0,
        "gpu_alloc_mean": float(tl["gpu_alloc"][0]) if step else 0.0,
        "gpu_busy_mean": float(tl["gpu_busy"][0]) if step else 0.0,
        "restores": r.restores, "wall_s": r.wall_s,
    }
    out["cpu_util"] = out["cpu_busy_mean"] / r.pool_cpus if r.pool_cpus else None
    out["gpu_util"] = out["gpu_busy_mean"] / r.pool_gpus if r.pool_gpus else None
    out["cpu_core_s"] = out["cpu_alloc_mean"] * step
    out["gpu_s"] = out["gpu_alloc_mean"] * step
    return out


def timeline(r: Result, bins: int = 200, until: float | None = None) -> dict[str, np.ndarray]:
    """Time-averaged allocated and busy units per bin over ``[0, until]`` (default: the step).
    ``alloc`` counts what a policy holds (a static sandbox's cores even while its trajectory
    thinks); ``busy`` what actions are actually running on."""
    end = until if until is not None else (float(np.nanmax(r.traj_end)) if r.traj_end else 0.0)
    edges = np.linspace(0.0, end, bins + 1) if end > 0 else np.zeros(bins + 1)
    cols = {"cpu_alloc": 1, "cpu_busy": 2, "gpu_alloc": 3, "gpu_busy": 4}
    out: dict[str, np.ndarray] = {"t": (edges[:-1] + edges[1:]) / 2}
    if not r.changes or end <= 0:
        for k in cols:
            out[k] = np.zeros(bins)
        return out
    ch = np.asarray(r.changes, dtype=float)
    order = np.argsort(ch[:, 0], kind="stable")
    ch = ch[order]
    t = ch[:, 0]
    for name, c in cols.items():
        level = np.cumsum(ch[:, c])  # value after each change point
        # integral of the step function up to each edge
        seg_t = np.append(t, end)
        dt = np.clip(np.diff(seg_t), 0, None)
        cum = np.concatenate([[0.0], np.cumsum(level * dt)])  # integral at t[0..], end
        pts = np.concatenate([t, [end]])

        def integral(x: np.ndarray, pts: np.ndarray = pts, cum: np.ndarray = cum,
                     level: np.ndarray = level) -> np.ndarray:
            i = np.searchsorted(pts, x, side="right") - 1
            i = np.clip(i, 0, len(pts) - 1)
            base = cum[i]
            lvl = np.where(i < len(level), level[np.minimum(i, len(level) - 1)], 0.0)
            lvl = np.where(x < pts[0], 0.0, lvl)
            return np.where(x < pts[0], 0.0, base + lvl * (x - pts[i]))

        integ = integral(edges)
        out[name] = np.diff(integ) / np.diff(edges)
    return out


def min_pool_for(run: Callable[[int], float], target: float, lo: int, hi: int) -> int | None:
    """Smallest size in ``[lo, hi]`` whose ``run(size)`` (a latency) is <= ``target``, by bisection
    (latency is assumed non-increasing in pool size); None when even ``hi`` misses it."""
    if run(hi) > target:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if run(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return lo
