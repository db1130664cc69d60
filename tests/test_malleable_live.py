"""Malleable CPU actions, the live side: a Resize from the core reaches the running action — its
lease (cpus, units, callbacks), its managers (FakeManager, the Docker CPU manager on both
backends) and its ``lease.run`` commands (affinity of every process and thread) — and releasing,
failing or cancelling afterwards returns exactly what it holds then.

Until the core emits Resize on its own, :class:`ResizingCore` is the real Scheduler plus resizes a
test asks for, moving the ledger and the grant record the way the core does."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import waits
from docker_fixtures import HOST_CPUS, docker_engine, make_lease, manager_factory, sandboxes, started_manager
from tangram_sdk import ActionSpec, Pool, Tangram
from tangram_sdk._cpuset import format_cpuset
from tangram_sdk.errors import DockerError
from tangram_sdk.lease import Lease
from tangram_sdk.managers.cpu import DockerCpuManager, SandboxPool
from tangram_sdk.scheduler import Decision, Event, Grant, Resize, Scheduler, Tick
from tangram_sdk.spec import Elasticity, malleable_workers
from tangram_sdk.testing import FakeManager

__all__ = ["docker_engine", "manager_factory", "sandboxes", "started_manager"]  # fixtures used here

MALLEABLE = ActionSpec(kind="straggler", cpus=1, elastic=Elasticity("cpu", max_units=4, malleable=True))
BLOCKER = ActionSpec(kind="blocker", cpus=3)


class ResizingCore(Scheduler):
    """The real core; on each Tick it also resizes the actions a test planned (``plan``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan: list[tuple[int, tuple[int, ...]]] = []

    def handle(self, event: Event, now: float) -> list[Decision]:
        out = super().handle(event, now)
        if type(event) is Tick:
            while self.plan:
                aid, cpus = self.plan.pop(0)
                a = self._running.get(aid)
                if a is not None:
                    old = a.grant
                    assert old is not None
                    self.ledger.give(Grant(aid, cpus=tuple(c for c in old.cpus if c not in cpus)))
                    self.ledger.take(Grant(aid, cpus=tuple(c for c in cpus if c not in old.cpus)))
                    a.grant = old._replace(cpus=cpus, units=len(cpus))
                    self._cpu.forget_releases()  # as the core's own resizes do (resizing.py)
                out.append(Resize(aid, cpus, len(cpus)))
        return out


def resizing(t: Tangram) -> ResizingCore:
    """Give ``t`` (not started yet) the resizing core."""
    core = ResizingCore(t.pool)
    t._core = core
    return core


def resize(t: Tangram, aid: int, cpus: tuple[int, ...]) -> None:
    core = t.scheduler
    assert isinstance(core, ResizingCore)
    core.plan.append((aid, cpus))
    t.post(Tick())


until = functools.partial(waits.until, every=0.005)


async def straggler(t: Tangram) -> Lease:
    """A malleable action granted 1 core (a blocker held the others, then left): idle cores beside it."""
    blocker = await t.acquire_lease(BLOCKER)
    lease = await t.acquire_lease(MALLEABLE)
    await t.release(blocker)
    assert len(lease.cpus) == 1 and lease.units == 1 and t.free_cpus == 3
    return lease


# -- the runtime: lease, managers, release -------------------------------------------------------
async def test_grow_updates_the_lease_calls_the_manager_and_release_returns_the_grown_cores() -> None:
    fake = FakeManager("rec")
    t = Tangram(Pool(cpus=4), managers=[fake])
    resizing(t)
    async with t:
        lease = await straggler(t)
        seen: list[tuple[tuple[int, ...], int]] = []
        lease.on_resize(lambda ls: seen.append((ls.cpus, ls.units)))
        old = lease.cpus
        resize(t, lease.action_id, (0, 1, 2, 3))
        assert lease.cpus == (0, 1, 2, 3) and lease.units == 4  # at once, in the round
        assert lease.thread_env()["OMP_NUM_THREADS"] == "4"
        await until(lambda: seen, "the resize callback")
        assert seen == [((0, 1, 2, 3), 4)] and lease.resizes == 1
        assert fake.resized == [(lease.action_id, old, (0, 1, 2, 3))]
        assert fake.cpus[lease.action_id] == (0, 1, 2, 3)
        assert t.free_cpus == 0 and t.statistics()["resizes"] == 1
        t.check_invariants()
        await t.release(lease)
        assert t.free_cpus == 4 and fake.holding == set()
        t.check_invariants()
        s = t.statistics()
        assert s.resize_failures == 0 and s.running == 0


async def test_an_action_that_raises_after_a_grow_returns_every_core() -> None:
    fake = FakeManager("rec")
    t = Tangram(Pool(cpus=4), managers=[fake])
    resizing(t)
    async with t:
        blocker = await t.acquire_lease(BLOCKER)
        with pytest.raises(RuntimeError, match="test failed"):
            async with t.acquire(MALLEABLE) as lease:
                await t.release(blocker)
                resize(t, lease.action_id, (0, 1, 2, 3))
                await until(lambda: lease.resizes == 1, "the resize")
                raise RuntimeError("test failed")
        assert t.free_cpus == 4 and fake.holding == set()
        assert t.statistics()["failed"] == 1
        t.check_invariants()


async def test_cancelling_the_action_mid_resize_wins_and_returns_every_core() -> None:
    fake = FakeManager("slow", resize_delay=0.3)
    t = Tangram(Pool(cpus=4), managers=[fake])
    resizing(t)
    async with t:
        blocker = await t.acquire_lease(BLOCKER)
        holding = asyncio.Event()
        grown: list[Lease] = []

        async def action() -> None:
            async with t.acquire(MALLEABLE) as lease:
                grown.append(lease)
                holding.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(action())
        await holding.wait()
        await t.release(blocker)
        resize(t, grown[0].action_id, (0, 1, 2, 3))
        assert grown[0].cpus == (0, 1, 2, 3)
        await asyncio.sleep(0.05)  # inside the manager's 0.3 s resize now
        assert not fake.resized and not fake.calls_to("resize")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the resize in flight finished before the release ran, and every core is back
        assert [c.method for c in fake.calls if c.action_id == grown[0].action_id] == ["apply", "resize", "release"]
        assert t.free_cpus == 4 and fake.holding == set()
        t.check_invariants()


async def test_a_manager_resize_that_raises_is_counted_and_the_action_goes_on() -> None:
    bad = FakeManager("bad").fail("resize", OSError("cpuset write refused"))
    good = FakeManager("good")
    t = Tangram(Pool(cpus=4), managers=[bad, good])
    resizing(t)
    async with t:
        lease = await straggler(t)
        resize(t, lease.action_id, (0, 1, 2, 3))
        await until(lambda: lease.resizes == 1, "the resize")
        assert good.resized and not bad.resized  # the other manager still got it
        s = t.statistics()
        assert s.resize_failures >= 1 and s.state == "open"  # (and retried, below)
        async with t.acquire(ActionSpec(kind="after", cpus=0)):  # the scheduler is alive
            pass
        await t.release(lease)
        assert t.free_cpus == 4 and bad.holding == good.holding == set()


async def test_a_failed_shrink_is_retried_until_the_manager_applies_it() -> None:
    """A shrink a manager missed leaves the work on cores the pool has given back: the runtime
    retries that manager (with back-off) until it holds what the pool says."""
    flaky = FakeManager("flaky")
    t = Tangram(Pool(cpus=4), managers=[flaky])
    resizing(t)
    async with t:
        lease = await straggler(t)
        first = lease.cpus
        resize(t, lease.action_id, (0, 1, 2, 3))
        await until(lambda: lease.resizes == 1, "the grow")
        flaky.fail("resize", OSError("cpuset write refused"), times=2)
        resize(t, lease.action_id, first)  # the shrink: refused twice, then applied
        await until(lambda: flaky.cpus[lease.action_id] == first, "the retried shrink", limit=5.0)
        assert t.statistics().resize_failures == 2 and lease.cpus == first
        await t.release(lease)
        assert t.free_cpus == 4 and flaky.holding == set()
        t.check_invariants()


async def test_retries_of_a_failed_resize_give_up_and_never_delay_leaving(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries are bounded (then an error is logged), and an action leaving while one backs off
    leaves at once."""
    import tangram_sdk._resizes as rt_mod

    monkeypatch.setattr(rt_mod, "_RESIZE_RETRY_S", (0.001, 0.001))
    bad = FakeManager("bad").fail("resize", OSError("cpuset write refused"))
    t = Tangram(Pool(cpus=4), managers=[bad])
    resizing(t)
    async with t:
        lease = await straggler(t)
        resize(t, lease.action_id, (0, 1, 2, 3))
        await until(lambda: t.statistics().resize_failures == 3, "the resize and its two retries")
        await asyncio.sleep(0.05)
        assert t.statistics().resize_failures == 3  # given up
        monkeypatch.setattr(rt_mod, "_RESIZE_RETRY_S", (30.0,))
        resize(t, lease.action_id, (0,))
        await until(lambda: t.statistics().resize_failures == 4, "the shrink's failure")
        t0 = asyncio.get_running_loop().time()
        await t.release(lease)  # while the retry backs off for 30 s
        assert asyncio.get_running_loop().time() - t0 < 1.0
        assert t.free_cpus == 4 and bad.holding == set()


async def test_grow_then_shrink_apply_in_order() -> None:
    fake = FakeManager("slow", resize_delay=0.05)
    t = Tangram(Pool(cpus=4), managers=[fake])
    resizing(t)
    async with t:
        lease = await straggler(t)
        first = lease.cpus
        resize(t, lease.action_id, (0, 1, 2, 3))
        resize(t, lease.action_id, first)  # others wait: back to its admitted size
        assert lease.cpus == first and t.free_cpus == 3
        await until(lambda: lease.resizes == 2, "both resizes")
        assert fake.resized == [(lease.action_id, first, (0, 1, 2, 3)), (lease.action_id, (0, 1, 2, 3), first)]
        assert fake.cpus[lease.action_id] == first
        await t.release(lease)
        assert t.free_cpus == 4
        t.check_invariants()


async def test_a_resize_during_apply_reaches_the_managers_after_it() -> None:
    fake = FakeManager("slow", apply_delay=0.2)
    t = Tangram(Pool(cpus=4), managers=[fake])
    resizing(t)
    async with t:
        blocker = await t.acquire_lease(BLOCKER)
        task = asyncio.create_task(t.acquire_lease(MALLEABLE))
        await until(lambda: fake.applied == 2, "the second apply to begin")
        aid = max(fake.holding)
        await t.release(blocker)
        resize(t, aid, (0, 1, 2, 3))
        lease = await task
        assert lease.cpus == (0, 1, 2, 3)
        await until(lambda: lease.resizes == 1, "the resize")
        assert [c.method for c in fake.calls if c.action_id == aid] == ["apply", "resize"]
        assert fake.cpus[aid] == (0, 1, 2, 3)
        await t.release(lease)
        assert t.free_cpus == 4


async def test_a_resize_for_an_unknown_or_finished_action_is_ignored() -> None:
    seen: list[Decision] = []
    t = Tangram(Pool(cpus=4), observers=[lambda ev, now, ds: seen.extend(ds)])
    resizing(t)
    async with t:
        lease = await straggler(t)
        aid = lease.action_id
        await t.release(lease)
        resize(t, aid, (0, 1))
        resize(t, 999, (2,))
        assert Resize(999, (2,), 1) in seen  # observers still see it
        assert lease.cpus != (0, 1) and lease.resizes == 0
        assert t.statistics().state == "open" and t.free_cpus == 4


async def test_without_managers_the_lease_and_callbacks_still_follow() -> None:
    t = Tangram(Pool(cpus=4))
    resizing(t)
    async with t:
        lease = await straggler(t)
        fired = asyncio.Event()
        bad_then_good = [lambda ls: 1 / 0, lambda ls: fired.set()]
        for fn in bad_then_good:
            lease.on_resize(fn)
        resize(t, lease.action_id, (0, 1, 2, 3))
        await asyncio.wait_for(fired.wait(), 5)  # a raising callback does not stop the next one
        await t.release(lease)
        assert t.free_cpus == 4


# -- the process backend: a running lease.run command follows ---------------------------------
_SPIN = r"""
import os, subprocess, sys, threading, time
marker = sys.argv[1]
before = sorted(os.sched_getaffinity(0))
seen = {}
def watch(name, get):
    end = time.monotonic() + 15
    while sorted(get()) == before and time.monotonic() < end:
        time.sleep(0.01)
    seen[name] = sorted(get())
t = threading.Thread(target=watch, args=("thread", lambda: os.sched_getaffinity(0)))
t.start()
child = subprocess.Popen([sys.executable, "-c",
    "import os,time\nb=os.sched_getaffinity(0)\nend=time.monotonic()+15\n"
    "while os.sched_getaffinity(0)==b and time.monotonic()<end: time.sleep(0.01)\n"
    "print(sorted(os.sched_getaffinity(0)))"], stdout=subprocess.PIPE, text=True)
time.sleep(0.2)
open(marker, "w").close()
watch("main", lambda: os.sched_getaffinity(0))
t.join()
print("before", before)
print("main", seen["main"])
print("thread", seen["thread"])
print("child", child.communicate()[0].strip())
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux affinity and 2 cores")
async def test_a_running_lease_run_command_follows_a_grow() -> None:
    cores = tuple(sorted(os.sched_getaffinity(0)))[:2]
    t = Tangram(Pool(cpus=list(cores)))
    resizing(t)
    spec = ActionSpec(kind="spin", cpus=1, elastic=Elasticity("cpu", max_units=2, malleable=True))
    async with t:
        blocker = await t.acquire_lease(ActionSpec(kind="blocker", cpus=1))
        lease = await t.acquire_lease(spec)
        await t.release(blocker)
        first = lease.cpus
        assert len(first) == 1
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            run = asyncio.create_task(lease.run([sys.executable, "-c", _SPIN, marker], timeout=60))
            await until(lambda: os.path.exists(marker) or run.done(), "the command to start", 30)
            assert not run.done(), run.result()
            resize(t, lease.action_id, cores)
            result = await run
        assert result.ok, result.stderr.decode()
        lines = dict(line.split(" ", 1) for line in result.stdout.decode().splitlines())
        want = str(list(cores))
        assert lines["before"] == str(list(first)), lines  # started pinned to the one core it had
        assert lines["main"] == want and lines["thread"] == want and lines["child"] == want, lines
        assert lease.resizes == 1
        await t.release(lease)


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux affinity and 2 cores")
async def test_a_resize_repins_what_left_the_command_s_process_group() -> None:
    """A resize re-pinned the command's process group only: a job it started in a session of its
    own (`setsid`) stayed on a core the lease no longer had until the command ended (a review,
    stop 36). The shim is the child subreaper, so its tree holds such jobs; the re-pin walks it."""
    from tangram_sdk.process import PinnedGroups, run_pinned

    cores = sorted(os.sched_getaffinity(0))[:2]
    groups = PinnedGroups(cores)
    run = asyncio.create_task(run_pinned(["sh", "-c", "setsid sleep 81 & sleep 82"], cores, groups=groups))

    def pids(name: str) -> list[int]:
        return [int(x) for x in os.listdir("/proc") if x.isdigit() and _cmdline(x) == name]

    await until(lambda: pids("sleep 81") and pids("sleep 82"), "both sleeps to start", 10)
    assert groups.repin(cores[:1]) > 0
    for name in ("sleep 81", "sleep 82"):
        assert all(os.sched_getaffinity(p) == {cores[0]} for p in pids(name)), name
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await until(lambda: not pids("sleep 81") and not pids("sleep 82"), "the sweep", 10)


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


# -- workers: a malleable lease's commands start as many as it may be grown to ------------------
_WORKERS = """
import subprocess, sys
n, iters = int(sys.argv[1]), int(sys.argv[2])
ps = [subprocess.Popen([sys.executable, "-c", f"for _ in range({iters // n}): pass"]) for _ in range(n)]
sys.exit(max(p.wait() for p in ps))
"""


async def test_workers_is_the_grant_or_what_a_malleable_lease_may_be_grown_to() -> None:
    numa = [[0, 1, 2, 3], [4, 5, 6, 7]]
    fixed = ActionSpec(kind="fixed", cpus=1, elastic=Elasticity("cpu", max_units=16))
    grows = ActionSpec(kind="grows", cpus=1, elastic=Elasticity("cpu", max_units=16, malleable=True))
    small = ActionSpec(kind="small", cpus=1, elastic=Elasticity("cpu", max_units=3, malleable=True))
    seen = {}
    async with Tangram(Pool(cpus=8, numa=numa)) as t:
        for blocks, spec in (((4, 3), fixed), ((4, 3), grows), ((4, 2), small)):
            blockers = [await t.acquire_lease(ActionSpec(kind="blocker", cpus=n)) for n in blocks]
            lease = await t.acquire_lease(spec)  # takes every core left free (nothing else wants them)
            seen[spec.kind, len(lease.cpus)] = lease.workers, lease.thread_env()["OMP_NUM_THREADS"]
            for held in (lease, *blockers):
                await t.release(held)
    assert seen == {
        ("fixed", 1): (1, "1"),  # not malleable: what it holds
        ("grows", 1): (4, "4"),  # its NUMA node, not max_units: a grow stays on the node
        ("small", 2): (3, "3"),  # its max_units
    }, seen
    assert [malleable_workers(h, 16, 2) for h in (1, 2, 8, 9)] == [2, 4, 16, 16]  # fewer, for a costly start-up


@pytest.mark.exclusive
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux affinity and 2 cores")
async def test_workers_sized_to_lease_workers_use_the_cores_a_grow_adds() -> None:
    """A fixed-worker runner (``make -j N``, ``pytest -n N``) is malleable when N is
    ``lease.workers``: admitted on 1 core, its 2 processes share it, and after the grow both cores
    work (measured by the command's own CPU time). N = the granted units cannot use the grow."""
    cores = tuple(sorted(os.sched_getaffinity(0)))[:2]
    got: dict[str, float | None] = {}
    argv = [sys.executable, "-c", _WORKERS, "2", "40000000"]
    async with Tangram(Pool(cpus=list(cores))) as t:
        async with t.acquire(ActionSpec(kind="both", cpus=2)) as both:  # what two idle cores give
            assert (await both.run(argv, timeout=120)).ok
        ideal = both.parallelism or 0.0
        if ideal < 1.5:
            pytest.skip(f"the machine is busy: two workers on two cores got {ideal:.2f} cores' worth")
        for size in ("workers", "units"):
            spec = ActionSpec(kind=f"suite-{size}", cpus=1, duration=0.05,
                              elastic=Elasticity("cpu", max_units=4, malleable=True))
            blocker = await t.acquire_lease(ActionSpec(kind="blocker", cpus=1))
            lease = await t.acquire_lease(spec)
            assert len(lease.cpus) == 1 and lease.workers == 2 and lease.units == 1
            await t.release(blocker)
            r = await lease.run(lambda lz, s=size: [*argv[:3], str(getattr(lz, s)), argv[4]], timeout=120)
            assert r.ok, r.stderr.decode()
            assert lease.resizes >= 1 and len(lease.cpus) == 2  # the core grew it past its estimate
            got[size] = lease.parallelism
            await t.release(lease)
        assert t.free_cpus == 2
    assert got["workers"] is not None and got["workers"] > 1.0 + 0.6 * (ideal - 1.0), (got, ideal)
    assert got["units"] is not None and got["units"] < 1.15, got


# -- Docker: the container's cpuset follows (both backends) --------------------------------------
async def _allowed(lease: Any) -> str:
    r = await lease.exec(["sh", "-c", "grep Cpus_allowed_list /proc/self/status | cut -f2"], timeout=60)
    assert r.ok, r
    return r.stdout.decode().strip()


@pytest.mark.docker
@pytest.mark.skipif(len(HOST_CPUS) < 2, reason="needs 2 cores")
async def test_docker_resize_sets_the_cpuset_seen_inside(started_manager: DockerCpuManager,
                                                          sandboxes: SandboxPool) -> None:
    m, box = started_manager, sandboxes[0]
    grant, lease = make_lease(1, box.id, HOST_CPUS[:1])
    grown = grant._replace(cpus=HOST_CPUS[:2], units=2)
    shrunk = grant._replace(cpus=HOST_CPUS[1:2], units=1)
    await m.apply(grant, lease)
    try:
        assert await _allowed(lease) == format_cpuset(HOST_CPUS[:1])
        await m.resize(grant, grown, lease)
        assert await _allowed(lease) == format_cpuset(HOST_CPUS[:2])
        info = await m.client.inspect(box.id)
        if m.active_backend == "api":  # the API backend records it; the cgroup one writes the kernel's
            assert (info.cpuset, info.cpu_quota) == (format_cpuset(HOST_CPUS[:2]), 2 * m.period_us)
        await m.resize(grown, shrunk, lease)
        assert await _allowed(lease) == format_cpuset(HOST_CPUS[1:2])
        assert m.statistics()["resizes"] == 2
    finally:
        await m.release(grant, lease)  # the manager parks by its own record, whatever grant says
    info = await m.client.inspect(box.id)
    assert info.cpuset == format_cpuset(m.park_cpus)  # parked again after the resizes


@pytest.mark.docker
async def test_docker_resize_of_a_vanished_container_names_it(started_manager: DockerCpuManager,
                                                             sandboxes: SandboxPool) -> None:
    m, box = started_manager, sandboxes[1]
    grant, lease = make_lease(2, box.id, HOST_CPUS[:1])
    await m.apply(grant, lease)
    await m.client.remove(box.id)
    try:
        with pytest.raises(DockerError, match=box.id[:12]):
            await m.resize(grant, grant._replace(cpus=HOST_CPUS[:2], units=2), lease)
    finally:
        await m.release(grant, lease)


@pytest.mark.docker
@pytest.mark.skipif(len(HOST_CPUS) < 2, reason="needs 2 cores")
@pytest.mark.parametrize("backend", ["api", "cgroup"])
async def test_docker_resize_end_to_end_through_the_runtime(backend: str, docker_engine: str) -> None:
    """A straggler in a container on 1 core is grown into the idle one: its next exec sees both,
    and leaving parks the container and returns both cores."""
    m = DockerCpuManager(backend=backend)  # type: ignore[arg-type]
    cores = HOST_CPUS[:2]
    t = Tangram(Pool(cpus=list(cores)), managers=[m])
    resizing(t)
    async with t, await SandboxPool.create(m, image=docker_engine, count=1) as pool:
        spec = ActionSpec(kind="build", cpus=1, container=pool[0].id,
                          elastic=Elasticity("cpu", max_units=2, malleable=True))
        blocker = await t.acquire_lease(ActionSpec(kind="blocker", cpus=1))
        async with t.acquire(spec) as lease:
            await t.release(blocker)
            assert await _allowed(lease) == format_cpuset(lease.cpus) and len(lease.cpus) == 1
            env = await lease.exec(["sh", "-c", "echo $OMP_NUM_THREADS"], timeout=60)
            assert lease.workers == 2 and env.stdout.decode().strip() == "2"  # threads for what it may grow to
            resize(t, lease.action_id, cores)
            await until(lambda: lease.resizes == 1, "the resize")
            assert await _allowed(lease) == format_cpuset(cores)
            assert m.statistics()["resizes"] == 1 and t.statistics().resize_failures == 0
        assert t.free_cpus == 2
        info = await m.client.inspect(pool[0].id)
        assert info.cpuset == format_cpuset(m.park_cpus)


# -- the real core: a straggler grown past its estimate, shrunk back when others wait ----------
async def test_the_real_core_grows_a_straggler_and_shrinks_it_when_others_wait() -> None:
    fake = FakeManager("rec")
    spec = ActionSpec(kind="straggler", cpus=1, duration=0.05,
                      elastic=Elasticity("cpu", max_units=4, malleable=True))
    async with Tangram(Pool(cpus=4), managers=[fake]) as t:
        blocker = await t.acquire_lease(BLOCKER)
        lease = await t.acquire_lease(spec)
        admitted = lease.cpus
        await t.release(blocker)
        assert len(admitted) == 1
        await until(lambda: lease.resizes >= 1, "the core to grow the straggler past its estimate")
        assert len(lease.cpus) > 1 and lease.units == len(lease.cpus) and fake.cpus[lease.action_id] == lease.cpus
        other = asyncio.create_task(t.acquire_lease(ActionSpec(kind="waiter", cpus=3)))
        got = await other  # the borrowed cores came back before it was admitted (nothing idle is left)
        assert lease.cpus == admitted and lease.units == 1
        await until(lambda: fake.cpus[lease.action_id] == admitted, "the shrink to reach the manager")
        assert not set(got.cpus) & set(lease.cpus)
        await t.release(got)
        await t.release(lease)
        assert t.free_cpus == 4 and fake.holding == set() and t.statistics().resize_failures == 0
        t.check_invariants()
