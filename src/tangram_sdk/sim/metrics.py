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


def summarise(r: Result, step: int | None = None) -> dict[str, Any]:
    """One flat dict per run (JSON-friendly). ``step``: only that RL step's actions, its own length
    (barrier to last trajectory end) as ``step_s`` and units averaged over it (a multi-step run,
    :attr:`.Trajectory.step`); None: the whole run."""
    end = np.asarray(r.end)
    sub = np.asarray(r.submit)
    gr = np.asarray(r.grant)
    exec_s = np.asarray(r.exec_s)
    overhead = np.asarray(r.overhead)
    t0 = 0.0
    if step is None:
        step = -1
        t_end = float(np.nanmax(r.traj_end)) if r.traj_end else 0.0
        tl = timeline(r, bins=1)
        means = {k: float(tl[k][0]) for k in ("cpu_alloc", "cpu_busy", "gpu_alloc", "gpu_busy")}
    else:
        if not 0 <= step < len(r.step_start):
            raise ValueError(f"step {step} not in this run (steps 0..{len(r.step_start) - 1})")
        t0 = r.step_start[step]
        ts = np.asarray(r.traj_step)
        t_end = float(np.nanmax(np.asarray(r.traj_end)[ts == step]))
        mine = ts[np.asarray(r.traj, dtype=int)] == step if r.traj else np.zeros(0, dtype=bool)
        end, sub, gr, exec_s, overhead = end[mine], sub[mine], gr[mine], exec_s[mine], overhead[mine]
        means = _window_means(r, t0, t_end)
    act = end - sub
    n = len(act)
    span = t_end - t0
    out: dict[str, Any] = {
        "workload": r.workload, "policy": r.policy, "actions": n,
        "trajectories": len(r.traj_end) if step < 0 else r.traj_step.count(step),
        "act_mean_s": float(act.mean()) if n else 0.0,
        "act_p50_s": float(np.percentile(act, 50)) if n else 0.0,
        "act_p99_s": float(np.percentile(act, 99)) if n else 0.0,
        "queue_mean_s": float((gr - sub).mean()) if n else 0.0,
        "exec_mean_s": float(np.mean(exec_s)) if n else 0.0,
        "overhead_mean_s": float(np.mean(overhead)) if n else 0.0,
        "step_s": span,
        "pool_cpus": r.pool_cpus, "pool_gpus": r.pool_gpus,
        "cpu_alloc_mean": means["cpu_alloc"] if span else 0.0,
        "cpu_busy_mean": means["cpu_busy"] if span else 0.0,
        "gpu_alloc_mean": means["gpu_alloc"] if span else 0.0,
        "gpu_busy_mean": means["gpu_busy"] if span else 0.0,
        "restores": r.restores, "wall_s": r.wall_s,
    }
    if step >= 0:
        out["step"] = step
    out["cpu_util"] = out["cpu_busy_mean"] / r.pool_cpus if r.pool_cpus else None
    out["gpu_util"] = out["gpu_busy_mean"] / r.pool_gpus if r.pool_gpus else None
    out["cpu_core_s"] = out["cpu_alloc_mean"] * span
    out["gpu_s"] = out["gpu_alloc_mean"] * span
    return out


def _window_means(r: Result, t0: float, t1: float) -> dict[str, float]:
    """Units allocated and busy averaged over ``[t0, t1]``: the run's integrals to each end, differenced."""
    a = timeline(r, bins=1, until=t1)
    b = timeline(r, bins=1, until=t0) if t0 > 0 else None
    span = t1 - t0
    return {k: (float(a[k][0]) * t1 - (float(b[k][0]) * t0 if b is not None else 0.0)) / span if span > 0 else 0.0
            for k in ("cpu_alloc", "cpu_busy", "gpu_alloc", "gpu_busy")}


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
