"""A Tangram's life from more than one place at once: a close racing threads that acquire, a close
awaited twice, on the wrong loop, or during a slow start; and what observers see after it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tangram_sdk import ActionSpec, Pool, Quota, Tangram
from tangram_sdk.errors import RuntimeClosedError, UsageError
from tangram_sdk.integrations import SyncTangram
from tangram_sdk.managers import BaseManager
from tangram_sdk.observe import Timeline
from tangram_sdk.testing import FakeManager

pytestmark = pytest.mark.looptime(False)  # threads and a second loop: real time


def test_close_while_threads_acquire_never_leaves_one_blocked() -> None:
    # a thread whose acquire reaches the loop as it stops used to wait on a future nobody would
    # ever resolve (the loop dropped the work with its ready queue): for ever, timeout or not
    for rnd in range(4):
        sync = SyncTangram.start(Pool(cpus=2, quotas={"q": Quota(concurrency=1)}))
        stop = threading.Event()
        outcomes: list[str] = []

        def worker(i: int, sync: SyncTangram = sync, stop: threading.Event = stop,
                   outcomes: list[str] = outcomes) -> None:
            while not stop.is_set():
                try:
                    with sync.acquire(ActionSpec(kind="k", cpus=1, quotas={"q": 1}),
                                      timeout=(None, 0.001, 0.05)[i % 3]):
                        time.sleep(0.001)
                except TimeoutError:
                    continue
                except RuntimeClosedError:
                    outcomes.append("closed")
                    return

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(12)]
        for th in threads:
            th.start()
        time.sleep(0.2)
        sync.close(timeout=10)
        stop.set()
        for th in threads:
            th.join(10)
        assert not [th for th in threads if th.is_alive()], f"round {rnd}: a thread hung in acquire()"
        s = sync.tangram.statistics()
        assert s.running == 0 and s.queued == 0 and s.cpus_free == 2


async def test_aclose_on_another_loop_is_refused_and_changes_nothing() -> None:
    m = FakeManager("m")
    async with Tangram(Pool(cpus=1), managers=[m]) as t:
        errors: list[BaseException] = []

        def other() -> None:
            try:
                asyncio.run(t.aclose())
            except BaseException as exc:  # noqa: BLE001 - what the other loop saw
                errors.append(exc)

        th = threading.Thread(target=other)
        th.start()
        th.join(10)
        assert not th.is_alive() and isinstance(errors[0], UsageError)  # it hung, half-closed
        assert t.statistics().state == "open"
        async with t.acquire(ActionSpec(kind="k", cpus=1)):
            pass
    assert sum(c.method == "aclose" for c in m.calls) == 1  # the managers closed once, here


async def test_a_second_aclose_returns_when_the_first_has_finished() -> None:
    m = FakeManager("m")
    entered = asyncio.Event()
    async with Tangram(Pool(cpus=1), managers=[m]) as t:

        async def holder() -> None:
            async with t.acquire(ActionSpec(kind="k", cpus=1)):
                entered.set()
                await asyncio.sleep(0.5)

        h = asyncio.create_task(holder())
        await entered.wait()
        first = asyncio.create_task(t.aclose())  # e.g. a signal handler's shutdown
        await asyncio.sleep(0.05)
    # leaving `async with` is a second aclose: it must not return before the managers closed
    assert h.done() and first.done() and not m.holding
    assert sum(c.method == "aclose" for c in m.calls) == 1


async def test_aclose_during_a_slow_start_is_not_undone() -> None:
    class Slow(BaseManager):
        name = "slow"

        def __init__(self) -> None:
            self.closed = False

        async def start(self, ctx: object) -> None:
            await asyncio.sleep(0.2)

        async def aclose(self) -> None:
            self.closed = True

    m = Slow()
    t = Tangram(Pool(cpus=1), managers=[m])
    starting = asyncio.create_task(t.start())
    await asyncio.sleep(0.05)
    await t.aclose()
    with pytest.raises(RuntimeClosedError, match="closed while it started"):
        await starting
    assert m.closed and t.statistics().state == "closed"
    with pytest.raises(RuntimeClosedError):
        async with t.acquire(ActionSpec(kind="k", cpus=1)):
            pass


async def test_observers_see_the_actions_that_leave_after_the_close() -> None:
    tl = Timeline()
    t = Tangram(Pool(cpus=1), observers=[tl])
    await t.start()
    held, go = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with t.acquire(ActionSpec(kind="holder", cpus=1)):
            held.set()
            await go.wait()

    h = asyncio.create_task(holder())
    await held.wait()
    await t.aclose()
    go.set()
    await h
    assert t.statistics().running == 0
    assert not tl._granted  # the holder's span is closed (it stayed open for good)
