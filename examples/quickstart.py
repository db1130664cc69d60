"""Quickstart: a few agent trajectories whose actions share one pool, no Docker and no GPU needed.

Each trajectory alternates two kinds of external action, as an agentic-RL rollout does:

* ``search`` -- a call to a rate-limited API: holds one unit of the ``search`` quota;
* ``test``   -- a CPU job (here a small Python program): at least 1 core, *elastic* up to every
  core in the pool. ``lease.run`` starts it pinned to exactly the cores granted, and
  ``lease.units`` says how many it got (use it as ``-j``/``-n``).

Run:  python examples/quickstart.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Quota, Tangram

CORES = sorted(os.sched_getaffinity(0))  # only cores this process may use: lease.run pins to them
TRAJECTORIES = 4
TURNS = 3

SEARCH = ActionSpec(kind="search", quotas={"search": 1}, duration=0.05)
TEST = ActionSpec(
    kind="test",
    cpus=1,
    elastic=Elasticity("cpu", max_units=len(CORES), efficiency=Amdahl(0.9)),
    duration=0.3,
)
# A stand-in test suite: spread a little work over as many processes as cores were granted.
PROGRAM = (
    "import os, sys\n"
    "from concurrent.futures import ProcessPoolExecutor\n"
    "n = int(sys.argv[1])\n"
    "with ProcessPoolExecutor(n) as ex:\n"
    "    total = sum(ex.map(sum, [range(200_000)] * 4))\n"
    "print(len(os.sched_getaffinity(0)), total)\n"
)


async def trajectory(tangram: Tangram, i: int) -> None:
    for turn in range(TURNS):
        async with tangram.acquire(SEARCH) as lease:
            await asyncio.sleep(0.05)  # the API call
        async with tangram.acquire(TEST) as lease:
            result = await lease.run([sys.executable, "-c", PROGRAM, str(lease.units)], timeout=30)
            cores_seen = result.stdout.split()[0].decode() if result.ok else "?"
            print(f"trajectory {i} turn {turn}: test on cores {list(lease.cpus)} "
                  f"(units={lease.units}, process saw {cores_seen}, queued {lease.queued_s * 1e3:.0f} ms)")


async def main() -> None:
    pool = Pool(cpus=CORES, quotas={"search": Quota(concurrency=2, rate=20)})
    started = time.monotonic()
    async with Tangram(pool) as tangram:
        await asyncio.gather(*(trajectory(tangram, i) for i in range(TRAJECTORIES)))
        await asyncio.sleep(0.01)  # let the scheduler record the last releases
        stats = tangram.statistics()
        print(repr(tangram))
    print(f"done in {time.monotonic() - started:.1f} s")
    print("statistics:")
    for key in ("completed", "failed", "running", "queued", "mean_queue_s", "mean_exec_s", "mean_act_s", "quotas"):
        print(f"  {key}: {stats.get(key)}")


if __name__ == "__main__":
    asyncio.run(main())
