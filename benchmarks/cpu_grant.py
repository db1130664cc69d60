"""Benchmark the Docker CPU manager on real containers.

1. Grant+park overhead per action for each backend (``api``: Docker Engine update call;
   ``cgroup``: direct cgroupfs writes), median and p99 over ``--actions`` actions, and the ratio
   api/cgroup measured in the same run (target: cgroup median <= 1 ms and >= 20x faster).
2. Average action completion time (ACT = queueing + execution) of a small coding-like workload:
   ``--trajectories`` trajectories x ``--steps`` actions, each a CPU busy loop followed by model
   "thinking" time, under trajectory-static reservation (every container permanently holds
   pool/trajectories cores as a CFS quota) vs allocate-on-execution (Tangram + DockerCpuManager:
   parked while thinking, exclusive cores while acting).

Run (as root, after ``bash scripts/docker-up.sh``)::

    .venv/bin/python benchmarks/cpu_grant.py [--actions 500] [--skip-act]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from tangram_sdk._cpuset import format_cpuset
from tangram_sdk.lease import Lease
from tangram_sdk.managers.base import ManagerContext
from tangram_sdk.managers.cpu import DockerCpuManager, SandboxPool
from tangram_sdk.pool import Pool
from tangram_sdk.scheduler.decisions import Grant
from tangram_sdk.spec import ActionSpec

IMAGE = os.environ.get("TANGRAM_TEST_IMAGE", "tangram-test:busybox")
HOST = tuple(sorted(os.sched_getaffinity(0)))
BUSY = "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done"


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def overhead(backend: str, actions: int) -> dict[str, float]:
    m = DockerCpuManager(backend=backend)  # type: ignore[arg-type]
    await m.start(ManagerContext(Pool(cpus=list(HOST)), post=lambda e: None))
    try:
        async with await SandboxPool.create(m, image=IMAGE, count=1) as pool:
            cid = pool[0].id
            applies, releases, totals = [], [], []
            for i in range(actions + 10):
                cpus = HOST if i % 2 else HOST[:1]
                spec = ActionSpec(kind="bench", cpus=len(cpus), container=cid)
                lease = Lease(i, spec, cpus=cpus, gpus=(), units=0, memory=0, quotas=(), queued_s=0.0,
                              granted_at=0.0)
                grant = Grant(i, cpus=cpus)
                t0 = time.perf_counter()
                await m.apply(grant, lease)
                t1 = time.perf_counter()
                await m.release(grant, lease)
                t2 = time.perf_counter()
                if i >= 10:  # warm-up: first inspect, cgroup lookup, API version probe
                    applies.append(t1 - t0)
                    releases.append(t2 - t1)
                    totals.append(t2 - t0)
            assert m.active_backend == backend
    finally:
        await m.aclose()
    return {
        "median_ms": statistics.median(totals) * 1e3,
        "p99_ms": _pct(totals, 0.99) * 1e3,
        "apply_median_ms": statistics.median(applies) * 1e3,
        "release_median_ms": statistics.median(releases) * 1e3,
    }


async def _calibrate(m: DockerCpuManager, cid: str, work_s: float) -> int:
    """Busy-loop iterations that take ``work_s`` on one granted core inside the container."""
    spec = ActionSpec(kind="cal", cpus=1, container=cid)
    lease = Lease(0, spec, cpus=HOST[:1], gpus=(), units=0, memory=0, quotas=(), queued_s=0, granted_at=0)
    await m.apply(Grant(0, cpus=HOST[:1]), lease)
    try:
        n = 20_000
        while True:
            t0 = time.perf_counter()
            r = await lease.exec(["sh", "-c", BUSY.format(n=n)], timeout=120)
            dt = time.perf_counter() - t0
            assert r.ok, r
            if dt > 0.3:
                return max(1, int(n * work_s / dt))
            n *= 2
    finally:
        await m.release(Grant(0, cpus=HOST[:1]), lease)


async def act(trajectories: int, steps: int, work_s: float, think_s: float) -> dict[str, dict[str, float]]:
    from tangram_sdk import Tangram

    out: dict[str, dict[str, float]] = {}
    manager = DockerCpuManager()
    async with Tangram(Pool(cpus=list(HOST)), managers=[manager]) as tangram, \
            await SandboxPool.create(manager, image=IMAGE, count=trajectories) as pool:
        n = await _calibrate(manager, pool[0].id, work_s)
        cmd = ["sh", "-c", BUSY.format(n=n)]

        # -- trajectory-static reservation: each container permanently holds its share --------
        share = max(1000, int(len(HOST) * manager.period_us / trajectories))
        for s in pool:
            await manager.client.update_cpu(s.id, format_cpuset(HOST), share, manager.period_us)
        acts: list[float] = []

        async def static_traj(i: int) -> None:
            for _ in range(steps):
                await asyncio.sleep(think_s)
                t0 = time.perf_counter()
                r = await manager.client.exec(pool[i].id, cmd, timeout=600)
                assert r.ok, r
                acts.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(static_traj(i) for i in range(trajectories)))
        out["static"] = {"act_s": statistics.mean(acts), "p99_s": _pct(acts, 0.99),
                         "makespan_s": time.perf_counter() - t0}
        for s in pool:  # park again for the AOE run
            await manager.client.update_cpu(s.id, format_cpuset(manager.park_cpus), manager.park_quota_us,
                                            manager.period_us)

        # -- allocate-on-execution --------------------------------------------------------------
        acts = []

        async def aoe_traj(i: int) -> None:
            spec = ActionSpec(kind="step", cpus=1, container=pool[i].id)
            for _ in range(steps):
                await asyncio.sleep(think_s)
                t0 = time.perf_counter()
                async with tangram.acquire(spec) as lease:
                    r = await lease.exec(cmd, timeout=600)
                    assert r.ok, r
                acts.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(aoe_traj(i) for i in range(trajectories)))
        out["aoe"] = {"act_s": statistics.mean(acts), "p99_s": _pct(acts, 0.99),
                      "makespan_s": time.perf_counter() - t0}
    return out


async def main(args: argparse.Namespace) -> None:
    print(f"host cores {format_cpuset(HOST)}, image {IMAGE}, {args.actions} actions per backend")
    res = {b: await overhead(b, args.actions) for b in ("api", "cgroup")}
    print(f"{'backend':8} {'median ms':>10} {'p99 ms':>10} {'apply ms':>10} {'park ms':>10}")
    for b, r in res.items():
        print(f"{b:8} {r['median_ms']:10.3f} {r['p99_ms']:10.3f} {r['apply_median_ms']:10.3f}"
              f" {r['release_median_ms']:10.3f}")
    print(f"ratio api/cgroup (median grant+park): {res['api']['median_ms'] / res['cgroup']['median_ms']:.1f}x")
    if args.skip_act:
        return
    print(f"\nACT: {args.trajectories} trajectories x {args.steps} actions, {args.work_ms} ms CPU work at 1 core,"
          f" {args.think_ms} ms thinking between actions, pool {format_cpuset(HOST)}")
    r2 = await act(args.trajectories, args.steps, args.work_ms / 1e3, args.think_ms / 1e3)
    print(f"{'mode':8} {'ACT s':>8} {'p99 s':>8} {'makespan s':>11}")
    for mode, r in r2.items():
        print(f"{mode:8} {r['act_s']:8.3f} {r['p99_s']:8.3f} {r['makespan_s']:11.2f}")
    print(f"ACT static/aoe: {r2['static']['act_s'] / r2['aoe']['act_s']:.2f}x")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actions", type=int, default=500)
    p.add_argument("--skip-act", action="store_true")
    p.add_argument("--trajectories", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--work-ms", type=float, default=200)
    p.add_argument("--think-ms", type=float, default=1500)
    a: Any = p.parse_args()
    asyncio.run(main(a))
