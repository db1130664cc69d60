"""``tangram simulate``: options and the driver (tables, JSON, plots, sweeps, pool-size search)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .engine import Result, text_progress
from .metrics import min_pool_for, summarise
from .workloads import WORKLOADS, Workload, build, run_policy

__all__ = ["add_arguments", "run"]

_COLS = (("policy", "policy", "{}"), ("actions", "actions", "{}"), ("act_mean_s", "ACT mean", "{:.3f}"),
         ("act_p50_s", "p50", "{:.3f}"), ("act_p99_s", "p99", "{:.2f}"), ("queue_mean_s", "queue", "{:.3f}"),
         ("exec_mean_s", "exec", "{:.3f}"), ("overhead_mean_s", "ovh", "{:.3f}"), ("step_s", "step s", "{:.1f}"),
         ("util", "util", "{}"), ("vs", "ACT/tangram", "{}"), ("wall_s", "wall s", "{:.1f}"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=sorted(WORKLOADS) + ["trace"], default="ai-coding")
    p.add_argument("--trace", help="JSONL trace to replay (with --workload trace)")
    p.add_argument("--batch", type=int, default=None, help="trajectories per RL step (workload default)")
    p.add_argument("--policy", default="tangram", help="tangram|static|fifo<N>|isolated|all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nodes", type=int, default=None, help="ai-coding: CPU nodes (default 15)")
    p.add_argument("--cores", type=int, default=None, help="ai-coding: cores per node (default 256)")
    p.add_argument("--gpus", type=int, default=None, help="GPU pool size (mopd default 40, deepsearch 8)")
    p.add_argument("--cpus", type=int, default=None, help="trace: CPU pool size when the trace has no pool")
    p.add_argument("--iso-gpus", type=int, default=None,
                   help="isolated: GPUs per service (mopd default 4; else proportional to call share)")
    p.add_argument("--gpus-needed", action="store_true",
                   help="search the smallest GPU pool on which tangram matches the isolated baseline's mean ACT")
    p.add_argument("--sweep-batch", default=None, help="comma list of batch sizes, e.g. 256,512,1024,1536")
    p.add_argument("--json", dest="json_out", default=None, help="write all results as JSON here")
    p.add_argument("--plot", default=None, help="write PNG figures (ACT CDF, utilisation; sweep)")
    p.add_argument("--no-progress", action="store_true")


def _workload(args: argparse.Namespace, batch: int | None) -> Workload:
    if args.workload == "trace":
        from ..pool import Pool
        from .trace import trace_workload

        if not args.trace:
            raise SystemExit("--workload trace needs --trace PATH")
        pool = Pool(cpus=args.cpus or 0, gpus=args.gpus or 0) if (args.cpus or args.gpus) else None
        wl_trace: Workload = trace_workload(args.trace, pool)
        return wl_trace
    kw: dict[str, Any] = {"seed": args.seed}
    if args.workload == "ai-coding":
        if args.nodes is not None:
            kw["nodes"] = args.nodes
        if args.cores is not None:
            kw["cores"] = args.cores
    elif args.gpus is not None:
        kw["gpus"] = args.gpus
    return build(args.workload, batch, **kw)


def _policies(args: argparse.Namespace, wl: Workload) -> list[str]:
    if args.policy == "all":
        return list(wl.policies)
    return [p.strip() for p in args.policy.split(",") if p.strip()]


def _iso(args: argparse.Namespace, wl: Workload) -> int | None:
    if args.iso_gpus is not None:
        return int(args.iso_gpus)
    iso: int | None = wl.params.get("iso_gpus")
    return iso


def _run(args: argparse.Namespace, wl: Workload, pol: str) -> Result:
    prog = None if args.no_progress else text_progress(f"{wl.name} {pol:>8} b={len(wl.trajectories)}")
    result: Result = run_policy(wl, pol, progress=prog, iso_gpus=_iso(args, wl) if pol == "isolated" else None)
    return result


def _table(rows: list[dict[str, Any]]) -> str:
    base = {(r["workload"], r["trajectories"]): r["act_mean_s"] for r in rows if r["policy"] == "tangram"}
    cells = []
    for r in rows:
        r = dict(r)
        u = r.get("gpu_util") if r.get("pool_gpus") and r.get("gpu_busy_mean") else r.get("cpu_util")
        r["util"] = "-" if u is None else f"{u:.0%}"
        b = base.get((r["workload"], r["trajectories"]))
        r["vs"] = f"{r['act_mean_s'] / b:.2f}x" if b else "-"
        cells.append([fmt.format(r[k]) for k, _h, fmt in _COLS])
    head = [h for _k, h, _f in _COLS]
    w = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w[i]) for i, h in enumerate(head))]
    lines += ["  ".join(c[i].rjust(w[i]) for i in range(len(head))) for c in cells]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``tangram simulate``; returns the exit code."""
    out: dict[str, Any] = {"workload": args.workload, "seed": args.seed, "runs": []}
    try:
        wl = _workload(args, args.batch)
    except ValueError as exc:
        print(f"tangram simulate: {exc}", file=sys.stderr)
        return 2
    pols = _policies(args, wl)
    results: list[Result] = []
    rows: list[dict[str, Any]] = []
    for pol in pols:
        try:
            r = _run(args, wl, pol)
        except ValueError as exc:
            print(f"tangram simulate: policy {pol}: {exc}", file=sys.stderr)
            return 2
        results.append(r)
        rows.append(summarise(r))
    print(f"{wl.name}: {len(wl.trajectories)} trajectories, {wl.n_actions} actions, "
          f"pool {len(wl.pool.cpus)} cpus / {len(wl.pool.gpus)} gpus, seed {args.seed}")
    print(_table(rows))
    out["runs"] = rows
    out["params"] = {k: v for k, v in wl.params.items() if isinstance(v, (int, float, str))}
    sweep_rows: list[dict[str, Any]] = []
    if args.sweep_batch:
        for b in [int(x) for x in args.sweep_batch.split(",") if x.strip()]:
            wb = _workload(args, b)
            for pol in pols:
                sweep_rows.append(summarise(_run(args, wb, pol)))
        print("\nbatch sweep:")
        print(_table(sweep_rows))
        out["sweep"] = sweep_rows
    if args.gpus_needed:
        out["gpus_needed"] = _gpus_needed(args, wl)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    if args.plot:
        from .plots import plot_runs, plot_sweep

        plot_runs(results, args.plot)
        if sweep_rows:
            stem = args.plot[:-4] if args.plot.endswith(".png") else args.plot
            plot_sweep(sweep_rows, stem + "-sweep.png")
    return 0


def _gpus_needed(args: argparse.Namespace, wl: Workload) -> dict[str, Any]:
    """Smallest GPU pool on which tangram's mean ACT <= the isolated baseline's."""
    iso = summarise(_run(args, wl, "isolated"))
    target = iso["act_mean_s"]
    iso_gpus = (_iso(args, wl) or 1) * len(wl.services)
    cache: dict[int, float] = {}

    def act_at(g: int) -> float:
        if g not in cache:
            args2 = argparse.Namespace(**{**vars(args), "gpus": g})
            cache[g] = summarise(_run(args2, _workload(args2, len(wl.trajectories)), "tangram"))["act_mean_s"]
        return cache[g]

    need = min_pool_for(act_at, target, 1, max(iso_gpus, 1))
    res = {"isolated_gpus": iso_gpus, "isolated_act_mean_s": target, "tangram_gpus": need,
           "tangram_act_at_need_s": cache.get(need) if need else None,
           "saved": (1 - need / iso_gpus) if need else None, "probed": dict(sorted(cache.items()))}
    print(f"\nGPUs needed at equal mean ACT ({target:.3f} s): isolated {iso_gpus} -> tangram {need}"
          + (f" ({res['saved']:.1%} saved)" if need else " (not reached)"))
    return res
