"""``tangram demo``: a small agentic-rollout workload, run live on this machine, twice.

Each trajectory alternates "thinking" (an LLM decoding; here a sleep) with a CPU action: a real
subprocess pinned to the lease's cores, whose busy-loop work is split over ``lease.units``
processes, so more cores really do finish it sooner.

* **static**: what trajectory-level provisioning does. A trajectory takes a fixed sandbox of
  ``cores / trajectories`` cores (at least 1) at its first action and holds it until it ends, so
  trajectories queue for sandboxes and a sandbox idles while its trajectory thinks.
* **tangram**: every action acquires cores for itself alone, elastically (1..all cores).

Both runs use the same seeded workload; the table compares average action completion time (ACT:
queueing + execution) and wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass, field

from ._cpuset import format_cpuset, parse_cpuset
from .pool import Pool
from .runtime import Tangram
from .spec import ActionSpec, Amdahl, Elasticity

# The action: spin for `iters` loop iterations split across `k` pinned worker processes.
_WORK = r"""
import os, sys
from multiprocessing import Process
iters, k = int(sys.argv[1]), int(sys.argv[2])
def spin(n):
    x = 0
    for i in range(n):
        x += i
if k <= 1:
    spin(iters)
else:
    ps = [Process(target=spin, args=(iters // k,)) for _ in range(k)]
    [p.start() for p in ps]
    [p.join() for p in ps]
"""


def _calibrate() -> float:
    """Loop iterations per second on one core (so --work means single-core seconds)."""
    n = 200_000
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return n / max(time.perf_counter() - t0, 1e-6)


@dataclass
class _Run:
    name: str
    acts: list[float] = field(default_factory=list)
    queued: list[float] = field(default_factory=list)
    wall: float = 0.0
    units: list[int] = field(default_factory=list)


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled, self.label = total, 0, enabled and sys.stderr.isatty(), ""

    def tick(self) -> None:
        self.done += 1
        if self.enabled:
            bar = "#" * (30 * self.done // self.total)
            sys.stderr.write(f"\r{self.label:<8} [{bar:<30}] {self.done}/{self.total}")
            sys.stderr.flush()

    def end(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


async def _trajectory(t: Tangram, mode: str, plan: list[tuple[float, int]], cores: int, sandbox: int,
                      run: _Run, progress: _Progress) -> None:
    loop = asyncio.get_running_loop()
    elastic = ActionSpec(kind="run_tests", cpus=1,
                         elastic=Elasticity("cpu", max_units=cores, efficiency=Amdahl(0.95)))
    held = None
    try:
        for think, iters in plan:
            await asyncio.sleep(think)
            arrived = loop.time()
            if mode == "static":
                if held is None:  # a sandbox is bound to the trajectory at its first action
                    held = t.acquire(ActionSpec(kind="sandbox", cpus=sandbox))
                    lease = await held.__aenter__()
                queued = loop.time() - arrived
                r = await lease.run([sys.executable, "-c", _WORK, str(iters), str(len(lease.cpus))])
                run.units.append(len(lease.cpus))
            else:
                async with t.acquire(elastic) as lease:
                    queued = lease.queued_s
                    r = await lease.run([sys.executable, "-c", _WORK, str(iters), str(lease.units)])
                    run.units.append(lease.units)
            if not r.ok:
                raise RuntimeError(f"demo action failed: {r.stderr.decode()[-300:]}")
            run.acts.append(loop.time() - arrived)
            run.queued.append(queued)
            progress.tick()
    finally:
        if held is not None:
            await held.__aexit__(None, None, None)


async def _run_mode(mode: str, pool: Pool, plans: list[list[tuple[float, int]]], sandbox: int,
                    progress: _Progress) -> _Run:
    run = _Run(mode)
    progress.label = mode
    t0 = time.perf_counter()
    async with Tangram(pool) as t:
        await asyncio.gather(*[_trajectory(t, mode, p, len(pool.cpus), sandbox, run, progress) for p in plans])
        t.scheduler.check_invariants()
    run.wall = time.perf_counter() - t0
    return run


def run_demo(args: argparse.Namespace) -> int:
    cpus = parse_cpuset(args.cpus) if args.cpus else tuple(sorted(os.sched_getaffinity(0)))
    pool = Pool(cpus=list(cpus))
    if args.trajectories is None:
        args.trajectories = len(cpus)
    rng = random.Random(args.seed)
    rate = _calibrate()
    plans = []
    for _ in range(args.trajectories):
        plan = []
        for _ in range(args.actions):
            think = rng.expovariate(1.0 / args.think)
            work = args.work * rng.lognormvariate(0.0, 0.5)  # heavy-ish tail, mean ~1.13x
            plan.append((think, int(work * rate)))
        plans.append(plan)
    sandbox = max(1, len(cpus) // args.trajectories)
    total = args.trajectories * args.actions
    print(f"tangram demo: {args.trajectories} trajectories x {args.actions} actions on cores "
          f"{format_cpuset(cpus)} ({len(cpus)}); work ~{args.work}s single-core/action, think ~{args.think}s")
    print(f"static sandbox = {sandbox} core(s) per trajectory, held for the trajectory's life\n")
    results = []
    for mode in ("static", "tangram"):
        progress = _Progress(total, not args.no_progress)
        results.append(asyncio.run(_run_mode(mode, pool, plans, sandbox, progress)))
        progress.end()
    print(f"{'policy':<10}{'mean ACT s':>12}{'mean queue s':>14}{'mean cores':>12}{'wall s':>10}")
    for r in results:
        print(f"{r.name:<10}{sum(r.acts) / len(r.acts):>12.3f}{sum(r.queued) / len(r.queued):>14.3f}"
              f"{sum(r.units) / len(r.units):>12.2f}{r.wall:>10.2f}")
    s, t = results
    print(f"\nTangram vs static: ACT {(sum(s.acts) / len(s.acts)) / (sum(t.acts) / len(t.acts)):.2f}x lower, "
          f"wall {s.wall / t.wall:.2f}x faster")
    return 0
