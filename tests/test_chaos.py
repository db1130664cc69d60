"""Chaos with real components: GPU restore faults in the middle of a run (TorchGpuManager on the CPU
path), cancellation landing inside manager calls, and the scheduling core dying under load.

Each scenario checks the same three things: the affected actions fail with a typed error that names
what failed, the others carry on, and nothing leaks (pool whole, no waiter, no task, GPU instances
idle); where a fault is removed, later actions succeed again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from tangram_sdk import ActionSpec, Pool, Quota, SchedulerBrokenError, Tangram
from tangram_sdk.errors import DeviceError, TangramError
from tangram_sdk.scheduler.core import Scheduler
from tangram_sdk.testing import FakeManager

torch = pytest.importorskip("torch")

from tangram_sdk.managers import _torch_store as ts  # noqa: E402
from tangram_sdk.managers.gpu import TorchGpuManager  # noqa: E402

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------------------------------- helpers
def whole(t: Tangram) -> None:
    """Every unit back, no waiter, core consistent."""
    t.scheduler.check_invariants()
    st = t.statistics()
    assert st["running"] == 0 and st["queued"] == 0 and st["waiters"] == 0, st
    assert st["cpus_free"] == st["cpus_total"] and st["gpus_free"] == st["gpus_total"], st
    assert all(q["used"] == 0 for q in st["quotas"].values()), st["quotas"]
    assert st["granted"] == st["released"] + st["running"]


def gpu_idle(mgr: TorchGpuManager) -> None:
    """No instance in use or in transition; memory charged only for resident instances."""
    s = mgr.statistics()
    for inst in s["instances"]:
        assert inst["refs"] == 0 and inst["state"] in ("cold", "resident"), inst
        assert bool(inst["bytes"]) == (inst["state"] == "resident"), inst
    for d in s["devices"].values():
        assert d["budget"] is None or d["used"] <= d["budget"], d


async def no_stray_tasks() -> None:
    await asyncio.sleep(0)
    me = asyncio.current_task()
    stray = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    assert not stray, stray


def small_module(seed: int) -> Any:
    torch.manual_seed(seed)
    return torch.nn.Linear(16, 16)


FP = ts.HostStore(torch.nn.Linear(16, 16)).footprint
X = torch.randn(4, 16)


class Fault:
    """A restore hook that can be switched on for one service (or for all) at run time."""

    def __init__(self) -> None:
        self.service: str | None = None
        self.exc: type[BaseException] | BaseException = RuntimeError("injected restore fault")
        self.times = -1  # -1: until switched off; n: the next n restores
        self.hits: list[tuple[str, tuple[str, ...]]] = []

    def __call__(self, service: str, devices: tuple[str, ...]) -> None:
        if self.service is not None and service == self.service and self.times != 0:
            self.hits.append((service, devices))
            if self.times > 0:
                self.times -= 1
            raise self.exc if isinstance(self.exc, BaseException) else self.exc("injected")


def gpu_manager(fault: Fault, n: int = 2, slots: float = 1.5) -> TorchGpuManager:
    """n CPU "devices" named cpu:0..; a budget holding ``slots`` instances per device."""
    mgr = TorchGpuManager(devices={i: f"cpu:{i}" for i in range(n)}, memory_budget=int(FP * slots),
                          restore_hook=fault)
    for i, name in enumerate(("rm_a", "rm_b", "rm_c")):
        mgr.register(name, module=small_module(i))
    return mgr


async def score(t: Tangram, service: str, gpus: int = 1) -> str:
    async with t.acquire(ActionSpec(kind=f"score-{service}", gpus=gpus, service=service)) as lease:
        y = await lease.call(X)
        assert y.shape == (4, 16)
        await asyncio.sleep(0)
    return "ok"


async def outcome(coro: Any) -> tuple[str, BaseException | None]:
    try:
        return await coro, None
    except DeviceError as exc:
        return "device_error", exc
    except TangramError as exc:  # anything else typed is a failure of the contract here
        return f"other:{type(exc).__name__}", exc


# ------------------------------------------------------------------------------------- GPU faults
async def test_restore_fault_mid_run_fails_only_that_service_and_recovers() -> None:
    fault = Fault()
    mgr = gpu_manager(fault)
    async with Tangram(Pool(gpus=2, gpu_cells=(1, 2)), managers=[mgr]) as t:
        # phase 1: healthy, both services on both devices (budget: one instance per device)
        res = await asyncio.gather(*(score(t, ("rm_a", "rm_b")[i % 2]) for i in range(40)))
        assert res == ["ok"] * 40
        # phase 2: every rm_a restore fails; rm_b keeps running and keeps evicting rm_a's copies.
        # First a 2-device rm_b evicts rm_a from both devices: a copy of rm_a left warm on one
        # device by phase 1 (an interleaving a loaded machine produced once) would spare that
        # device every restore, and the check below that both devices were tried would fail
        assert await score(t, "rm_b", gpus=2) == "ok"
        fault.service = "rm_a"
        jobs = [outcome(score(t, "rm_b")) for _ in range(40)] + [outcome(score(t, "rm_a")) for _ in range(20)]
        jobs += [outcome(score(t, "rm_a", gpus=2)) for _ in range(5)]  # a 2-device instance: always cold
        results = await asyncio.gather(*jobs)
        b, a = results[:40], results[40:]
        assert all(r == "ok" for r, _ in b), Counter(r for r, _ in b)
        failed = [e for r, e in a if r == "device_error"]
        assert failed and all(r in ("ok", "device_error") for r, _ in a), Counter(r for r, _ in a)
        for e in failed:
            assert isinstance(e, DeviceError) and e.resource is not None
            assert e.resource.startswith("rm_a@cpu:"), e.resource  # service@device(s)
            assert "rm_a" in str(e) and "cpu:" in str(e) and "injected" in str(e)
            assert isinstance(e.__cause__, RuntimeError)
        # a 2-device grant restores one shared copy per device (issue 18, M5): both were tried
        assert {d for _, d in fault.hits} == {("cpu:0",), ("cpu:1",)}
        whole(t)
        gpu_idle(mgr)
        # phase 3: fault removed: rm_a works again everywhere, including the 2-device instance
        fault.service = None
        res = await asyncio.gather(*(score(t, "rm_a", gpus=g) for g in (1, 1, 2, 1, 2)))
        assert res == ["ok"] * 5
        whole(t)
        gpu_idle(mgr)
        # failures count failed copy restores: a 2-device action may have failed on both of its copies
        wide = sum(1 for (r, e) in a[20:] if r == "device_error")
        assert len(failed) <= mgr.statistics()["failures"] <= len(failed) + wide
    await no_stray_tasks()


async def test_transient_oom_is_retried_and_persistent_oom_is_a_device_error() -> None:
    fault = Fault()
    mgr = gpu_manager(fault, slots=2.5)
    async with Tangram(Pool(gpus=2, gpu_cells=(1, 2)), managers=[mgr]) as t:
        await asyncio.gather(score(t, "rm_b"), score(t, "rm_c"))  # idle copies that an OOM may evict
        fault.service, fault.exc, fault.times = "rm_a", torch.OutOfMemoryError("injected OOM"), 1
        assert await score(t, "rm_a") == "ok"  # evict idle, retry once, succeed
        assert mgr.statistics()["retries"] == 1
        fault.service, fault.times = "rm_a", -1
        # rm_a is resident on one device now (warm hits do not restore): a 2-device grant must restore
        # its copy on the other device (copies are per device, shared by widths), which fails
        r, e = await outcome(score(t, "rm_a", gpus=2))
        assert r == "device_error" and isinstance(e, DeviceError), (r, e)
        assert "retrying once" in str(e) and e.resource in ("rm_a@cpu:0", "rm_a@cpu:1")
        assert await score(t, "rm_b") == "ok"
        fault.service = None
        assert await score(t, "rm_a", gpus=2) == "ok"
        whole(t)
        gpu_idle(mgr)
    await no_stray_tasks()


async def test_over_budget_service_is_refused_at_acquire() -> None:
    mgr = TorchGpuManager(devices={0: "cpu:0"}, memory_budget=FP // 2)
    mgr.register("big", module=small_module(0))
    async with Tangram(Pool(gpus=1), managers=[mgr]) as t:
        from tangram_sdk import InfeasibleSpecError

        with pytest.raises(InfeasibleSpecError, match="big"):
            await score(t, "big")
        whole(t)


async def test_failed_restore_does_not_leave_the_core_believing_the_service_resident() -> None:
    """A failed restore must tell the core the copy is not resident (ServiceResidency(resident=
    False)): the core marked it resident when it granted (restore=True), and believing it would
    make placement prefer a cell that holds nothing and actions wait for a "warm" copy that does
    not exist. (Once a bug in gpu.py.)"""
    fault = Fault()
    fault.service = "rm_a"
    mgr = gpu_manager(fault)
    async with Tangram(Pool(gpus=2, gpu_cells=(1, 2)), managers=[mgr]) as t:
        r, _ = await outcome(score(t, "rm_a"))
        assert r == "device_error"
        cold = {(i["service"], i["gpus"]) for i in mgr.statistics()["instances"] if i["state"] == "cold"}
        believed = {(svc, tuple(pos)) for (svc, pos) in t.scheduler._resident.last_used}
        assert not (believed & cold), f"core believes resident what the manager has cold: {believed & cold}"


async def test_cancel_during_an_lru_eviction_does_not_wedge_the_instance() -> None:
    """A native ``Task.cancel()`` (asyncio.wait_for, TaskGroup, task.cancel()) landing while an LRU
    eviction runs must not leave the victim 'evicting' forever: the next action needing it would
    wait for good. ``anyio.CancelScope(shield=True)`` does not stop such a cancel, which is why the
    eviction runs to its end in its own task. (Once a bug in gpu.py, found by benchmarks/soak.py:
    a hung trajectory after ~9k actions.)"""
    fault = Fault()
    mgr = gpu_manager(fault, n=1, slots=1.5)  # one device, room for one instance
    async with Tangram(Pool(gpus=1), managers=[mgr]) as t:
        assert await score(t, "rm_a") == "ok"  # rm_a resident, idle
        task = asyncio.create_task(score(t, "rm_b"))  # must evict rm_a first
        for _ in range(1000):
            states = {i["service"]: i["state"] for i in mgr.statistics()["instances"]}
            if states.get("rm_a") == "evicting":
                break
            await asyncio.sleep(0)
        assert states.get("rm_a") == "evicting"
        task.cancel()  # lands inside the eviction's worker-thread await
        await asyncio.wait([task])
        # the service must be usable again: either still resident or cold, never stuck in between
        try:
            res = await asyncio.wait_for(score(t, "rm_a"), 5.0)
        except TimeoutError:
            states = {i["service"]: (i["state"], i["refs"]) for i in mgr.statistics()["instances"]}
            pytest.fail(f"rm_a is wedged after a cancelled eviction: {states}")
        assert res == "ok"
        whole(t)
        gpu_idle(mgr)


# ------------------------------------------------------------------------------------- cancellation inside manager calls
# FakeManager(apply_delay=, release_delay=): a manager whose calls take a while (like a Docker API call)
async def test_second_cancel_during_release_still_returns_the_units() -> None:
    """A second cancel while a manager releases (TaskGroup teardown, an outer timeout) must not
    abort the release: the managers' undo and the return of the units run in their own task
    (``_shield.finish``), and the cancel is delivered after. (Once a bug: the release path was
    "shielded" with ``anyio.CancelScope(shield=True)``, which a native ``Task.cancel()`` passes, and
    the cores were gone for good.)"""
    m = FakeManager("slow", release_delay=0.05)
    async with Tangram(Pool(cpus=2), managers=[m]) as t:
        held = asyncio.Event()

        async def act() -> None:
            async with t.acquire(ActionSpec(kind="x", cpus=2)):
                held.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(act())
        await held.wait()
        task.cancel()  # the body is cancelled; __aexit__ starts the slow release
        await asyncio.sleep(0.01)
        task.cancel()  # a second cancel lands inside the release
        await asyncio.wait([task])
        assert task.cancelled()
        await asyncio.sleep(0.1)
        st = t.statistics()
        assert st["running"] == 0 and st["cpus_free"] == 2, f"leaked grant: {st['running']} running"
        async with t.acquire(ActionSpec(kind="x", cpus=2), timeout=1.0):
            pass
        whole(t)


async def test_second_cancel_during_apply_cleanup_still_returns_the_units() -> None:
    """Same root cause on the apply path: a cancel during apply starts the unapply of managers
    already applied; a second cancel there skips ``_leave`` as well."""
    first = FakeManager("first", release_delay=0.05)
    second = FakeManager("second", apply_delay=0.05, release_delay=0.05)
    async with Tangram(Pool(cpus=2), managers=[first, second]) as t:
        task = asyncio.create_task(t.acquire(ActionSpec(kind="x", cpus=2)).__aenter__())
        while second.applied == 0:
            await asyncio.sleep(0)
        task.cancel()  # inside second.apply -> first.release starts
        await asyncio.sleep(0.01)
        task.cancel()  # inside first.release
        await asyncio.wait([task])
        await asyncio.sleep(0.1)
        st = t.statistics()
        assert st["running"] == 0 and st["cpus_free"] == 2, f"leaked grant: {st['running']} running"


async def test_single_cancel_at_every_step_of_apply_and_release_leaks_nothing() -> None:
    """One cancel (the common case) at each of the first N loop steps of an action whose managers
    await on both apply and release: whatever the step, the pool comes back whole."""
    m1 = FakeManager("m1", apply_delay=0.002, release_delay=0.002)
    m2 = FakeManager("m2", apply_delay=0.001, release_delay=0.001)
    async with Tangram(Pool(cpus=2, quotas={"api": Quota(concurrency=1)}), managers=[m1, m2]) as t:
        async def act() -> None:
            async with t.acquire(ActionSpec(kind="x", cpus=1, quotas={"api": 1})):
                await asyncio.sleep(0.002)

        for step in range(40):
            blocker = asyncio.create_task(act())
            task = asyncio.create_task(act())
            for _ in range(step):
                await asyncio.sleep(0.0005)
            task.cancel()
            await asyncio.wait([task, blocker])
            whole(t)
        assert m1.applied == m1.released and m2.applied == m2.released


# ------------------------------------------------------------------------------------- the core dies
def _break_after(core: Scheduler, n: int, when: Any = None) -> list[int]:
    """Make the core raise from inside a round after ``n`` more rounds (optionally only for events
    matching ``when``)."""
    calls = [0]
    orig = core._round

    def round_(now: float) -> Any:
        calls[0] += 1
        if calls[0] > n and (when is None or when()):
            raise RuntimeError("injected core failure")
        return orig(now)

    core._round = round_  # type: ignore[method-assign]
    return calls


async def _collect(waiters: list[asyncio.Task[Any]], within: float) -> Counter[str]:
    t0 = time.monotonic()
    done, pending = await asyncio.wait(waiters, timeout=within)
    assert not pending, f"{len(pending)} waiters still hanging {time.monotonic() - t0:.2f} s after the failure"
    out: Counter[str] = Counter()
    for w in done:
        if w.cancelled():
            out["cancelled"] += 1
        elif w.exception() is None:
            out["ok"] += 1
        else:
            out[type(w.exception()).__name__] += 1
            if isinstance(w.exception(), SchedulerBrokenError):
                assert isinstance(w.exception().__cause__, RuntimeError)
    return out


async def test_core_failure_during_a_burst_reaches_hundreds_of_waiters_at_once() -> None:
    t = Tangram(Pool(cpus=4, quotas={"api": Quota(concurrency=2)}))
    async with t:
        started = asyncio.Event()
        release = asyncio.Event()

        async def act(i: int) -> str:
            spec = ActionSpec(kind=f"k{i % 3}", cpus=1 + i % 2, quotas={"api": 1} if i % 5 == 0 else {})
            async with t.acquire(spec):
                started.set()
                await release.wait()
            return "ok"

        tasks = [asyncio.create_task(act(i)) for i in range(600)]
        await started.wait()
        for _ in range(5):
            await asyncio.sleep(0)
        st = t.statistics()
        assert st["running"] >= 1 and st["queued"] >= 500, st
        running = st["running"]
        _break_after(t.scheduler, 0)
        release.set()  # the holders leave: their Released events hit the broken core
        counts = await _collect(tasks, within=1.0)
        assert counts["SchedulerBrokenError"] >= 500 and counts["ok"] == running, counts
        assert sum(counts.values()) == 600
        assert t.statistics()["state"] == "broken" and t.statistics()["waiters"] == 0
        with pytest.raises(SchedulerBrokenError):
            async with t.acquire(ActionSpec(kind="x", cpus=1)):
                pass
    await no_stray_tasks()


async def test_core_failure_inside_a_timer_tick_for_a_rate_limited_quota() -> None:
    from tangram_sdk.scheduler.events import Tick

    pool = Pool(quotas={"search": Quota(concurrency=1000, rate=10.0, burst=1)})
    t = Tangram(pool)
    async with t:
        seen: list[Any] = []
        orig_handle = t.scheduler.handle

        def handle(ev: Any, now: float) -> Any:
            seen.append(ev)
            return orig_handle(ev, now)

        t.scheduler.handle = handle  # type: ignore[method-assign]
        _break_after(t.scheduler, 0, when=lambda: bool(seen) and isinstance(seen[-1], Tick))
        granted = []

        async def search() -> str:
            async with t.acquire(ActionSpec(kind="search", quotas={"search": 1})):
                granted.append(1)
            return "ok"

        t0 = time.monotonic()
        tasks = [asyncio.create_task(search()) for _ in range(300)]
        # the first token tick comes after 0.1 s; served at the quota's rate instead, the 300 would
        # take 30 s. 5 s tells those apart with room for a loaded machine (at 1 s it failed once
        # beside two other test processes on 2 cores)
        counts = await _collect(tasks, within=5.0)
        # one search holds the burst token; the rest wait for the first tick, whose round breaks.
        # On a loaded machine some submissions are handled after 0.1 s, and a round refills the
        # bucket on any event: each such late one may take a token before the first tick (a
        # token a 0.1 s; the likely cause of one failure at load ~9, not reproduced at load 6).
        # 290 allows a second of that
        assert set(counts) == {"ok", "SchedulerBrokenError"}, counts
        assert counts["ok"] + counts["SchedulerBrokenError"] == 300, counts
        assert counts["SchedulerBrokenError"] >= 290, counts
        assert any(isinstance(e, Tick) for e in seen)
        assert time.monotonic() - t0 < 5.0
    await no_stray_tasks()


async def test_core_failure_from_an_observer_and_from_a_submission() -> None:
    boom = [False]

    def observer(events: Any, now: float, decisions: Any) -> None:
        if boom[0]:
            raise RuntimeError("observer failed")

    t = Tangram(Pool(cpus=1), observers=[observer])
    async with t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)):
            waiters = [asyncio.create_task(t.acquire(ActionSpec(kind="x", cpus=1)).__aenter__()) for _ in range(200)]
            await asyncio.sleep(0.01)
            boom[0] = True
            late = asyncio.create_task(t.acquire(ActionSpec(kind="x", cpus=1)).__aenter__())  # breaks while submitting
            counts = await _collect([*waiters, late], within=1.0)
        assert counts == Counter(SchedulerBrokenError=201), counts
        assert t.statistics()["waiters"] == 0
    await no_stray_tasks()


async def test_close_with_hundreds_of_queued_waiters_and_held_leases() -> None:
    from tangram_sdk import RuntimeClosedError

    t = Tangram(Pool(cpus=2))
    release = asyncio.Event()
    started = asyncio.Event()

    async def act() -> str:
        async with t.acquire(ActionSpec(kind="x", cpus=1)):
            started.set()
            await release.wait()
        return "ok"

    async with t:
        tasks = [asyncio.create_task(act()) for _ in range(400)]
        await started.wait()
        await asyncio.sleep(0)
    # queued waiters got RuntimeClosedError at once; holders finish normally afterwards
    done, pending = await asyncio.wait(tasks, timeout=1.0)
    assert len(pending) == 2
    assert all(isinstance(d.exception(), RuntimeClosedError) for d in done)
    release.set()
    done, pending = await asyncio.wait(pending, timeout=1.0)
    assert not pending and all(d.result() == "ok" for d in done)
    await no_stray_tasks()
