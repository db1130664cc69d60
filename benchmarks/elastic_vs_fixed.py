"""Elastic (Tangram) vs fixed degree of parallelism 1/4/16 on a coding-like closed-loop workload.

A 64-core pool (one NUMA node) serves ai-coding trajectories (docs/simulator.md: 40% test runs with
Amdahl p=0.9 up to 16 cores, 60% serial shell actions, sandbox-busy 47%) at three loads. Prints mean
ACT per policy and elastic's ratio to the best fixed DoP (< 1.00 means elastic wins).

    .venv/bin/python benchmarks/elastic_vs_fixed.py [--seeds 3] [--loads 16,64,160]
    .venv/bin/python benchmarks/elastic_vs_fixed.py --parallel 0.97 --cap 8 --fixed 1,2,4,8  # near-linear
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tangram_sdk.sim.metrics import summarise
from tangram_sdk.sim.workloads import ai_coding, run_policy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--loads", default="16,64,160", help="trajectories on the 64-core pool (light,medium,heavy)")
    ap.add_argument("--cores", type=int, default=64)
    ap.add_argument("--actions", default="10,30", help="min,max actions per trajectory")
    ap.add_argument("--parallel", type=float, default=0.9, help="Amdahl p of test runs (declared and true)")
    ap.add_argument("--cap", type=int, default=16, help="most cores a test run may get")
    ap.add_argument("--fixed", default="1,4,16", help="the fixed DoPs to compare with")
    args = ap.parse_args(argv)
    fixed = tuple(f"fifo{int(d)}" for d in args.fixed.split(","))
    policies = ("tangram",) + fixed
    amin, amax = (int(x) for x in args.actions.split(","))
    names = ("light", "medium", "heavy")
    loads = [int(x) for x in args.loads.split(",")]
    print(f"{'load':>7} {'traj':>5} " + " ".join(f"{p:>9}" for p in policies)
          + f" {'best fixed':>10} {'elastic/best':>12}  (mean ACT s, {args.seeds} seeds)")
    worst = 0.0
    t0 = time.perf_counter()
    for i, n in enumerate(loads):
        acts: dict[str, list[float]] = {p: [] for p in policies}
        utils: dict[str, list[float]] = {p: [] for p in policies}
        for seed in range(args.seeds):
            wl = ai_coding(n, nodes=1, cores=args.cores, seed=seed, actions_min=amin, actions_max=amax,
                           test_parallel=args.parallel, test_max_cpus=args.cap)
            for p in policies:
                s = summarise(run_policy(wl, p))
                acts[p].append(s["act_mean_s"])
                utils[p].append(s["cpu_util"])
        mean = {p: statistics.fmean(v) for p, v in acts.items()}
        best = min(fixed, key=lambda p: mean[p])
        ratio = mean["tangram"] / mean[best]
        worst = max(worst, ratio)
        label = names[i] if i < len(names) else f"load{i}"
        print(f"{label:>7} {n:>5} " + " ".join(f"{mean[p]:9.3f}" for p in policies)
              + f" {best:>10} {ratio:12.3f}"
              + "   util " + " ".join(f"{statistics.fmean(utils[p]):.0%}" for p in policies))
    print(f"worst elastic/best-fixed ratio: {worst:.3f}  ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
