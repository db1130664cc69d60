"""A cancel always wins: the same-iteration race between a grant and a cancel, in process.

The race (issue 14): the grant lands in the waiter's future and the waiting task is cancelled in
the *same* event-loop iteration (``fut.set_result(grant); task.cancel()``). ``asyncio.wait_for`` on
CPython 3.10/3.11 then returns the grant and drops the cancel, so a cancelled task gets the lease
and runs its whole action. These tests force the race deterministically through the public API:
the holder's ``async with`` exit grants the waiter inline (no await in between), and the holder
cancels the waiter on the very next line. Both orders are forced (grant then cancel, cancel then
grant), with and without ``timeout=``, with and without a manager that awaits in apply/release,
and against the timeout primitive directly.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from tangram_sdk import ActionSpec, Pool, Quota, Tangram
from tangram_sdk._deadline import wait_future, within
from tangram_sdk.testing import FakeManager

pytestmark = pytest.mark.timeout(60)


def whole(t: Tangram) -> None:
    t.scheduler.check_invariants()
    st = t.statistics()
    assert st["running"] == 0 and st["queued"] == 0 and st["waiters"] == 0, st
    assert st["cpus_free"] == st["cpus_total"], st
    assert all(q["used"] == 0 for q in st["quotas"].values()), st["quotas"]
    assert st["granted"] == st["released"], st


async def _race_round(t: Tangram, spec: ActionSpec, timeout: float | None, order: str) -> None:
    """One round: a holder, a queued waiter; the holder's exit grants the waiter inline and the
    holder cancels it on the next line (or just before its exit, for cancel-then-grant)."""
    ran_body: list[bool] = []
    go = asyncio.Event()
    holding = asyncio.Event()
    w_box: list[asyncio.Task[None]] = []

    async def waiter() -> None:
        async with t.acquire(spec, timeout=timeout):
            ran_body.append(True)

    async def holder() -> None:
        async with t.acquire(spec):
            holding.set()
            await go.wait()
            if order == "cancel-then-grant":
                w_box[0].cancel()
        # the exit above granted the waiter inline (set_result on its future); no await since:
        # the cancel below lands in the same iteration
        if order == "grant-then-cancel":
            w_box[0].cancel()

    h = asyncio.create_task(holder())
    await holding.wait()
    w = asyncio.create_task(waiter())
    w_box.append(w)
    while t.statistics()["queued"] != 1:
        await asyncio.sleep(0)
    go.set()
    await asyncio.wait([w, h])
    assert w.cancelled(), f"the waiter was not cancelled: {w!r}"
    assert ran_body == [], "a cancelled waiter ran its body"
    h.result()
    whole(t)


@pytest.mark.parametrize("timeout", [None, 30.0])
@pytest.mark.parametrize("order", ["grant-then-cancel", "cancel-then-grant"])
@pytest.mark.parametrize("spec", [ActionSpec(kind="cpu", cpus=1), ActionSpec(kind="api", quotas={"api": 1})],
                         ids=["cpu", "quota"])
async def test_same_iteration_grant_and_cancel_ends_cancelled(timeout: float | None, order: str,
                                                              spec: ActionSpec) -> None:
    """Fails on the old runtime (``asyncio.wait_for`` around the grant) with ``timeout=30`` on
    Python 3.10/3.11, in both orders: the cancelled waiter got the lease and ran its body."""
    async with Tangram(Pool(cpus=1, quotas={"api": Quota(concurrency=1)})) as t:
        for _ in range(20):
            await _race_round(t, spec, timeout, order)


async def _race_round_with_manager(t: Tangram, spec: ActionSpec, timeout: float | None) -> None:
    ran: list[bool] = []
    held = asyncio.Event()
    go = asyncio.Event()

    async def waiter() -> None:
        async with t.acquire(spec, timeout=timeout):
            ran.append(True)

    async def holder() -> None:
        async with t.acquire(spec):
            held.set()
            await go.wait()

    h = asyncio.create_task(holder())
    await held.wait()
    w = asyncio.create_task(waiter())
    while t.statistics()["queued"] != 1:
        await asyncio.sleep(0)

    def observe(events: Any, now: float, decisions: Any) -> None:
        # runs inside the round that granted the waiter, right after set_result on its future
        if any(getattr(d, "cpus", None) for d in decisions):
            w.cancel()

    t.observers.append(observe)
    go.set()
    await asyncio.wait([w, h])
    t.observers.remove(observe)
    assert w.cancelled() and ran == [], f"{w!r} ran={ran}"
    whole(t)


@pytest.mark.parametrize("timeout", [None, 30.0])
async def test_same_iteration_race_with_a_manager_awaiting_in_apply_and_release(timeout: float | None) -> None:
    """The manager's release awaits before the units go back, so the waiter's grant happens inside
    the holder's cleanup task; an observer cancels the waiter from that same round."""
    mgr = FakeManager("awaiting")  # yields once in apply and in release
    async with Tangram(Pool(cpus=1), managers=[mgr]) as t:
        for _ in range(20):
            await _race_round_with_manager(t, ActionSpec(kind="cpu", cpus=1), timeout)
        assert mgr.applied == mgr.released


async def test_a_storm_of_cancels_never_runs_a_cancelled_body() -> None:
    """1,000 tasks on 4 cores and a quota, with a manager awaiting in apply/release; 300 victims
    are each cancelled in the round that grants them (right after the grant's ``set_result``):
    every one ends CancelledError and none runs its body. Half wait with ``timeout=30``."""
    import random

    from tangram_sdk.scheduler.decisions import Grant

    rng = random.Random(14)
    mgr = FakeManager("awaiting")  # yields once in apply and in release
    async with Tangram(Pool(cpus=4, quotas={"api": Quota(concurrency=2)}), managers=[mgr]) as t:
        ran: set[int] = set()
        cms: dict[int, Any] = {}

        async def act(i: int) -> None:
            spec = ActionSpec(kind="k", cpus=1 + i % 2, quotas={"api": 1} if i % 5 == 0 else None)
            cms[i] = cm = t.acquire(spec, timeout=None if i % 2 else 30.0)
            async with cm:
                ran.add(i)
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(act(i)) for i in range(1000)]
        await asyncio.sleep(0)  # every task has submitted (the first ones already hold)
        by_aid = {cm.aid: i for i, cm in cms.items()}
        queued = sorted(i for i, cm in cms.items() if cm.grant is None)  # not granted at submit
        victims = set(rng.sample(queued, 300))
        cancelled: set[int] = set()

        def observe(events: Any, now: float, decisions: Any) -> None:
            for d in decisions:
                i = by_aid.get(d.action_id)
                if isinstance(d, Grant) and i in victims and i not in cancelled:
                    cancelled.add(i)
                    tasks[i].cancel()  # same iteration as the grant's set_result

        t.observers.append(observe)
        await asyncio.wait(tasks)
        t.observers.remove(observe)
        assert len(cancelled) == 300
        wrong = [i for i in cancelled if not tasks[i].cancelled()]
        assert wrong == [], f"{len(wrong)} of 300 cancelled tasks did not end CancelledError"
        assert ran & cancelled == set(), f"{len(ran & cancelled)} cancelled tasks ran their body"
        assert len(ran) == 700
        whole(t)
        assert mgr.applied == mgr.released


# ----------------------------------------------------------------------------- the primitive itself
async def test_wait_future_cancel_wins_over_a_result_set_in_the_same_iteration() -> None:
    loop = asyncio.get_running_loop()
    for timeout in (None, 30.0):
        fut: asyncio.Future[int] = loop.create_future()
        task = asyncio.create_task(wait_future(fut, timeout, lambda: "a test future"))
        await asyncio.sleep(0)
        fut.set_result(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_wait_future_cancel_wins_over_its_own_timeout_firing_in_the_same_iteration() -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int] = loop.create_future()
    task = asyncio.create_task(wait_future(fut, 0.05, lambda: "a test future"))
    await asyncio.sleep(0)
    # both the timer and the cancel become due in the same iteration
    loop.call_later(0.05, task.cancel)
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_wait_future_timeout_message_names_what_it_waited_for() -> None:
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    with pytest.raises(TimeoutError, match=r"^test: not granted within 0.05 s \(waited for 2 cpus\)$"):
        await wait_future(fut, 0.05, lambda: "test: not granted within 0.05 s (waited for 2 cpus)")
    assert fut.done()  # the timer settled it: a late grant sees a finished future and gives it back


async def _within_race(timeout: float | None, results: list[str]) -> None:
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def body() -> int:
        return await fut

    async def run() -> None:
        results.append(str(await within(body(), timeout, lambda: "body")))

    task = asyncio.create_task(run())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    fut.set_result(7)  # the child finishes in the next iteration ...
    task.cancel()  # ... and the caller is cancelled in this one
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_within_cancel_wins_over_a_body_that_finished_in_the_same_iteration() -> None:
    results: list[str] = []
    for timeout in (None, 30.0):
        await _within_race(timeout, results)
    assert results == []


async def test_within_times_out_with_the_message_and_cancels_the_body() -> None:
    stopped = asyncio.Event()

    async def body() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            stopped.set()

    t0 = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError, match="waiting for the actor: no answer within 0.1 s"):
        await within(body(), 0.1, lambda: "waiting for the actor: no answer within 0.1 s")
    assert stopped.is_set() and asyncio.get_running_loop().time() - t0 < 1.0


async def test_within_returns_the_result_and_passes_errors_through() -> None:
    async def ok() -> int:
        await asyncio.sleep(0)
        return 3

    async def bad() -> None:
        raise KeyError("x")

    assert await within(ok(), 1.0, lambda: "ok") == 3
    assert await within(ok(), None, lambda: "ok") == 3
    with pytest.raises(KeyError):
        await within(bad(), 1.0, lambda: "bad")


# ----------------------------------------------------------------------------- timeouts in the runtime
async def test_acquire_timeout_message_names_the_kind_the_wait_and_what_was_short() -> None:
    """Was an empty message on 3.11+ (``asyncio.TimeoutError is TimeoutError`` there)."""
    async with Tangram(Pool(cpus=2, quotas={"api": Quota(concurrency=1)})) as t:
        async with t.acquire(ActionSpec(kind="hold", cpus=2, quotas={"api": 1})):
            with pytest.raises(TimeoutError) as ei:
                async with t.acquire(ActionSpec(kind="pytest", cpus=1, quotas={"api": 1}), timeout=0.05):
                    pass
        msg = str(ei.value)
        assert msg.startswith("pytest: not granted within 0.05 s; waited for 1 cpu + quota api x1"), msg
        assert "cpus 0/2 free" in msg and "api 1/1 used" in msg and "1 queued" in msg, msg
        whole(t)


@pytest.mark.parametrize("bad", ["5", True, float("nan"), -1, 10**400, [1]])
async def test_bad_timeouts_are_spec_errors_naming_the_argument(bad: Any) -> None:
    from tangram_sdk import SpecError

    async with Tangram(Pool(cpus=1)) as t:
        with pytest.raises(SpecError, match="timeout"):
            t.acquire(ActionSpec(kind="x", cpus=1), timeout=bad)
        async with t.acquire(ActionSpec(kind="x", cpus=1), timeout=float("inf")):  # inf: no limit
            pass
        whole(t)


async def test_soak_cancel_storm_every_cancel_ends_cancelled() -> None:
    """benchmarks/soak.py with 30% of 6,144 actions cancelled and every acquire carrying a
    ``timeout=``: each cancel delivered ends its task CancelledError and no body starts after it.
    On the old runtime (``wait_for``) such runs found 20-21 swallowed cancels per 10,240 actions."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from soak import Soak

    soak = Soak(trajectories=2048, actions=3, epochs=1, seed=1, cancel_p=0.3, raise_p=0.05, timeout_p=1.0,
                gpu=False, think_ms=0.0, stall_s=20.0)
    rep = await soak.run()
    assert rep["leaks"] == [] and rep["unexpected"] == [], rep["leaks"]
    assert rep["cancels_delivered"] > 500, rep["cancel_phase"]
    assert rep["cancels_not_ending_cancelled"] == 0 and rep["ran_after_cancel"] == 0


def test_no_asyncio_wait_for_anywhere_in_the_package() -> None:
    """The rule behind these tests: a bounded wait goes through tangram_sdk._deadline, whose one
    code path lets a cancel win on every Python; ``asyncio.wait_for`` (and ``asyncio.timeout``,
    absent on 3.10) must not creep back in."""
    import re

    root = Path(__file__).resolve().parents[1] / "src" / "tangram_sdk"
    found = []
    for path in sorted(root.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"\bwait_for\s*\(|asyncio\.timeout\s*\(|asyncio\.timeout_at\s*\(", code) and "``" not in code:
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert found == [], "\n".join(found)
