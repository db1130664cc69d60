"""Misuse at the API boundary gets a clear error and loses nothing: a lease released twice at
once, a lease from another Tangram, an acquire() object entered twice, an acquire on the wrong
event loop, holders that leave after the close, a SyncTangram closed under a holding thread.
Each was a defect found by an adversarial audit (stop 33): a broken Tangram, leaked units, a
silent no-op, a bare AttributeError or RuntimeError."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tangram_sdk import ActionSpec, Pool, SpecError, Tangram, TangramError, UsageError
from tangram_sdk.integrations import SyncTangram
from tangram_sdk.testing import FakeManager

SPEC = ActionSpec(kind="k", cpus=1)


def _releases(fm: FakeManager) -> int:
    return sum(1 for c in fm.calls if c.method == "release")


async def test_two_tasks_releasing_one_lease_release_it_once_and_both_return_after_it() -> None:
    fm = FakeManager(release_delay=0.05)
    async with Tangram(Pool(cpus=2), managers=[fm]) as t:
        lease = await t.acquire_lease(SPEC)
        await asyncio.gather(t.release(lease), t.release(lease))
        # both returned only once the units were back, and the manager released once
        assert t.free_cpus == 2 and t.running == 0 and _releases(fm) == 1
        assert t.statistics().state == "open"  # was: KeyError in the core, a broken Tangram
        async with t.acquire(SPEC) as other:
            assert other.cpus
        t.check_invariants()
    assert not fm.holding


async def test_release_inside_the_block_then_its_exit_release_once() -> None:
    fm = FakeManager()
    async with Tangram(Pool(cpus=2), managers=[fm]) as t:
        async with t.acquire(SPEC) as lease:
            await t.release(lease)
        assert _releases(fm) == 1 and t.free_cpus == 2 and t.statistics()["released"] == 1


async def test_a_lease_from_another_tangram_or_not_a_lease_is_a_spec_error() -> None:
    async with Tangram(Pool(cpus=2)) as a, Tangram(Pool(cpus=2)) as b:
        foreign = await a.acquire_lease(SPEC)
        with pytest.raises(SpecError, match="not granted by this Tangram"):
            await b.release(foreign)
        with pytest.raises(SpecError, match="not granted by this Tangram"):
            b.release_nowait(foreign)
        assert a.free_cpus == 1  # still held where it was granted
        for junk in (None, "lease", 1):
            with pytest.raises(SpecError, match="needs the Lease"):
                await b.release(junk)  # type: ignore[arg-type]
        await a.release(foreign)
        await a.release(foreign)  # a second release of one's own lease: a no-op
        assert a.release_nowait(foreign) is True and a.free_cpus == 2


async def test_one_acquire_object_entered_twice_is_a_usage_error_and_leaks_nothing() -> None:
    async with Tangram(Pool(cpus=2)) as t:
        cm = t.acquire(SPEC)
        async with cm:
            pass
        with pytest.raises(UsageError, match="entered already"):
            async with cm:
                pass
        assert t.free_cpus == 2 and t.running == 0  # was: one core lost for good per reuse

        shared = t.acquire(SPEC)

        async def use() -> None:
            async with shared:
                await asyncio.sleep(0.01)

        results = await asyncio.gather(use(), use(), return_exceptions=True)
        assert sum(isinstance(r, UsageError) for r in results) == 1
        assert t.free_cpus == 2 and t.running == 0


async def test_an_acquire_on_another_event_loop_is_a_usage_error() -> None:
    async with Tangram(Pool(cpus=1)) as t:
        caught: list[BaseException] = []

        def other_thread() -> None:
            async def go() -> None:
                async with t.acquire(SPEC):
                    pass
            try:
                asyncio.run(go())
            except BaseException as exc:  # noqa: BLE001 (what the thread saw, checked below)
                caught.append(exc)

        th = threading.Thread(target=other_thread)
        th.start()
        th.join(10)
        assert len(caught) == 1 and isinstance(caught[0], UsageError) and isinstance(caught[0], TangramError)
        assert "SyncTangram" in str(caught[0])
        assert t.free_cpus == 1 and t.running == 0 and t.queued == 0


async def test_holders_leaving_after_the_close_are_counted() -> None:
    t = Tangram(Pool(cpus=2))
    await t.start()
    entered = asyncio.Event()
    go = asyncio.Event()

    async def holder() -> None:
        async with t.acquire(SPEC):
            entered.set()
            await go.wait()

    task = asyncio.create_task(holder())
    await entered.wait()
    await t.aclose()  # no managers: the holder is not waited for
    go.set()
    await task
    s = t.statistics()
    assert s.state == "closed" and s["running"] == 0 and s["cpus_free"] == 2 and s["completed"] == 1


def test_sync_close_waits_for_a_thread_holding_a_lease() -> None:
    sync = SyncTangram.start(Pool(cpus=1))
    out: list[str] = []
    holding = threading.Event()

    def hold() -> None:
        try:
            with sync.acquire(SPEC):
                holding.set()
                time.sleep(0.3)
            out.append("left normally")
        except BaseException as exc:  # noqa: BLE001 (reported below)
            out.append(f"{type(exc).__name__}: {exc}")

    th = threading.Thread(target=hold)
    th.start()
    assert holding.wait(10)
    t0 = time.monotonic()
    sync.close(timeout=10)
    waited = time.monotonic() - t0
    th.join(10)
    assert out == ["left normally"]  # was: RuntimeError('Event loop is closed') in the holder
    assert waited >= 0.1  # close returned once the holder had left, not at once


async def test_a_none_spec_is_a_spec_error_and_the_tangram_goes_on() -> None:
    # without managers the checked-specs cache answered "checked" for None (a miss looked like a
    # hit), and the core then died on it: every later acquire got SchedulerBrokenError
    async with Tangram(Pool(cpus=1)) as t:
        for bad in (None, "k", {"kind": "k"}):
            with pytest.raises(SpecError, match="needs an ActionSpec"):
                async with t.acquire(bad):  # type: ignore[arg-type]
                    pass
            with pytest.raises(SpecError, match="needs an ActionSpec"):
                await t.acquire_lease(bad)  # type: ignore[arg-type]
            with pytest.raises(SpecError, match="needs an ActionSpec"):
                t.feasibility(bad)  # type: ignore[arg-type]
            with pytest.raises(SpecError, match="needs an ActionSpec"):
                t.shortage(bad)  # type: ignore[arg-type]
        assert t.statistics().state == "open"
        async with t.acquire(SPEC) as lease:
            assert lease.cpus == (0,)


async def test_a_bad_observer_or_posted_event_is_refused_before_it_can_break_the_tangram() -> None:
    for bad in (None, "print", 5):
        with pytest.raises(SpecError, match="observers must be callables"):
            Tangram(Pool(cpus=1), observers=[bad])  # type: ignore[list-item]
    async with Tangram(Pool(cpus=1)) as t:
        for ev in (None, "tick", SPEC):
            with pytest.raises(SpecError, match="post\\(\\) takes a scheduler event"):
                t.post(ev)  # type: ignore[arg-type]
        async with t.acquire(SPEC):
            pass
        assert t.statistics().state == "open"


async def test_a_wall_clock_deadline_is_refused_not_waited_on_for_ever() -> None:
    # deadlines are loop.time() values; time.time() + 0.2 is ~55 years after the loop's clock and
    # never fired: the acquire just waited
    async with Tangram(Pool(cpus=1)) as t:
        with pytest.raises(SpecError, match="not time.time"):
            async with t.acquire(SPEC, deadline=time.time() + 0.2):
                pass
        loop_deadline = asyncio.get_running_loop().time() + 5
        async with t.acquire(SPEC, deadline=loop_deadline) as lease:
            assert lease.cpus == (0,)


def test_a_manager_or_tangram_that_is_not_one_is_refused_where_it_is_given() -> None:
    for bad in (None, "docker", object()):
        with pytest.raises(SpecError, match="Manager protocol"):
            Tangram(Pool(cpus=1), managers=[bad])  # type: ignore[list-item]
        with pytest.raises(SpecError, match="SyncTangram needs a Tangram"):
            SyncTangram(bad)  # type: ignore[arg-type]
