"""What a pinned command really got (process.py's CPU-time measurement), and the scheduler
learning from it live: a tool that ignores its cores, or a machine too busy to deliver them, gets
fewer cores after a few actions (issue 12's loaded-machine case). Real subprocesses, real clock."""

from __future__ import annotations

import signal
import sys

import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Tangram
from tangram_sdk.process import run_pinned

SPIN = "import time\nt=time.process_time()\nwhile time.process_time()-t<{s}: pass"
pytestmark = pytest.mark.exclusive  # CPU time and speed-ups, measured: the cores to itself
CORES = [0, 1] if len(__import__("os").sched_getaffinity(0)) >= 2 else None


async def test_cpu_time_is_measured_for_the_command_and_its_children() -> None:
    one = await run_pinned([sys.executable, "-c", SPIN.format(s=0.2)], [0])
    assert one.cpu_s is not None and 0.2 <= one.cpu_s < 0.2 + 0.3  # its own spin plus start-up
    assert one.parallelism is not None and one.parallelism <= 1.05  # one process: one core at most
    two = await run_pinned([sys.executable, "-c",
                            "import subprocess,sys\n"
                            f"ps=[subprocess.Popen([sys.executable,'-c',{SPIN.format(s=0.2)!r}]) for _ in range(2)]\n"
                            "[p.wait() for p in ps]"], [0])
    assert two.cpu_s is not None and two.cpu_s >= 0.4  # the children it waited for count too
    idle = await run_pinned(["sleep", "0.3"], [0])
    assert idle.parallelism is not None and idle.parallelism < 0.2


async def test_exit_status_signal_and_timeout_are_kept() -> None:
    r = await run_pinned(["sh", "-c", "exit 3"], [0])
    assert r.exit_code == 3 and r.cpu_s is not None
    r = await run_pinned([sys.executable, "-c", "import os,signal; os.kill(os.getpid(), signal.SIGTERM)"], [0])
    assert r.exit_code == -signal.SIGTERM
    r = await run_pinned(["sleep", "5"], [0], timeout=0.2)
    assert r.timed_out and r.cpu_s is None  # killed with its group: nothing measured, nothing made up


@pytest.mark.skipif(CORES is None, reason="needs two cores")
async def test_a_tool_that_ignores_its_cores_is_learned_live() -> None:
    """Declared Amdahl 0.95 on up to 2 cores; the command is one process, so 2 cores deliver one
    core's worth. After a handful of actions the scheduler's learned exponent is near 0 and it
    grants one core (the declaration alone would keep granting 2 forever: the pool is idle)."""
    spec = ActionSpec(kind="single", cpus=1, elastic=Elasticity("cpu", max_units=2, efficiency=Amdahl(0.95)))
    units = []
    async with Tangram(Pool(cpus=CORES)) as t:
        for _ in range(14):
            async with t.acquire(spec) as lease:
                units.append(lease.units)
                r = await lease.run([sys.executable, "-c", SPIN.format(s=0.05)])
                assert r.ok
        beta = t.scheduler._kinds["single"].beta
    assert units[0] == 2
    assert beta <= 0.1, (beta, units)
    assert units[-4:].count(1) >= 3, units


async def test_report_parallelism_teaches_the_scheduler_and_ignores_nonsense() -> None:
    """Work run outside lease.run/exec (your own executor) states what it got; the scheduler
    learns from it as from a measurement. NaN, 0, negatives, bools and strings change nothing."""
    spec = ActionSpec(kind="own", cpus=1, elastic=Elasticity("cpu", max_units=2, efficiency=Amdahl(0.95)))
    units = []
    async with Tangram(Pool(cpus=2)) as t:
        async with t.acquire(spec) as lease:
            for bad in (float("nan"), 0.0, -1.0, True, "2"):
                lease.report_parallelism(bad)  # type: ignore[arg-type]
            assert lease.parallelism is None
        for _ in range(14):
            async with t.acquire(spec) as lease:
                units.append(lease.units)
                lease.report_parallelism(1.0)
                assert lease.parallelism == 1.0
    assert units[0] == 2
    assert units[-4:].count(1) >= 3, units


TWO = ("import subprocess,sys\n"
       f"ps=[subprocess.Popen([sys.executable,'-c',{SPIN.format(s=0.3)!r}]) for _ in range(2)]\n"
       "[p.wait() for p in ps]")


@pytest.mark.skipif(CORES is None, reason="needs two cores")
async def test_a_tool_declared_flat_that_uses_its_cores_is_learned_live() -> None:
    """The other direction: declared ``Amdahl(0.0)`` (more cores do not help), so the
    declaration alone grants one core forever. The command runs two spinning processes; on the
    idle pool the first runs are given both cores to measure, they report about two cores'
    worth, the kind is upgraded, and it keeps getting both. A one-process command declared the
    same measures one core's worth and goes back to one core. Each kind on its own pool: on a
    pool two cores wide the pricing window is 1.6 runs (moldable._POOL_GRANTS), and a kind that
    has just looped there is still forecast to arrive, which prices the idle cores above zero."""
    flat = Elasticity("cpu", max_units=2, efficiency=Amdahl(0.0))
    runs = {"two": TWO, "one": SPIN.format(s=0.15)}
    units: dict[str, list[int]] = {}
    up = {}
    for kind, code in runs.items():
        async with Tangram(Pool(cpus=CORES)) as t:
            spec = ActionSpec(kind=kind, cpus=1, elastic=flat)
            units[kind] = []
            for _ in range(6):
                async with t.acquire(spec) as lease:
                    units[kind].append(lease.units)
                    r = await lease.run([sys.executable, "-c", code])
                    assert r.ok
            up[kind] = t.scheduler._kinds[kind].up
    assert up["two"] is not None and up["one"] is None, (up, units)
    assert units["two"][:2] == [2, 2] and units["two"][-3:] == [2, 2, 2], units
    assert units["one"][:2] == [2, 2] and units["one"][-3:] == [1, 1, 1], units
