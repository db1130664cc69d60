"""Coding sandboxes with allocate-on-execution: real Docker containers, cores granted per action.

Four "trajectories" each own a warm sandbox container (its files and processes persist between
actions) that sits parked at ~zero CPU. Each test run acquires cores for itself only: the Docker
CPU manager sets the container's cpuset and CFS quota before the command starts and parks it again
after. Inside the container the command sees exactly ``lease.cpus``.

Needs a Docker daemon (as root: ``bash scripts/docker-up.sh`` installs and starts one and builds
the ``tangram-test:busybox`` image). Run:  python examples/coding_sandbox.py
"""

from __future__ import annotations

import asyncio
import os

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Tangram
from tangram_sdk._cpuset import format_cpuset
from tangram_sdk._optional import require_or_exit

# without aiodocker: one line naming the docker extra, not a bare ImportError
require_or_exit("aiodocker", needed_by="examples/coding_sandbox.py")
from tangram_sdk import DockerCpuManager, SandboxPool  # noqa: E402  (need aiodocker)

IMAGE = os.environ.get("TANGRAM_TEST_IMAGE", "tangram-test:busybox")
CORES = sorted(os.sched_getaffinity(0))
TRAJECTORIES = 4
TURNS = 3


async def trajectory(tangram: Tangram, sandbox_id: str, i: int) -> None:
    spec = ActionSpec(kind="pytest", cpus=1, container=sandbox_id, duration=0.2,
                      elastic=Elasticity("cpu", max_units=len(CORES), efficiency=Amdahl(0.9)))
    for turn in range(TURNS):
        await asyncio.sleep(0.05)  # the policy "thinks"; the sandbox is parked meanwhile
        async with tangram.acquire(spec) as lease:
            # state written in an earlier turn is still there: the container was only parked
            cmd = ["sh", "-c", f"echo turn{turn} >> /tmp/log; grep Cpus_allowed_list /proc/self/status; wc -l < /tmp/log"]
            result = await lease.exec(cmd, timeout=30)
            allowed = result.stdout.decode().split()[1]
            lines = result.stdout.decode().split()[-1]
            assert allowed == format_cpuset(lease.cpus), (allowed, lease.cpus)  # exclusive cores, seen inside
            print(f"trajectory {i} turn {turn}: lease cpus {list(lease.cpus)} units={lease.units}; "
                  f"inside the container Cpus_allowed_list={allowed}; /tmp/log has {lines} line(s)")


async def main() -> None:
    manager = DockerCpuManager()
    async with Tangram(Pool(cpus=CORES), managers=[manager]) as tangram:
        async with await SandboxPool.create(manager, image=IMAGE, count=TRAJECTORIES) as sandboxes:
            await asyncio.gather(*(trajectory(tangram, sb, i) for i, sb in enumerate(sandboxes.ids)))
        print(f"backend: {manager.active_backend}")
        stats = tangram.statistics()
        print(f"completed: {stats['completed']}, failed: {stats['failed']}, cpus free: {stats['cpus_free']}/{stats['cpus_total']}")


if __name__ == "__main__":
    asyncio.run(main())
