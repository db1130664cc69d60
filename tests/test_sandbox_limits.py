"""Issue 17, sandbox side: memory per action (enforced, OOM reported, container survives), thread
caps per action, and the sandbox count / creation-rate quotas — against a real dockerd, read back
from the container's cgroup on the host, plus the pinned-subprocess backend.

Memory is allocated with busybox ``dd bs=N`` (dd allocates and touches one N-byte buffer) or a
shell variable filled from ``/dev/zero``: busybox has no memory hog program.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from docker_fixtures import HOST_CPUS, docker_engine, manager_factory, sandboxes, started_manager
from tangram_sdk import ActionSpec, Pool, Tangram
from tangram_sdk._cpuset import format_cpuset
from tangram_sdk.errors import ActionOOMError, SpecError
from tangram_sdk.lease import THREAD_ENV_VARS, Lease
from tangram_sdk.managers import _cgroup
from tangram_sdk.managers._cgroup import MemoryCgroup, MemoryLimits
from tangram_sdk.managers._limits import CreationGate
from tangram_sdk.managers.cpu import DockerCpuManager, SandboxPool
from tangram_sdk.process import MemoryScope, memory_enforcement, run_pinned
from tangram_sdk.scheduler.decisions import Grant

__all__ = ["docker_engine", "manager_factory", "sandboxes", "started_manager"]  # fixtures used here

MiB = 1 << 20
HOG = ["dd", "if=/dev/zero", "of=/dev/null", "bs=160M", "count=1"]  # one 160 MiB buffer, touched
# the six variables the issue names; THREAD_ENV_VARS holds more
NAMED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
         "RAYON_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def _lease(aid: int, cid: str | None, cpus: tuple[int, ...], memory: int = 0, kind: str = "t") -> tuple[Grant, Lease]:
    spec = ActionSpec(kind=kind, cpus=len(cpus), memory=memory, container=cid)
    lease = Lease(aid, spec, cpus=cpus, gpus=(), units=0, memory=memory, quotas=(), queued_s=0.0, granted_at=0.0)
    return Grant(aid, cpus=cpus, memory=memory), lease


def _host_memory(cid: str) -> MemoryCgroup:
    """The container's memory cgroup as the host sees it (what the kernel enforces)."""
    layout = _cgroup.detect_layout()
    assert layout is not None and layout.memory_root is not None, "no memory controller on this host"
    mem = _cgroup.locate(layout, cid).memory
    assert mem is not None
    return mem


async def _inside_limit(lease: Lease) -> int | None:
    """The memory limit as the container itself sees it (v1: memory.limit_in_bytes, v2: memory.max)."""
    r = await lease.exec(["sh", "-c", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null"
                                      " || cat /sys/fs/cgroup/memory.max"], timeout=60)
    text = r.stdout.decode().strip()
    return None if text == "max" or int(text) >= 1 << 62 else int(text)


# -- memory per action: limit set, visible, restored ----------------------------------------------

@pytest.mark.docker
@pytest.mark.parametrize("parked", [None, 256 * MiB])
async def test_memory_limit_held_during_the_action_and_parked_after(
        started_manager: DockerCpuManager, docker_engine: str, parked: int | None) -> None:
    m = started_manager
    async with await SandboxPool.create(m, image=docker_engine, count=1, memory=parked) as pool:
        cid = pool[0].id
        mem = _host_memory(cid)
        before = mem.limits()
        assert before.memory == parked
        grant, lease = _lease(1, cid, HOST_CPUS[:1], memory=96 * MiB)
        await m.apply(grant, lease)
        try:
            assert mem.limits() == MemoryLimits(96 * MiB, 96 * MiB)  # memory + swap = memory: no swap
            assert await _inside_limit(lease) == 96 * MiB
            assert m.statistics()["memory_limited"] == {cid: 96 * MiB}
        finally:
            await m.release(grant, lease)
        assert mem.limits() == before  # the parked limit, swap included, is back
        assert m.statistics()["memory_limited"] == {}
        info = await m.client.inspect(cid)
        assert info.memory == parked  # Docker's record is parked too (the api backend moved it and back)
        # an action that declares no memory leaves the parked limit alone
        grant, lease = _lease(2, cid, HOST_CPUS[:1])
        await m.apply(grant, lease)
        try:
            assert mem.limits() == before
        finally:
            await m.release(grant, lease)


@pytest.mark.docker
@pytest.mark.parametrize("backend", ["api", "cgroup"])
async def test_over_limit_action_gets_oom_error_container_and_neighbour_unaffected(
        docker_engine: str, backend: str) -> None:
    manager = DockerCpuManager(backend=backend)  # type: ignore[arg-type]
    async with Tangram(Pool(cpus=list(HOST_CPUS), memory=1024 * MiB), managers=[manager]) as t, \
            await SandboxPool.create(manager, image=docker_engine, count=2) as boxes:
        victim, neighbour = boxes[0].id, boxes[1].id
        async with t.acquire(ActionSpec("setup", cpus=1, container=victim)) as lease:
            r = await lease.exec(["sh", "-c", "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"], timeout=60)
            resident = r.stdout.decode().strip()
        parked = _host_memory(victim).limits()

        async def hog() -> ActionOOMError:
            with pytest.raises(ActionOOMError) as ei:
                async with t.acquire(ActionSpec("hog", cpus=1, memory=64 * MiB, container=victim)) as lease:
                    await lease.exec(HOG, timeout=60)
            return ei.value

        async def beside() -> Any:
            spec = ActionSpec("neighbour", cpus=1, memory=256 * MiB, container=neighbour)
            async with t.acquire(spec) as lease:
                return await lease.exec(["sh", "-c", " ".join(HOG) + " && echo survived"], timeout=60)

        err, other = await asyncio.gather(hog(), beside())
        assert err.killed and err.limit == 64 * MiB and err.resource == victim
        assert err.result.exit_code == 137 and not err.result.timed_out
        assert err.peak is not None and 48 * MiB <= err.peak, err  # it got close to the limit before the kill
        assert "killed for memory" in str(err) and "64.0 MiB" in str(err)
        assert other.ok and other.stdout.endswith(b"survived\n"), other  # the neighbour's 160 MiB fit its 256

        # the container lives on: the next action in it works, and its resident process is untouched
        async with t.acquire(ActionSpec("next", cpus=1, memory=192 * MiB, container=victim)) as lease:
            r = await lease.exec(["sh", "-c", " ".join(HOG) + f" && kill -0 {resident} && echo fine"], timeout=60)
            assert r.ok and r.stdout.endswith(b"fine\n"), r
        assert _host_memory(victim).limits() == parked
        st = t.statistics()
        assert st["memory_free"] == 1024 * MiB and st["cpus_free"] == len(HOST_CPUS)
        assert manager.statistics()["oom_kills"] == 1


@pytest.mark.docker
async def test_limit_below_what_the_sandbox_already_holds_is_refused(started_manager: DockerCpuManager,
                                                                     sandboxes: SandboxPool) -> None:
    """A resident process left by an earlier action holds ~48 MiB: a 16 MiB action is refused before
    it runs (ActionOOMError, killed=False), nothing in the container changes or dies."""
    m, cid = started_manager, sandboxes[0].id
    mem = _host_memory(cid)
    parked = mem.limits()
    grant, lease = _lease(1, cid, HOST_CPUS[:1])
    await m.apply(grant, lease)
    try:
        hold = "(x=$(head -c 50000000 /dev/zero | tr '\\0' a); sleep 1000; echo ${#x}) </dev/null >/dev/null 2>&1 &"
        r = await lease.exec(["sh", "-c", hold + " echo $!"], timeout=60)
        holder = r.stdout.decode().strip()
        t0 = time.monotonic()
        while mem.pinned() < 45 * MiB:  # fill it while the cores are granted (parked it runs at 1 %)
            assert time.monotonic() - t0 < 60, f"holder never grew: {mem.pinned()}"
            await asyncio.sleep(0.1)
    finally:
        await m.release(grant, lease)
    grant, lease = _lease(2, cid, HOST_CPUS[:1], memory=16 * MiB)
    with pytest.raises(ActionOOMError, match="cannot set its memory limit") as ei:
        await m.apply(grant, lease)
    assert not ei.value.killed and ei.value.limit == 16 * MiB
    await m.release(grant, lease)  # what the runtime does after a failed apply: a no-op here
    assert mem.limits() == parked
    assert m.statistics()["granted"] == 0
    info = await m.client.inspect(cid)
    assert info.cpuset == format_cpuset(m.park_cpus)
    r = await m.client.exec(cid, ["kill", "-0", holder], timeout=60)
    assert r.ok, "the resident process must not be killed by a refused limit"


@pytest.mark.docker
async def test_peak_memory_is_learned_per_kind(manager_factory: Any, docker_engine: str) -> None:
    m: DockerCpuManager = await manager_factory("cgroup")
    async with await SandboxPool.create(m, image=docker_engine, count=1) as pool:
        cid = pool[0].id
        for aid, size in ((1, 120), (2, 40)):
            grant, lease = _lease(aid, cid, HOST_CPUS[:1], memory=256 * MiB, kind="build")
            await m.apply(grant, lease)
            try:
                r = await lease.exec(["dd", "if=/dev/zero", "of=/dev/null", f"bs={size}M", "count=1"], timeout=60)
                assert r.ok, r
            finally:
                await m.release(grant, lease)
            peak = m.statistics()["memory_peaks"]["build"]
            assert size * MiB <= peak["last"] < 256 * MiB, peak  # the peak of this action, not of the container
        assert peak["n"] == 2 and peak["max"] >= 120 * MiB > peak["last"] and peak["declared"] == 256 * MiB


# -- thread caps ----------------------------------------------------------------------------------

_SHOW = "echo " + " ".join(f"${v}" for v in NAMED) + "; nproc"


@pytest.mark.docker
async def test_thread_caps_visible_inside_the_container(started_manager: DockerCpuManager, docker_engine: str) -> None:
    m = started_manager
    async with await SandboxPool.create(m, image=docker_engine, count=1, env={"OMP_NUM_THREADS": "64"}) as pool:
        cid = pool[0].id
        for aid, cpus in enumerate({HOST_CPUS[:1], HOST_CPUS}):
            grant, lease = _lease(aid, cid, cpus)
            await m.apply(grant, lease)
            try:
                n = str(len(cpus))
                r = await lease.exec(["sh", "-c", _SHOW], timeout=60)
                assert r.stdout.decode().split() == [n] * len(NAMED) + [n], r  # nproc sees the cpuset
                r = await lease.exec(["sh", "-c", "echo $OMP_NUM_THREADS $MKL_NUM_THREADS"], env={"OMP_NUM_THREADS": "3"},
                                     timeout=60)
                assert r.stdout.decode().split() == ["3", n]  # the caller's env wins
                r = await lease.exec(["sh", "-c", "echo $OMP_NUM_THREADS ${MKL_NUM_THREADS:-unset}"],
                                     thread_caps=False, timeout=60)
                assert r.stdout.decode().split() == ["64", "unset"]  # opted out: the container's own env
            finally:
                await m.release(grant, lease)


_PY_SHOW = ("import os; print(*[os.environ.get(v, '-') for v in {names!r}], len(os.sched_getaffinity(0)),"
            " os.cpu_count())")


async def test_thread_caps_and_cores_in_a_pinned_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "64")  # inherited from the trainer: the cap overrides it
    monkeypatch.setenv("TANGRAM_TEST_MARK", "kept")
    script = _PY_SHOW.format(names=NAMED + ("TANGRAM_TEST_MARK",))
    async with Tangram(Pool(cpus=list(HOST_CPUS))) as t:
        async with t.acquire(ActionSpec("py", cpus=1)) as lease:
            r = await lease.run([sys.executable, "-c", script], timeout=60)
            got = r.stdout.decode().split()
            assert got[:len(NAMED)] == ["1"] * len(NAMED) and got[len(NAMED)] == "kept", r
            # sched_getaffinity sees the granted core; os.cpu_count() still counts the host's
            assert got[-2:] == ["1", str(os.cpu_count())]
            r = await lease.run([sys.executable, "-c", script], env={"OMP_NUM_THREADS": "5", "PATH": os.environ["PATH"]},
                                timeout=60)
            got = r.stdout.decode().split()
            assert got[0] == "5" and got[1] == "1" and got[len(NAMED)] == "-"  # explicit env: only it + caps
            r = await lease.run([sys.executable, "-c", script], thread_caps=False, timeout=60)
            assert r.stdout.decode().split()[0] == "64"
        assert lease.thread_env() == dict.fromkeys(THREAD_ENV_VARS, "1")


# -- memory in the process backend ---------------------------------------------------------------

_ALLOC = "import sys; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096]); print('ok')"


async def test_lease_run_holds_a_pinned_command_to_the_lease_memory() -> None:
    if memory_enforcement() != "cgroup":
        pytest.skip(f"this host enforces lease.run memory by {memory_enforcement()}, not a cgroup "
                    "(the RLIMIT_AS path is tested below)")
    async with Tangram(Pool(cpus=list(HOST_CPUS), memory=1024 * MiB)) as t:
        async with t.acquire(ActionSpec("py", cpus=1, memory=96 * MiB)) as lease:
            show = ("import sys; line = [l for l in open('/proc/self/cgroup') if ':memory:' in l or l.startswith('0::')][0]"
                    "; print(line.strip().split(':', 2)[2])")
            r = await lease.run([sys.executable, "-c", show], timeout=60)
            rel = r.stdout.decode().strip()
            assert "/tangram-" in rel, rel
            r = await lease.run([sys.executable, "-c", _ALLOC, "32"], timeout=60)
            assert r.ok and r.stdout == b"ok\n", r
            with pytest.raises(ActionOOMError) as ei:
                await lease.run([sys.executable, "-c", _ALLOC, "400"], timeout=60)
            assert ei.value.killed and ei.value.limit == 96 * MiB and "tangram-" in (ei.value.resource or "")
            assert ei.value.peak is not None and ei.value.peak >= 64 * MiB
            assert ei.value.result.exit_code == -9  # SIGKILL, as asyncio reports it
            assert not Path(ei.value.resource or "/nonexistent").exists()  # the child cgroup is gone after the run
            r = await lease.run([sys.executable, "-c", _ALLOC, "32"], timeout=60)
            assert r.ok, r  # the next run is fine


async def test_run_pinned_rlimit_fallback_fails_the_allocation_inside_the_program() -> None:
    scope = MemoryScope(256 * MiB, mode="rlimit")
    r = await run_pinned([sys.executable, "-c", _ALLOC, "32"], (), memory=scope, timeout=60)
    assert r.ok, r
    r = await run_pinned([sys.executable, "-c", _ALLOC, "512"], (), memory=scope, timeout=60)
    assert r.exit_code == 1 and b"MemoryError" in r.stderr, r  # not a kill: nothing to report as OOM
    with pytest.raises(SpecError):
        MemoryScope(0)


# -- sandbox count and creation rate ---------------------------------------------------------------

@pytest.mark.docker
async def test_sandbox_cap_bounds_live_containers(manager_factory: Any, docker_engine: str) -> None:
    m: DockerCpuManager = await manager_factory("auto", max_sandboxes=2)
    before = set(await m.client.list_labeled())
    with pytest.raises(SpecError, match="max_sandboxes=2"):
        await SandboxPool.create(m, image=docker_engine, count=3)  # can never fit: refused at once
    assert set(await m.client.list_labeled()) == before
    pool = await SandboxPool.create(m, image=docker_engine, count=1)
    try:
        second = await pool.add()
        assert len(pool) == 2 and m.statistics()["sandboxes"]["live"] == 2
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="max_sandboxes=2"):
            await pool.add(timeout=0.3)
        assert time.monotonic() - t0 < 5
        waiter = asyncio.ensure_future(pool.add(timeout=120))
        doomed = asyncio.ensure_future(pool.add(timeout=120))
        await asyncio.sleep(0.3)
        assert not waiter.done() and m.statistics()["sandboxes"]["waiting"] == 2
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        assert m.statistics()["sandboxes"]["waiting"] == 1
        await pool.remove(second)  # its slot goes to the waiter
        third = await waiter
        assert third.created and len(pool) == 2
        mine = set(await m.client.list_labeled()) - before
        assert mine == {s.id for s in pool}  # never more than 2 live
        st = m.statistics()["sandboxes"]
        assert (st["live"], st["waiting"], st["timeouts"], st["max_sandboxes"]) == (2, 0, 1, 2)
    finally:
        await pool.aclose()
    assert m.statistics()["sandboxes"]["live"] == 0
    assert set(await m.client.list_labeled()) == before


def _created(ts: str) -> float:
    """Docker's ``Created`` (RFC 3339 with nanoseconds) as unix seconds."""
    head, _, frac = ts.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


@pytest.mark.docker
async def test_creation_rate_spaces_container_creation(manager_factory: Any, docker_engine: str) -> None:
    m: DockerCpuManager = await manager_factory("auto", create_rate=2.0)
    t_call = time.time()
    async with await SandboxPool.create(m, image=docker_engine, count=4) as pool:
        stamps = []
        for s in pool:
            data = await m.client._call("inspect", s.id, lambda d, i=s.id: d.containers.container(i).show())
            stamps.append(_created(data["Created"]))
        stamps.sort()
        # 2/s, burst 1: the daemon created the k-th container no earlier than k * 0.5 s after the call
        # (4 concurrent creates would otherwise all land within the first few hundred ms)
        offsets = [round(x - t_call, 3) for x in stamps]
        assert all(off >= k * 0.5 - 0.02 for k, off in enumerate(offsets)), offsets
        st = m.statistics()["sandboxes"]
        assert st["waited"] == 3 and st["wait_s"] >= 0.5 + 1.0 + 1.5 - 0.1, st
    slow: DockerCpuManager = await manager_factory("auto", create_rate=0.2)  # one per 5 s
    async with await SandboxPool.create(slow, image=docker_engine, count=1) as pool:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="creation rate"):
            await pool.add(timeout=1.0)  # the next token is ~5 s away: refused at once, not after 1 s
        assert time.monotonic() - t0 < 0.5
        assert len(pool) == 1 and slow.statistics()["sandboxes"]["live"] == 1


# -- the gate itself (no Docker) -------------------------------------------------------------------

async def test_gate_hands_slots_over_in_order_and_survives_cancel_at_handover() -> None:
    gate = CreationGate(max_live=1)
    await gate.admit(None)
    order: list[str] = []

    async def wait(tag: str) -> None:
        await gate.admit(10)
        order.append(tag)

    a, b = asyncio.ensure_future(wait("a")), asyncio.ensure_future(wait("b"))
    await asyncio.sleep(0)
    gate.release()  # the slot moves to a...
    a.cancel()  # ...which is cancelled in the same iteration: it must pass the slot on to b
    with pytest.raises(asyncio.CancelledError):
        await a
    await b
    assert order == ["b"] and gate.live == 1
    gate.release()
    assert gate.live == 0 and gate.statistics()["waiting"] == 0


async def test_gate_timeout_and_validation() -> None:
    gate = CreationGate(max_live=1)
    await gate.admit(None)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TimeoutError, match="max_sandboxes=1"):
        await gate.admit(0.05)
    assert loop.time() - t0 >= 0.05 and gate.statistics()["timeouts"] == 1 and gate.live == 1
    for bad in [dict(max_live=0), dict(max_live=True), dict(rate=0), dict(rate=float("nan")), dict(burst=0)]:
        with pytest.raises(SpecError):
            CreationGate(**bad)  # type: ignore[arg-type]
    with pytest.raises(SpecError):
        gate.check_fits(2)


async def test_gate_rate_reserves_in_order_and_refunds_a_cancelled_token() -> None:
    gate = CreationGate(rate=20.0)  # one per 50 ms
    loop = asyncio.get_running_loop()
    done: list[float] = []

    async def one() -> None:
        await gate.admit(5)
        done.append(loop.time())

    t0 = loop.time()
    await asyncio.gather(*(one() for _ in range(5)))
    offsets = sorted(d - t0 for d in done)
    assert all(off >= k * 0.05 - 0.002 for k, off in enumerate(offsets)), offsets  # the k-th no earlier than k/rate
    # a cancelled waiter gives its reservation back: the next caller is not pushed further out
    slow = CreationGate(rate=2.0)
    await slow.admit(None)
    waiter = asyncio.ensure_future(slow.admit(None))  # reserved for +0.5 s
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    t0 = loop.time()
    await slow.admit(None)
    assert loop.time() - t0 < 0.5  # would be ~0.95 s had the cancelled reservation been kept
