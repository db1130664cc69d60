"""The live runtime: leases, timeouts, cancellation at every await, errors, and a whole pool after.

On looptime's virtual clock (timeouts, rate limits and the actions' own sleeps are exact and cost
no wall time), except the tests that run real subprocesses. Releases are handled inline, so the
pool is whole the moment a block exits: no test sleeps to let anything "settle".
"""

import asyncio
import os
import shutil
import sys

import pytest

from tangram_sdk import (
    ActionSpec,
    Amdahl,
    Elasticity,
    InfeasibleSpecError,
    ManagerError,
    Pool,
    Quota,
    RuntimeClosedError,
    SchedulerBrokenError,
    SpecError,
    Tangram,
    UsageError,
)
from tangram_sdk.testing import FakeManager

pytestmark = pytest.mark.looptime


def whole(t: Tangram) -> None:
    t.scheduler.check_invariants()
    st = t.statistics()
    assert st["running"] == 0 and st["queued"] == 0
    assert st["cpus_free"] == st["cpus_total"] and st["gpus_free"] == st["gpus_total"]
    assert all(q["used"] == 0 for q in st["quotas"].values())


async def test_lease_fields_and_release():
    async with Tangram(Pool(cpus=4, gpus=2)) as t:
        spec = ActionSpec(kind="x", cpus=1, gpus=1, elastic=Elasticity("cpu", max_units=4, efficiency=Amdahl(0.99)),
                          duration=1.0)
        async with t.acquire(spec) as lease:
            assert len(lease.cpus) == lease.units >= 1 and len(lease.gpus) == 1
            assert lease.queued_s >= 0
            assert "running" in repr(t) and "1 running" in repr(t)
        whole(t)  # the release was handled inline, before the block exited
        assert t.statistics()["completed"] == 1


async def test_waiters_queue_and_are_served_fcfs():
    order = []
    async with Tangram(Pool(cpus=1)) as t:
        async def act(i):
            async with t.acquire(ActionSpec(kind="x", cpus=1)):
                order.append(i)
                await asyncio.sleep(0.01)

        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(act(i)))
            await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)
        assert order == list(range(5))
        whole(t)


async def test_infeasible_and_invalid_fail_at_once():
    async with Tangram(Pool(cpus=2, quotas={"api": Quota(concurrency=1)})) as t:
        with pytest.raises(InfeasibleSpecError, match="exceeds"):
            async with t.acquire(ActionSpec(kind="x", cpus=3)):
                pass
        with pytest.raises(SpecError, match="unknown quota"):
            async with t.acquire(ActionSpec(kind="x", quotas={"nope": 1})):
                pass
        with pytest.raises(SpecError):
            async with t.acquire("not a spec"):  # type: ignore[arg-type]
                pass
        whole(t)


async def test_timeout_while_queued_returns_nothing_held():
    async with Tangram(Pool(cpus=1)) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)):
            with pytest.raises(TimeoutError):
                async with t.acquire(ActionSpec(kind="x", cpus=1), timeout=0.05):
                    pass
            assert asyncio.get_running_loop().time() == pytest.approx(0.05)  # exactly its timeout
        async with t.acquire(ActionSpec(kind="x", cpus=1), timeout=1):
            pass
        whole(t)


async def test_exception_inside_action_returns_units_and_propagates():
    async with Tangram(Pool(cpus=2)) as t:
        with pytest.raises(ZeroDivisionError):
            async with t.acquire(ActionSpec(kind="x", cpus=2)):
                1 / 0
        whole(t)
        assert t.statistics()["failed"] == 1


async def test_cancellation_storm_leaves_the_pool_whole():
    pool = Pool(cpus=4, gpus=2, quotas={"api": Quota(concurrency=2, rate=200.0, burst=4)})
    async with Tangram(pool) as t:
        async def act(i):
            spec = ActionSpec(kind=f"k{i % 3}", cpus=1 + i % 2, gpus=i % 2, quotas={"api": 1} if i % 4 == 0 else {},
                              elastic=Elasticity("cpu", max_units=4), duration=0.01)
            async with t.acquire(spec) as lease:
                await asyncio.sleep(0.002 * (i % 5))
                return lease.units

        for round_ in range(5):
            tasks = [asyncio.create_task(act(i)) for i in range(60)]
            await asyncio.sleep(0.003 * round_)
            for i, task in enumerate(tasks):
                if i % 3 == 0:
                    task.cancel()  # queued, in grant, or while held
            await asyncio.gather(*tasks, return_exceptions=True)
        whole(t)
        st = t.statistics()
        assert st["granted"] == st["released"]


async def test_cancel_between_grant_and_wakeup():
    # the grant lands in the future, then the waiting task is cancelled before it runs again
    async with Tangram(Pool(cpus=1)) as t:
        held = await t.acquire_lease(ActionSpec(kind="x", cpus=1))
        waiter = asyncio.create_task(t.acquire(ActionSpec(kind="x", cpus=1)).__aenter__())
        await asyncio.sleep(0)  # the waiter runs up to its wait: queued
        assert t.queued == 1
        await t.release(held)
        # the release granted the waiter inline; cancel it before it ever runs again
        assert t.statistics()["running"] == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        whole(t)


async def _echo(cmd, **kw):
    return cmd


async def test_manager_failure_returns_units_with_a_typed_error():
    m = (FakeManager("failing", attach={"exec": _echo})
         .fail("check", SpecError("bad kind"), kind="bad")
         .fail("apply", OSError("device on fire"), kind="boom"))
    async with Tangram(Pool(cpus=2), managers=[m]) as t:
        with pytest.raises(ManagerError, match="device on fire"):
            async with t.acquire(ActionSpec(kind="boom", cpus=2)):
                pass
        with pytest.raises(SpecError, match="bad kind"):
            async with t.acquire(ActionSpec(kind="bad", cpus=1)):
                pass
        async with t.acquire(ActionSpec(kind="ok", cpus=1)) as lease:
            assert await lease.exec(["true"]) == ["true"]
            with pytest.raises(ManagerError, match="service"):
                _ = lease.service
        assert m.released == 2  # the failed apply is released too (it may have half-applied)
        whole(t)


async def test_scheduler_death_reaches_every_waiter():
    t = Tangram(Pool(cpus=1))
    async with t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)):
            waiters = [asyncio.create_task(t.acquire(ActionSpec(kind="x", cpus=1)).__aenter__()) for _ in range(3)]
            await asyncio.sleep(0)  # they run up to their wait: queued
            assert t.queued == 3

            def boom(*a, **k):
                raise RuntimeError("injected core failure")

            for entry in ("handle", "handle_many", "submit", "release"):  # every way into the core
                setattr(t.scheduler, entry, boom)
        done, pending = await asyncio.wait(waiters, timeout=1.0)
        assert not pending
        for w in done:
            with pytest.raises(SchedulerBrokenError) as ei:
                w.result()
            assert isinstance(ei.value.__cause__, RuntimeError)
        with pytest.raises(SchedulerBrokenError):
            async with t.acquire(ActionSpec(kind="x", cpus=1)):
                pass
        assert "broken" in repr(t)


async def test_acquire_outside_or_after_the_context_is_refused():
    t = Tangram(Pool(cpus=1))
    with pytest.raises(RuntimeClosedError):
        async with t.acquire(ActionSpec(kind="x", cpus=1)):
            pass
    async with t:
        pass
    with pytest.raises(RuntimeClosedError):
        async with t.acquire(ActionSpec(kind="x", cpus=1)):
            pass


async def test_closing_fails_queued_waiters():
    t = Tangram(Pool(cpus=1))
    async with t:
        held = await t.acquire_lease(ActionSpec(kind="x", cpus=1))
        waiter = asyncio.create_task(t.acquire(ActionSpec(kind="x", cpus=1)).__aenter__())
        await asyncio.sleep(0)
        assert t.queued == 1
    with pytest.raises(RuntimeClosedError):
        await waiter
    await t.release(held)  # after closing: nothing left to return, and no error


async def test_rate_limited_quota_is_honoured_on_the_loops_clock():
    pool = Pool(quotas={"search": Quota(concurrency=100, rate=50.0, burst=1)})
    async with Tangram(pool) as t:
        loop = asyncio.get_running_loop()
        stamps = []

        async def search():
            async with t.acquire(ActionSpec(kind="search", quotas={"search": 1})):
                stamps.append(loop.time())

        t0 = loop.time()
        await asyncio.gather(*[search() for _ in range(10)])
        # 1 immediate + 9 at 50/s: one every 20 ms, never earlier
        assert stamps[-1] - t0 == pytest.approx(0.18, abs=1e-3)
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        assert min(gaps) >= 0.02 - 1e-3


@pytest.mark.looptime(False)  # real subprocesses, real timeouts
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux sched_setaffinity")
async def test_lease_run_pins_the_subprocess_to_the_lease_cores():
    ncpu = len(os.sched_getaffinity(0))
    async with Tangram(Pool(cpus=sorted(os.sched_getaffinity(0)))) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            r = await lease.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"])
            assert r.ok and r.stdout.decode().strip() == str(list(lease.cpus))
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            r = await lease.run([sys.executable, "-c", "import time; time.sleep(10)"], timeout=0.2)
            assert r.timed_out and not r.ok
            r = await lease.run([sys.executable, "-c", "print('x' * 100000)"], max_output=1000)
            assert r.truncated and len(r.stdout) == 1000
        with pytest.raises(SpecError):
            async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
                await lease.run("echo hi")  # type: ignore[arg-type]
    assert ncpu >= 1


@pytest.mark.looptime(False)  # real subprocesses
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux sched_setaffinity")
async def test_lease_run_says_when_the_pool_names_cores_this_process_cannot_use():
    # Pool(cpus=N) on a machine (or a container) with fewer cores: the pin failed inside the shim
    # and the user saw their command "exit 1" with the shim's traceback
    allowed = sorted(os.sched_getaffinity(0))
    outside = max(allowed) + 1
    async with Tangram(Pool(cpus=(outside,))) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            with pytest.raises(SpecError, match=rf"cores \[{outside}\] are not available to this process"):
                await lease.run(["true"])
    async with Tangram(Pool(cpus=allowed)) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            r = await lease.run(["no-such-command-tangram"], timeout=30)  # the shell's 127, one line
            assert r.exit_code == 127 and r.stderr == b"no-such-command-tangram: No such file or directory\n"


@pytest.mark.looptime(False)  # real subprocesses under real timeouts
async def test_lease_run_feeds_stdin_as_bytes_or_text():
    async with Tangram(Pool(cpus=sorted(os.sched_getaffinity(0)))) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            add = [sys.executable, "-c", "import sys; a, b = sys.stdin.read().split(); print(int(a) + int(b))"]
            for given in ("2 40", b"2 40", bytearray(b"2 40")):
                r = await lease.run(add, stdin=given, timeout=30)
                assert (r.exit_code, r.stdout) == (0, b"42\n"), r
            r = await lease.run([sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read()))"],
                                stdin=b"\xff" * 3_000_000, timeout=30)  # larger than a pipe's buffer
            assert r.stdout.strip() == b"3000000", r
            with pytest.raises(SpecError, match="stdin must be bytes or str"):
                await lease.run(add, stdin=42)  # type: ignore[arg-type]
        assert t.free_cpus == len(os.sched_getaffinity(0))


@pytest.mark.looptime(False)  # the point is a plain asyncio loop, then a patched one
async def test_runtime_reads_the_loops_own_clock_when_it_is_not_plain_asyncio():
    """The runtime skips ``loop.time()``'s Python wrapper on a plain asyncio loop, but a loop whose
    clock is patched (virtual time in tests and the simulator's replay) must still be read."""
    loop = asyncio.get_running_loop()
    offset = 1000.0
    real = loop.time
    loop.time = lambda: real() + offset  # type: ignore[method-assign]
    try:
        async with Tangram(Pool(cpus=1)) as t:
            async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
                assert lease.granted_at > real() + offset / 2
    finally:
        del loop.time  # type: ignore[attr-defined]
    async with Tangram(Pool(cpus=1)) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            assert abs(lease.granted_at - loop.time()) < 1.0


@pytest.mark.looptime(False)  # real subprocesses, real timeouts
async def test_lease_run_timeout_and_cancel_kill_the_command():
    import time

    async with Tangram(Pool(cpus=1)) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            t0 = time.monotonic()
            r = await lease.run(["sh", "-c", "echo started; exec sleep 31"], timeout=0.3)
            assert r.timed_out and not r.ok and r.stdout == b"started\n" and time.monotonic() - t0 < 3
            task = asyncio.create_task(lease.run(["sleep", "32"]))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(SpecError, match="timeout"):
                await lease.run(["true"], timeout="1")
        await _all_gone("sleep 31", "sleep 32")  # the killed commands are reaped
        whole(t)


async def _all_gone(*commands: str) -> None:
    """Wait until no process runs any of ``commands`` (a bound, not a settle time), else fail."""
    for _ in range(100):
        if not any(_alive(c) for c in commands):
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"still running: {[c for c in commands if _alive(c)]}\n{os.popen('ps -eo stat=,args=').read()}")


def _alive(command: str) -> list[str]:
    """Live processes whose whole command line is `command` (not a substring: another "sleep 420"
    on the machine is not ours)."""
    rows = (a.split(None, 1) for a in os.popen("ps -eo stat=,args=").read().splitlines())
    return [r[1] for r in rows if len(r) == 2 and r[1].strip() == command and not r[0].startswith("Z")]


@pytest.mark.looptime(False)  # real subprocesses, real timeouts
async def test_lease_run_ends_what_the_command_left_in_its_process_group():
    """A shell that starts a background job and exits: the job held the output pipes and kept
    running on the lease's cores after a timeout or cancel (the group kill was skipped once the
    command itself had exited), and with no timeout lease.run waited for it. Now the command's end
    is the action's end: its group is killed, at once, in all three cases."""
    import time

    async with Tangram(Pool(cpus=1)) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            t0 = time.monotonic()
            r = await lease.run(["sh", "-c", "sleep 41 & echo started"], timeout=30)
            assert r.ok and r.stdout == b"started\n" and not r.truncated and not r.timed_out, r
            assert time.monotonic() - t0 < 3
            t0 = time.monotonic()
            r = await lease.run(["sh", "-c", "sleep 42 & echo started; sleep 43"], timeout=0.5)
            assert r.timed_out and r.stdout == b"started\n" and not r.truncated, r
            assert time.monotonic() - t0 < 3  # not the 5 s drain of a pipe someone still holds
            task = asyncio.create_task(lease.run(["sh", "-c", "sleep 44 & sleep 45"]))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await _all_gone(*(f"sleep {n}" for n in range(41, 46)))
        whole(t)


@pytest.mark.looptime(False)  # real subprocesses, real timeouts
@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("setsid") is None,
                    reason="the child subreaper is Linux's; needs setsid(1)")
async def test_lease_run_ends_what_left_its_process_group_too():
    """A command that starts a job in a session of its own (`setsid`, a daemon's double fork)
    escaped the group kill and ran on, on cores given back. The shim is now the child subreaper:
    it inherits such orphans and kills them when the command ends, times out or is cancelled."""
    import time

    async with Tangram(Pool(cpus=1)) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            t0 = time.monotonic()
            r = await lease.run(["sh", "-c", "setsid sleep 51 >/dev/null 2>&1 & echo started"], timeout=30)
            assert r.ok and r.stdout == b"started\n" and time.monotonic() - t0 < 3, r
            r = await lease.run(["sh", "-c", "setsid sh -c 'sleep 52' >/dev/null 2>&1 & echo started; sleep 53"],
                                timeout=0.5)
            assert r.timed_out and r.stdout == b"started\n" and time.monotonic() - t0 < 6, r
            task = asyncio.create_task(lease.run(["sh", "-c", "setsid sleep 54 >/dev/null 2>&1 & sleep 55"]))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await _all_gone(*(f"sleep {n}" for n in range(51, 56)))
        whole(t)


_HOPPER = ("import os,sys,time\nos.setsid()\nd=time.time()+4;n=0\nwhile time.time()<d:\n if os.fork():os._exit(0)\n"
           " n+=1\n if n%100==0:open(sys.argv[1],'w').write(str(n))\n")


@pytest.mark.looptime(False)  # real subprocesses
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child subreaper is Linux's")
async def test_lease_run_sweep_catches_a_pid_hopper_and_reaps_orphans_as_they_come(tmp_path):
    """A review of the sweep (stop 36): a job that keeps moving to a new pid (fork, parent exits)
    slipped between two /proc scans and ran on; orphans that ended while the command ran piled up
    as zombies under the shim (a job that double-forks helpers would run out of pids); and the
    command ran with SIGPIPE ignored, as Python leaves it (`yes | head -1` printed "Broken
    pipe")."""
    beat = tmp_path / "hop.beat"
    async with Tangram(Pool(cpus=1)) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            for timeout in (None, 0.3):
                beat.unlink(missing_ok=True)
                r = await lease.run(["sh", "-c", f"{sys.executable} -c \"{_HOPPER}\" {beat} >/dev/null 2>&1 & "
                                     "sleep 0.2; sleep 0.2"], timeout=timeout)
                assert r.timed_out == (timeout is not None), r
                await asyncio.sleep(0.3)
                before = beat.read_text()
                await asyncio.sleep(0.4)
                assert beat.read_text() == before, "the hopper ran on after lease.run returned"
            r = await lease.run(["sh", "-c", "for i in $(seq 60); do (true &); done; sleep 0.3; "
                                 "ps -o stat= --ppid $PPID | grep -c Z || true"], timeout=30)
            assert r.ok and r.stdout.strip() == b"0", r  # zombies under the shim while the command runs
            r = await lease.run(["sh", "-c", "yes | head -1"], timeout=30)
            assert r.ok and r.stdout == b"y\n" and r.stderr == b"", r


# ------------------------------------------------------------------------------ acquire_lease / release
async def test_acquire_lease_and_release_hold_across_calls_like_async_with():
    t = await Tangram(Pool(cpus=2)).start()
    try:
        lease = await t.acquire_lease(ActionSpec(kind="sandbox", cpus=2))
        assert len(lease.cpus) == 2 and t.free_cpus == 0 and t.running == 1
        with pytest.raises(TimeoutError, match="waited for 1 cpu"):
            await t.acquire_lease(ActionSpec(kind="x", cpus=1), timeout=0)
        assert t.queued == 0 and t.statistics()["waiters"] == 1  # the timed-out one left nothing behind
        await t.release(lease, failed=True)
        assert t.free_cpus == 2 and t.statistics()["failed"] == 1
        await t.release(lease)  # twice: nothing happens
        assert t.statistics()["released"] == 1
        whole(t)
    finally:
        await t.aclose()


async def test_release_refuses_a_lease_of_another_tangram():
    async with Tangram(Pool(cpus=1)) as a, Tangram(Pool(cpus=1)) as b:
        la = await a.acquire_lease(ActionSpec(kind="x", cpus=1))
        lb = await b.acquire_lease(ActionSpec(kind="x", cpus=1))
        assert la.action_id == lb.action_id  # ids are per Tangram: identity, not the id, decides
        with pytest.raises(SpecError, match="not granted by this Tangram"):
            await a.release(lb)
        await a.release(la)
        await b.release(lb)
        whole(a)
        whole(b)


async def test_release_nowait_only_when_no_manager_must_run():
    m = FakeManager("slow", release_delay=0.01)
    async with Tangram(Pool(cpus=2), managers=[m]) as t, Tangram(Pool(cpus=1)) as plain:
        lease = await t.acquire_lease(ActionSpec(kind="x", cpus=1))
        assert t.release_nowait(lease) is False and t.running == 1 and m.released == 0  # nothing done
        await t.release(lease)
        assert m.released == 1 and m.holding == set()
        pl = await plain.acquire_lease(ActionSpec(kind="x", cpus=1))
        assert plain.release_nowait(pl) is True and plain.free_cpus == 1  # back before it returned
        whole(t)


async def test_a_cancelled_release_still_undoes_the_managers_and_returns_the_units():
    m = FakeManager("slow", release_delay=0.05)
    async with Tangram(Pool(cpus=1), managers=[m]) as t:
        lease = await t.acquire_lease(ActionSpec(kind="x", cpus=1))
        task = asyncio.create_task(t.release(lease))
        await asyncio.sleep(0.01)
        assert m.released == 0 and t.free_cpus == 0  # inside the manager's 50 ms release
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert m.released == 1 and t.free_cpus == 1  # the cancel was delivered after the cleanup
        whole(t)


async def test_public_reads_of_the_pool():
    async with Tangram(Pool(cpus=2, memory=1000, quotas={"api": Quota(concurrency=2)})) as t:
        spec = ActionSpec(kind="x", cpus=1, memory=400, quotas={"api": 1})
        assert t.feasibility(spec) is None and "cpus" in (t.feasibility(ActionSpec(kind="big", cpus=3)) or "")
        lease = await t.acquire_lease(spec)
        assert (t.free_cpus, t.free_memory, dict(t.quota_used), t.running) == (1, 600, {"api": 1}, 1)
        assert t.shortage(ActionSpec(kind="y", cpus=2)) == "waited for 2 cpus (cpus 1/2 free, 0 queued)"
        t.check_invariants()
        await t.release(lease)


async def test_statistics_is_a_frozen_typed_snapshot_that_still_reads_like_the_old_dict():
    import json

    import attrs

    async with Tangram(Pool(cpus=2, quotas={"api": Quota(concurrency=1)})) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1, quotas={"api": 1})):
            s = t.statistics()
            assert (s.running, s.cpus_free, s.state, s.quotas["api"]["used"]) == (1, 1, "open", 1)
            assert s["running"] == 1 and s.get("granted") == 1 and "mean_act_s" in s  # the dict access
            with pytest.raises(attrs.exceptions.FrozenInstanceError):
                s.running = 0
            d = s.asdict()
            assert json.loads(json.dumps(d)) == d and d["submitted"] == 1 and d["waiters"] == 1
            assert dict(s) == d and s == d
            assert (s.core.granted, s.core.mean_act_s) == (1, None)  # the core's own typed snapshot
        assert t.statistics().running == 0 and (await t.astatistics()).asdict() == t.statistics().asdict()


# ------------------------------------------------------------------ lookups before queueing (resolve)
class _SlowLookup:
    """A manager that looks a spec's names up before it queues (as DockerCpuManager does for a
    container it has not met), slowly."""

    name = "slow-lookup"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.log: list[str] = []

    async def start(self, ctx: object) -> None: ...

    def check(self, spec: ActionSpec) -> None: ...

    async def resolve(self, spec: ActionSpec) -> None:
        self.log.append("lookup")
        try:
            await asyncio.sleep(self.seconds)
        except asyncio.CancelledError:
            self.log.append("lookup cancelled")
            raise
        self.log.append("looked up")

    async def apply(self, grant: object, lease: object) -> None: ...

    async def release(self, grant: object, lease: object) -> None: ...

    async def aclose(self) -> None:
        self.log.append("closed")


async def test_a_lookup_before_queueing_is_bounded_cancelled_and_ended_by_aclose():
    """The lookup runs before the action queues (stop 36). A review found: aclose closed the
    managers under a lookup in flight (which reopened a Docker session), the acquire's timeout did
    not bound it, and one acquire context entered twice at once gave two leases (one never
    returned). Now aclose ends lookups first, the timeout covers lookup and queue, and a second
    entry is refused."""
    m = _SlowLookup(1.0)
    async with Tangram(Pool(cpus=2), managers=[m]) as t:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError, match="slow-lookup did not finish looking up"):
            async with t.acquire(ActionSpec(kind="x", cpus=1), timeout=0.3):
                pass
        assert loop.time() - t0 == pytest.approx(0.3, abs=0.05)
        m.seconds = 0.2
        async with t.acquire(ActionSpec(kind="x", cpus=1), timeout=0.5) as lease:  # 0.2 of it was the lookup
            assert len(lease.cpus) == 1
        cm = t.acquire(ActionSpec(kind="x", cpus=1))
        got = await asyncio.gather(cm.__aenter__(), cm.__aenter__(), return_exceptions=True)
        assert sum(isinstance(g, UsageError) for g in got) == 1, got
        await cm.__aexit__(None, None, None)
        assert t.running == 0 and t.free_cpus == 2
        task = asyncio.create_task(t.acquire_lease(ActionSpec(kind="x", cpus=1)))
        await asyncio.sleep(0.1)
        task.cancel()  # the caller's cancel wins, and ends its lookup
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        assert m.log[-1] == "lookup cancelled"
        m.seconds = 5.0
        task = asyncio.create_task(t.acquire_lease(ActionSpec(kind="x", cpus=1)))
        await asyncio.sleep(0.1)
        await t.aclose()
        with pytest.raises(RuntimeClosedError):
            await task
    assert m.log[-3:] == ["lookup", "lookup cancelled", "closed"]  # ended before the managers closed
