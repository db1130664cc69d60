"""Memory per action vs the static limits a user would set instead, on real containers.

Workload: ``--boxes`` sandboxes run ``--actions`` actions each; an action touches a 16 MiB buffer
(it needs 48 MiB with the shell and page cache around it), except every ``--spike``-th, which
touches 160 MiB (needs 192 MiB): agent tool calls swing by an order of magnitude between calls.
The host budget for the sandboxes is ``--budget`` MiB. Three ways to hold it:

* ``static-even``: every container limited to budget / boxes for its whole life
  (``docker run --memory``): the budget holds, the spikes are OOM-killed.
* ``static-peak``: every container limited to the largest need: nothing is killed, but the limits
  add up to boxes x peak — the budget is not held (a coincidence of spikes takes the host down).
* ``per-action``: Tangram + DockerCpuManager, each action declares its need (``memory=``); the pool
  grants at most the budget at once (minus the containers' 16 MiB parked limits), the manager sets
  the grant as the container's limit while the action runs.

Printed per mode: actions killed for memory, the most memory the limits allowed at once
(committed), and the makespan. Then the cost: median grant+park per action with and without a
memory limit, per backend, in the same run. Run (as root, after ``bash scripts/docker-up.sh``)::

    .venv/bin/python benchmarks/memory_per_action.py [--boxes 8] [--actions 6] [--budget 512] [--grants 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from tangram_sdk import ActionOOMError, ActionSpec, Pool, Tangram
from tangram_sdk.lease import Lease
from tangram_sdk.managers.base import ManagerContext
from tangram_sdk.managers.cpu import DockerCpuManager, SandboxPool
from tangram_sdk.scheduler.decisions import Grant

IMAGE = os.environ.get("TANGRAM_TEST_IMAGE", "tangram-test:busybox")
HOST = tuple(sorted(os.sched_getaffinity(0)))
MiB = 1 << 20
SMALL, SPIKE, PARKED = 16, 160, 16  # MiB touched by an ordinary / a spiking action; a parked limit
NEED = {SMALL: 48, SPIKE: 192}  # MiB each needs with busybox sh, dd and page cache around the buffer


def _peaks(boxes: int, actions: int, spike: int) -> list[list[int]]:
    return [[SPIKE if (b * actions + i) % spike == 0 else SMALL for i in range(actions)] for b in range(boxes)]


def _cmd(peak: int) -> list[str]:
    # dd touches one peak-sized buffer; the sleep stands for the rest of the tool call
    return ["sh", "-c", f"dd if=/dev/zero of=/dev/null bs={peak}M count=1 2>/dev/null && sleep 0.2"]


async def static(limit_mib: int, peaks: list[list[int]]) -> tuple[int, int, float]:
    m = DockerCpuManager()
    kills = 0
    async with Tangram(Pool(cpus=list(HOST)), managers=[m]) as t, \
            await SandboxPool.create(m, image=IMAGE, count=len(peaks), memory=limit_mib * MiB) as boxes:

        async def trajectory(b: int) -> None:
            nonlocal kills
            for peak in peaks[b]:
                try:
                    async with t.acquire(ActionSpec("tool", cpus=1, container=boxes[b].id)) as lease:
                        await lease.exec(_cmd(peak), timeout=120)
                except ActionOOMError:  # the container's own (static) limit killed it
                    kills += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(trajectory(b) for b in range(len(peaks))))
        return kills, limit_mib * len(peaks), time.perf_counter() - t0


async def per_action(budget_mib: int, peaks: list[list[int]]) -> tuple[int, int, float]:
    m = DockerCpuManager()
    kills = 0
    grantable = budget_mib - PARKED * len(peaks)
    held = peak_held = 0
    async with Tangram(Pool(cpus=list(HOST), memory=grantable * MiB), managers=[m]) as t, \
            await SandboxPool.create(m, image=IMAGE, count=len(peaks), memory=PARKED * MiB) as boxes:

        async def trajectory(b: int) -> None:
            nonlocal kills, held, peak_held
            for peak in peaks[b]:
                spec = ActionSpec("tool", cpus=1, memory=NEED[peak] * MiB, container=boxes[b].id)
                try:
                    async with t.acquire(spec) as lease:
                        held += lease.memory
                        peak_held = max(peak_held, held)
                        try:
                            await lease.exec(_cmd(peak), timeout=120)
                        finally:
                            held -= lease.memory
                except ActionOOMError:
                    kills += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(trajectory(b) for b in range(len(peaks))))
        elapsed = time.perf_counter() - t0
    committed = PARKED * len(peaks) + peak_held // MiB  # parked limits + the most granted at once
    return kills, committed, elapsed


async def overhead(backend: str, grants: int) -> tuple[float, float]:
    """Median ms of apply+release for a 1-core grant without / with a 64 MiB memory limit."""
    m = DockerCpuManager(backend=backend)  # type: ignore[arg-type]
    await m.start(ManagerContext(Pool(cpus=list(HOST)), post=lambda e: None))
    out = []
    try:
        async with await SandboxPool.create(m, image=IMAGE, count=1) as pool:
            for memory in (0, 64 * MiB):
                times = []
                for i in range(grants + 5):
                    spec = ActionSpec("bench", cpus=1, memory=memory, container=pool[0].id)
                    lease = Lease(i, spec, cpus=HOST[:1], gpus=(), units=0, memory=memory, quotas=(), queued_s=0.0,
                                  granted_at=0.0)
                    grant = Grant(i, cpus=HOST[:1], memory=memory)
                    t0 = time.perf_counter()
                    await m.apply(grant, lease)
                    await m.release(grant, lease)
                    if i >= 5:  # the first ones locate the cgroup and read the parked limit
                        times.append((time.perf_counter() - t0) * 1e3)
                out.append(statistics.median(times))
    finally:
        await m.aclose()
    return out[0], out[1]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--boxes", type=int, default=8)
    ap.add_argument("--actions", type=int, default=6)
    ap.add_argument("--spike", type=int, default=4, help="every N-th action touches 160 MiB")
    ap.add_argument("--budget", type=int, default=512, help="MiB for all sandboxes together")
    ap.add_argument("--grants", type=int, default=200, help="grant+park pairs timed per backend and mode")
    a = ap.parse_args()
    peaks = _peaks(a.boxes, a.actions, a.spike)
    n = a.boxes * a.actions
    spikes = sum(p == SPIKE for row in peaks for p in row)
    print(f"{a.boxes} sandboxes x {a.actions} actions ({spikes} of {n} touch {SPIKE} MiB, the rest {SMALL} MiB), "
          f"budget {a.budget} MiB, cores {','.join(map(str, HOST))}")
    rows = [("static-even", await static(a.budget // a.boxes, peaks)),
            ("static-peak", await static(NEED[SPIKE], peaks)),
            ("per-action", await per_action(a.budget, peaks))]
    print(f"{'mode':<12} {'OOM-killed':>10} {'committed MiB':>14} {'within budget':>14} {'makespan s':>11}")
    for name, (kills, committed, elapsed) in rows:
        print(f"{name:<12} {kills:>10} {committed:>14} {'yes' if committed <= a.budget else 'no':>14} {elapsed:>11.2f}")
    print(f"\n{'backend':<8} {'grant+park ms':>14} {'+ memory ms':>12} {'ratio':>6}")
    for backend in ("cgroup", "api"):
        plain, limited = await overhead(backend, a.grants)
        print(f"{backend:<8} {plain:>14.3f} {limited:>12.3f} {limited / plain:>6.2f}")


if __name__ == "__main__":
    asyncio.run(main())
