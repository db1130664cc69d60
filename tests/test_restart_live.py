"""Restartable CPU actions, the live side: a restart decided by the core reaches the running
action — its ``lease.run`` command (a real process, killed and run again on the new cores, its
argv rebuilt for the new units), its ``lease.exec`` command in a real container (both backends),
its callbacks — a cancel during a restart still wins, and releasing returns every core.

The process and Docker tests use :class:`ResizingCore` (tests/test_malleable_live.py: the real
core plus the resizes a test asks for) to restart at a chosen moment on this 2-core machine; the
last test lets the real core decide the restart from what it learned."""

from __future__ import annotations

import asyncio
import functools
import os
import random
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import waits
from docker_fixtures import HOST_CPUS, docker_engine
from test_malleable_live import resize, resizing
from tangram_sdk import ActionSpec, Amdahl, Pool, Tangram
from tangram_sdk._cpuset import format_cpuset
from tangram_sdk.lease import Lease
from tangram_sdk.managers.cpu import DockerCpuManager, SandboxPool
from tangram_sdk.spec import Elasticity
from tangram_sdk.testing import FakeManager

__all__ = ["docker_engine"]  # fixture used here

until = functools.partial(waits.until, every=0.005)
two_cores = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(HOST_CPUS) < 2,
                               reason="needs Linux affinity and 2 cores")

# prints its cores and units, says it started (a marker file named after the units), then runs
# long on one unit and ends at once on more: the restarted run is the one that finishes
_PROBE = """
import os, sys, time
units, marker = int(sys.argv[1]), sys.argv[2]
print(os.getpid(), sorted(os.sched_getaffinity(0)), units, flush=True)
open(marker + "." + str(units), "w").close()
time.sleep(60 if units == 1 else 0)
"""


def _spec(**kw: object) -> ActionSpec:
    return ActionSpec(kind="pytest", cpus=1, elastic=Elasticity("cpu", max_units=2, restartable=True), **kw)


async def _one_core(t: Tangram, spec: ActionSpec) -> Lease:
    """A restartable action granted 1 core (a blocker held the other, then left)."""
    blocker = await t.acquire_lease(ActionSpec(kind="blocker", cpus=1))
    lease = await t.acquire_lease(spec)
    await t.release(blocker)
    assert len(lease.cpus) == 1 and lease.units == 1 and lease.restartable
    return lease


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@two_cores
async def test_a_restart_kills_the_lease_run_command_and_runs_it_again_on_the_new_cores() -> None:
    cores = HOST_CPUS[:2]
    t = Tangram(Pool(cpus=list(cores)))
    resizing(t)
    async with t:
        lease = await _one_core(t, _spec())
        first = lease.cpus
        seen: list[int] = []
        lease.on_resize(lambda lz: seen.append(lz.units))
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            run = asyncio.create_task(lease.run(
                lambda lz: [sys.executable, "-c", _PROBE, str(lz.units), marker], timeout=60))
            await until(lambda: os.path.exists(marker + ".1") or run.done(), "the first run to start", 30)
            assert not run.done(), run.result()
            resize(t, lease.action_id, cores)
            result = await asyncio.wait_for(asyncio.shield(run), 30)
        assert result.ok, result.stderr.decode()
        # the result is the second run's: on both cores, built for 2 units
        assert result.stdout.decode().rstrip().endswith(f"{list(cores)} 2"), result.stdout
        assert lease.restarts == 1 and lease.resizes == 1 and seen == [2]
        assert lease.cpus == cores and lease.units == 2 and first != lease.cpus
        await t.release(lease)
        assert t.free_cpus == 2
        t.check_invariants()


@two_cores
async def test_the_killed_first_run_is_gone_and_a_cancel_during_the_restart_wins() -> None:
    cores = HOST_CPUS[:2]
    t = Tangram(Pool(cpus=list(cores)))
    resizing(t)
    async with t:
        lease = await _one_core(t, _spec())
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            # both runs sleep: the restart kills the first, then the caller is cancelled mid second run
            cmd = [sys.executable, "-c", "import os,sys,time\nopen(sys.argv[1]+'.'+str(os.getpid()),'w')"
                   ".close()\ntime.sleep(60)", marker]
            run = asyncio.create_task(lease.run(cmd, timeout=120))
            await until(lambda: len([f for f in os.listdir(d)]) == 1, "the first run to start", 30)
            (first,) = [int(f.rsplit(".", 1)[1]) for f in os.listdir(d)]
            resize(t, lease.action_id, cores)
            await until(lambda: len(os.listdir(d)) == 2, "the second run to start", 30)
            assert not _alive(first) or await _reaped(first), "the restart left the first run alive"
            (second,) = [int(f.rsplit(".", 1)[1]) for f in os.listdir(d) if int(f.rsplit(".", 1)[1]) != first]
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            assert not _alive(second) or await _reaped(second), "a cancel left the second run alive"
        assert lease.restarts == 1
        await t.release(lease)
        assert t.free_cpus == 2


async def _reaped(pid: int) -> bool:
    """A killed child may linger as a zombie a moment: dead once it is gone or a zombie."""
    for _ in range(200):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return True
        except OSError:
            return True
        await asyncio.sleep(0.01)
    return False


@two_cores
async def test_an_action_that_raises_after_a_restart_returns_every_core() -> None:
    fake = FakeManager("rec")
    cores = HOST_CPUS[:2]
    t = Tangram(Pool(cpus=list(cores)), managers=[fake])
    resizing(t)
    async with t:
        blocker = await t.acquire_lease(ActionSpec(kind="blocker", cpus=1))
        with pytest.raises(RuntimeError, match="boom"):
            async with t.acquire(_spec()) as lease:
                await t.release(blocker)
                resize(t, lease.action_id, cores)
                await until(lambda: lease.restarts == 1, "the restart")
                assert fake.cpus[lease.action_id] == cores  # the manager saw the new cores
                raise RuntimeError("boom")
        assert t.free_cpus == 2 and fake.holding == set()
        t.check_invariants()


@pytest.mark.docker
@two_cores
@pytest.mark.parametrize("backend", ["api", "cgroup"])
async def test_docker_a_restart_kills_the_exec_in_the_container_and_runs_it_on_the_new_cpuset(
        backend: str, docker_engine: str) -> None:
    m = DockerCpuManager(backend=backend)  # type: ignore[arg-type]
    cores = HOST_CPUS[:2]
    t = Tangram(Pool(cpus=list(cores)), managers=[m])
    resizing(t)
    async with t, await SandboxPool.create(m, image=docker_engine, count=1) as pool:
        box = pool[0].id
        lease = await _one_core(t, _spec(container=box))
        # the first run records its pid and sleeps; the second (2 units) prints its cpuset and ends
        script = ("if [ \"$1\" = 1 ]; then echo $$ > /tmp/first; sleep 60; fi; "
                  "echo units=$1; grep Cpus_allowed_list /proc/self/status | cut -f2")
        run = asyncio.create_task(lease.exec(lambda lz: ["sh", "-c", script, "sh", str(lz.units)], timeout=90))

        async def first_started() -> bool:
            r = await lease.exec(["sh", "-c", "test -s /tmp/first && cat /tmp/first"], timeout=30)
            return r.ok

        for _ in range(600):
            if await first_started() or run.done():
                break
            await asyncio.sleep(0.05)
        assert not run.done(), run.result()
        first = (await lease.exec(["cat", "/tmp/first"], timeout=30)).stdout.decode().strip()
        resize(t, lease.action_id, cores)
        result = await asyncio.wait_for(asyncio.shield(run), 30)  # the first run would sleep 60 s
        assert result.ok and result.stdout.decode().split() == ["units=2", format_cpuset(cores)], result
        gone = await lease.exec(["sh", "-c", f"kill -0 {first} 2>/dev/null && echo alive || echo gone"],
                                timeout=30)
        assert gone.stdout.decode().strip() == "gone"
        assert lease.restarts == 1 and m.statistics()["resizes"] == 1
        await t.release(lease)
        assert t.free_cpus == 2
        info = await m.client.inspect(box)
        assert info.cpuset == format_cpuset(m.park_cpus)


async def test_the_real_core_restarts_a_straggler_from_what_it_learned() -> None:
    """No scripted resize: the kind learns its lengths from 40 completions (lognormal, sigma 1.5,
    median 0.1 s of one core's work, run on 4: ~3 s in all), then one action held to 1 of 4 cores
    runs past 4x its kind's mean; once the blocker leaves, the core restarts it on the idle cores
    (Amdahl 1: 4x faster, a restart expected to end sooner), exactly once. Cores here are the
    scheduler's (a FakeManager records them)."""
    fake = FakeManager("rec")
    spec = ActionSpec(kind="straggler", cpus=1, elastic=Elasticity("cpu", 4, Amdahl(1.0), restartable=True))
    rng = random.Random(7)
    async with Tangram(Pool(cpus=4), managers=[fake]) as t:
        for _ in range(40):
            async with t.acquire(spec) as lease:
                await asyncio.sleep(rng.lognormvariate(-2.3, 1.5) * lease.spec.relative_duration(lease.units))
        kind = t.scheduler._kinds["straggler"]
        assert kind.log_var > 1.0, kind.log_var  # the spread it learned: heavy tailed
        blocker = await t.acquire_lease(ActionSpec(kind="blocker", cpus=3))
        async with t.acquire(spec) as lease:
            assert lease.units == 1
            await asyncio.sleep(4.0 * kind.t1 + 0.3)  # past 4x its kind's mean length on one core
            assert lease.restarts == 0  # nothing idle yet
            await t.release(blocker)
            await until(lambda: lease.restarts == 1, "the core to restart the straggler", 10)
            assert lease.units == 4 and fake.cpus[lease.action_id] == lease.cpus
            await asyncio.sleep(0.2)
            assert lease.restarts == 1  # never a second time
        assert t.statistics().core.restarts == 1
        assert t.free_cpus == 4 and fake.holding == set()
        t.check_invariants()
