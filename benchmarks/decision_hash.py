"""Decision-log hashes: the guard for refactors that must not change a single decision.

Runs seeded workloads through the simulator (the same scheduler core the runtime drives) with an
observer that hashes every ``(events, time, decisions)`` entry, and prints one hash per workload.
Record them before a refactor, compare after::

    python benchmarks/decision_hash.py --save /tmp/before.json
    ... refactor ...
    python benchmarks/decision_hash.py --check /tmp/before.json     # exit 1 on any difference

The workloads cover every decision path: priced CPU sizing with start-or-wait on NUMA nodes,
malleable resizes and restarts of restartable stragglers, efficiency learned from measured
parallelism (down, and up past a flat declaration), the
GPU planner with restores and residency, its width switches (urgent narrowings, measured waits, a
spill beside one cell, a width recalled after a lull between two RL steps), and quotas with rate
limits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from tangram_sdk.sim.engine import simulate
from tangram_sdk.sim.workloads import Workload, ai_coding, deepsearch, mopd, rl_steps


def _workloads() -> dict[str, Callable[[], Workload]]:
    return {
        "ai-coding light": lambda: ai_coding(96, nodes=2, cores=128, seed=1),
        "ai-coding contended": lambda: ai_coding(160, nodes=1, cores=128, seed=2, test_max_cpus=32),
        "ai-coding slow truth": lambda: ai_coding(96, nodes=1, cores=160, seed=3, true_parallel=0.5),
        "mopd 10 gpus": lambda: mopd(128, gpus=10, seed=4),
        "mopd tp1 16 gpus": lambda: mopd(128, gpus=16, seed=5, teacher_max_gpus=1),
        "deepsearch": lambda: deepsearch(128, seed=6, judge_work_mean=0.5),
        "ai-coding malleable": lambda: ai_coding(160, nodes=1, cores=128, seed=7, test_max_cpus=32,
                                                 test_malleable=True),
        # restartable stragglers: 4 restarts on this trace
        "ai-coding restartable": lambda: ai_coding(160, nodes=1, cores=128, seed=7, test_max_cpus=32,
                                                   test_restartable=True),
        "mopd estimate planner": lambda: mopd(96, gpus=8, seed=8),
        # the GPU width rules: a spill beside one TP-4 cell; urgent narrowings, a false alarm
        # and measured waits (the judge burst); the heavy step's peak (urgent, calibration)
        "mopd spill 6 gpus": lambda: mopd(256, gpus=6, seed=9),
        "deepsearch judge burst": lambda: deepsearch(2048, seed=0),
        "mopd heavy 8 gpus": lambda: mopd(4096, gpus=8, seed=0),
        # two RL steps: the width the first step's peak needed, recalled after the lull
        "deepsearch two steps": lambda: rl_steps(deepsearch, 512, steps=2, seed=10, gpus=8, judge_work_mean=3.0),
        # measured runs (_MEASURED): tests that scale better than declared, slow ones, and tests
        # declared flat (explored on idle cores, then upgraded to a fitted Amdahl shape)
        "ai-coding measured": lambda: ai_coding(160, nodes=1, cores=128, seed=2, test_max_cpus=32),
        "ai-coding measured slow": lambda: ai_coding(96, nodes=1, cores=160, seed=3, true_parallel=0.5),
        "ai-coding declared flat": lambda: ai_coding(96, nodes=1, cores=128, seed=4, test_parallel=0.0,
                                                     true_parallel=0.9, think_parallel=0.9),
    }


# Scheduler options per workload (the default elsewhere): the estimate planner is its own path.
_OPTIONS: dict[str, dict[str, Any]] = {"mopd estimate planner": {"planner": "estimate"}}
# Released actions report the parallelism their work got (lease.run/exec live; simulate(measured=))
_MEASURED = {"ai-coding measured", "ai-coding measured slow", "ai-coding declared flat"}


class _Hasher:
    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.entries = 0

    def __call__(self, events: Any, now: float, decisions: Any) -> None:
        self.h.update(repr((tuple(events), round(now, 9), tuple(decisions))).encode())
        self.entries += 1


def run(policy: str = "tangram") -> dict[str, dict[str, Any]]:
    from tangram_sdk.sim.baselines import make_policy

    out = {}
    for name, build in _workloads().items():
        wl = build()
        opts: dict[str, Any] = dict(_OPTIONS.get(name, {}))
        if wl.pool.gpus:
            opts["gpu_slots"] = wl.gpu_slots
        pol = make_policy(policy, wl.pool, **opts)
        hasher = _Hasher()
        t0 = time.perf_counter()
        simulate(wl.trajectories, pol, workload=wl.name, restore_s=wl.restore_s, gpu_slots=wl.gpu_slots,
                 observers=[hasher], measured=name in _MEASURED)
        out[name] = {"sha256": hasher.h.hexdigest()[:16], "entries": hasher.entries,
                     "seconds": round(time.perf_counter() - t0, 2)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", help="write the hashes to this JSON file")
    ap.add_argument("--check", help="compare with hashes saved earlier; exit 1 on a difference")
    args = ap.parse_args(argv)
    res = run()
    for name, r in res.items():
        print(f"{name:24} {r['sha256']}  {r['entries']:6d} entries  {r['seconds']:.1f} s")
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            before = json.load(f)
        diff = [n for n in res if before.get(n, {}).get("sha256") != res[n]["sha256"]]
        if diff:
            print(f"DIFFERENT: {', '.join(diff)}")
            return 1
        print("identical decision logs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
