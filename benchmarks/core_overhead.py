"""Core runtime costs, each compared with a baseline measured in the same run.

1. Uncontended acquire+release latency vs asyncio.Semaphore and anyio.CapacityLimiter.
   Target: Tangram median within 1.5x of CapacityLimiter.
2. Throughput: 2048 concurrent tasks x 50 trivial actions on an 8-core pool.
   Target: >= 30,000 actions/s; reported as a ratio to a bare Semaphore.
3. One scheduling round with N queued elastic actions on a 256-core, 4-NUMA pool with 40 GPUs.
   Target: median <= 1 ms at N=2048; reported against queue length and window.

Run: python benchmarks/core_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import anyio
import attrs

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Scheduler, Tangram
from tangram_sdk.scheduler.events import Released, Submitted, Tick


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def latency(n: int, blocks: int = 10) -> dict[str, tuple[float, float]]:
    """Per-op samples of each primitive, measured in interleaved blocks (A, B, C, A, B, C, ...)
    so that drift on a shared machine (frequency, neighbours) hits every primitive alike. Two more
    rows: an elastic spec, and the same spec naming a new ``group`` every 10 calls (what the
    veRL/OpenRLHF adapters send: a trajectory of 10 tool calls), whose lengths the core learns."""
    sem = asyncio.Semaphore(8)
    lim = anyio.CapacityLimiter(8)
    spec = ActionSpec(kind="noop", cpus=1)
    elastic = ActionSpec(kind="tests", cpus=1, elastic=Elasticity("cpu", 8, Amdahl(0.9)))
    names = ("asyncio.Semaphore", "anyio.CapacityLimiter", "Tangram.acquire", "Tangram elastic",
             "Tangram elastic, grouped")
    samples: dict[str, list[float]] = {k: [] for k in names}
    per_block = max(1, n // blocks)
    async with Tangram(Pool(cpus=8)) as t:
        prims: list[tuple[str, Any]] = [("asyncio.Semaphore", sem), ("anyio.CapacityLimiter", lim),
                                        ("Tangram.acquire", [spec]), ("Tangram elastic", [elastic])]
        for block in range(blocks + 1):  # block 0 warms every path up and is discarded
            grouped = [attrs.evolve(elastic, group=f"b{block}t{i // 10}") for i in range(per_block)]
            for name, prim in prims + [("Tangram elastic, grouped", grouped)]:
                out = samples[name]
                for i in range(per_block):
                    t0 = time.perf_counter_ns()
                    if isinstance(prim, list):
                        async with t.acquire(prim[i % len(prim)]):
                            pass
                    else:
                        async with prim:
                            pass
                    if block:
                        out.append((time.perf_counter_ns() - t0) / 1e3)
    return {k: (statistics.median(v), pct(v, 0.99)) for k, v in samples.items()}


async def throughput(tasks: int, actions: int) -> dict[str, float]:
    out = {}
    sem = asyncio.Semaphore(8)

    async def sem_worker() -> None:
        for _ in range(actions):
            async with sem:
                await asyncio.sleep(0)

    t0 = time.perf_counter()
    await asyncio.gather(*[sem_worker() for _ in range(tasks)])
    out["asyncio.Semaphore"] = tasks * actions / (time.perf_counter() - t0)

    spec = ActionSpec(kind="noop", cpus=1)
    async with Tangram(Pool(cpus=8)) as t:
        async def worker() -> None:
            for _ in range(actions):
                async with t.acquire(spec):
                    await asyncio.sleep(0)

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(tasks)])
        out["Tangram.acquire"] = tasks * actions / (time.perf_counter() - t0)
        t.scheduler.check_invariants()
    return out


def round_time(queue: int, window: int, reps: int) -> tuple[float, float]:
    """Median/p99 of one round: a release frees cores while ``queue`` elastic actions wait."""
    pool = Pool(cpus=256, numa=[list(range(i * 64, (i + 1) * 64)) for i in range(4)], gpus=40)
    spec = ActionSpec(kind="test", cpus=1, elastic=Elasticity("cpu", max_units=16, efficiency=Amdahl(0.9)),
                      duration=1.0)
    gspec = ActionSpec(kind="score", gpus=1, service="rm", elastic=Elasticity("gpu", max_units=4), duration=0.5)
    s = Scheduler(pool, window=window)
    now = 0.0
    aid = 0
    for i in range(queue):
        aid += 1
        s.handle(Submitted(aid, gspec if i % 8 == 0 else spec), now)
        now += 1e-4
    samples = []
    for _ in range(reps):
        running = list(s._running)
        if not running:
            break
        rid = running[0]
        aid += 1
        s.handle(Submitted(aid, spec), now)  # keep the queue length steady
        t0 = time.perf_counter_ns()
        s.handle(Released(rid), now)
        samples.append((time.perf_counter_ns() - t0) / 1e6)
        now += 1e-3
    # the cold round: an empty pool meets the whole queue at once
    s2 = Scheduler(pool, window=window)
    for i in range(queue):
        s2._apply(Submitted(i + 1, gspec if i % 8 == 0 else spec), 0.0, [])
    t0 = time.perf_counter_ns()
    s2.handle(Tick(), 0.0)
    cold = (time.perf_counter_ns() - t0) / 1e6
    return statistics.median(samples), cold


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes (CI smoke run)")
    args = ap.parse_args()
    n = 2000 if args.quick else 20000
    tasks, actions = (256, 20) if args.quick else (2048, 50)

    lat = asyncio.run(latency(n))
    print(f"\n1) uncontended acquire+release, {n} ops (microseconds)")
    print(f"{'primitive':<24}{'median':>10}{'p99':>10}")
    for k, (med, p99) in lat.items():
        print(f"{k:<24}{med:>10.1f}{p99:>10.1f}")
    ratio = lat["Tangram.acquire"][0] / lat["anyio.CapacityLimiter"][0]
    print(f"Tangram / CapacityLimiter median: {ratio:.2f}x (target <= 1.5x) {'OK' if ratio <= 1.5 else 'MISS'}")
    g = lat["Tangram elastic, grouped"][0] / lat["Tangram elastic"][0]
    print(f"a group per trajectory / none (elastic): {g:.2f}x")

    thr = asyncio.run(throughput(tasks, actions))
    print(f"\n2) throughput, {tasks} tasks x {actions} actions on 8 cores (actions/s)")
    for k, v in thr.items():
        print(f"{k:<24}{v:>12,.0f}")
    r = thr["Tangram.acquire"] / thr["asyncio.Semaphore"]
    print(f"Tangram / Semaphore: {r:.2f}  (target >= 30,000/s) "
          f"{'OK' if thr['Tangram.acquire'] >= 30000 else 'MISS'}")

    print("\n3) one scheduling round, 256 cores / 4 NUMA / 40 GPUs (milliseconds)")
    print(f"{'queued':>8}{'window':>8}{'steady median':>16}{'cold round':>12}")
    for q in ([256, 2048] if args.quick else [128, 512, 2048, 8192]):
        for w in ([16] if args.quick else [4, 16, 64]):
            med, cold = round_time(q, w, 50 if args.quick else 300)
            mark = " (target <= 1 ms)" if q == 2048 and w == 16 else ""
            print(f"{q:>8}{w:>8}{med:>16.3f}{cold:>12.2f}{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
