"""The one manager contract (managers/base.py), as the runtime keeps it, with the public fake.

Apply in order; a manager is recorded before its apply is awaited, so one that raises or is
cancelled half-way still gets its release; release in reverse, every one, even when one raises.
The Ray node agent goes through the same helper (tests/test_chaos_ray.py drives it on an agent).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tangram_sdk import ActionSpec, DockerError, ManagerError, Pool, QuarantineError, Tangram
from tangram_sdk.managers import BaseManager, Manager, Offer, offer_of
from tangram_sdk.managers.base import Applied
from tangram_sdk.scheduler.decisions import Grant
from tangram_sdk.testing import FakeManager


def _shared_log(*ms: FakeManager) -> list[Any]:
    """One list every fake appends its calls to, so the order across managers is visible."""
    log: list[Any] = []
    for m in ms:
        m.calls = log
    return log


def _whole(t: Tangram) -> None:
    s = t.statistics()
    assert s["running"] == 0 and s["waiters"] == 0 and s["cpus_free"] == s["cpus_total"], s


async def test_a_half_way_failure_releases_every_begun_apply_in_reverse() -> None:
    a, b, c = FakeManager("a"), FakeManager("b").fail("apply", OSError("half-way"), kind="bad"), FakeManager("c")
    log = _shared_log(a, b, c)
    async with Tangram(Pool(cpus=2), managers=[a, b, c]) as t:
        with pytest.raises(ManagerError, match="half-way") as ei:
            async with t.acquire(ActionSpec(kind="bad", cpus=2)):
                pytest.fail("the body must not run")
        assert ei.value.resource == "b" and isinstance(ei.value.__cause__, OSError)
        assert "manager 'b'" in str(ei.value)
        steps = [(x.manager, x.method, x.outcome) for x in log if x.method in ("apply", "release")]
        assert steps == [("a", "apply", "ok"), ("b", "apply", "OSError('half-way')"),
                         ("b", "release", "ok"), ("a", "release", "ok")]  # c's apply never began
        assert a.holding == b.holding == c.holding == set()
        _whole(t)
        async with t.acquire(ActionSpec(kind="good", cpus=2)):  # the cores came back
            pass


async def test_a_cancel_inside_apply_still_releases_that_manager() -> None:
    slow = FakeManager("slow", apply_delay=10.0)
    async with Tangram(Pool(cpus=1), managers=[slow]) as t:
        task = asyncio.create_task(t.acquire(ActionSpec(kind="x", cpus=1)).__aenter__())
        while slow.applied == 0:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [(x.method, x.outcome) for x in slow.calls if x.method in ("apply", "release")] == [
            ("apply", "cancelled"), ("release", "ok")]
        assert slow.holding == set()
        _whole(t)


async def test_a_typed_error_passes_unchanged_and_a_failing_release_does_not_stop_the_others() -> None:
    first = FakeManager("first")
    second = FakeManager("second").fail("apply", DockerError("daemon gone", resource="box", connection=True))
    second.fail("release", RuntimeError("release blew up"))
    async with Tangram(Pool(cpus=1), managers=[first, second]) as t:
        with pytest.raises(DockerError, match="daemon gone") as ei:  # not re-wrapped: the subclass survives
            async with t.acquire(ActionSpec(kind="x", cpus=1)):
                pass
        assert ei.value.connection
        assert first.released == 1 and second.released == 1
        _whole(t)


async def test_a_quarantined_release_holds_the_units_until_the_resource_is_back() -> None:
    loop = asyncio.get_running_loop()
    until: asyncio.Future[None] = loop.create_future()
    park = FakeManager("park").fail("release", lambda: QuarantineError("not parked", resource="box", until=until),
                                    times=1)
    async with Tangram(Pool(cpus=1), managers=[park]) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)):
            pass
        assert t.statistics()["quarantined"] == 1 and t.statistics()["cpus_free"] == 0
        with pytest.raises(TimeoutError):
            async with t.acquire(ActionSpec(kind="y", cpus=1), timeout=0.05):
                pass
        until.set_result(None)
        async with t.acquire(ActionSpec(kind="z", cpus=1), timeout=5):
            pass
        assert t.statistics()["quarantined"] == 0


async def test_applied_releases_each_manager_once() -> None:
    a, b = FakeManager("a"), FakeManager("b")
    from tangram_sdk.lease import Lease

    grant = Grant(1, cpus=(0,))
    lease = Lease(1, ActionSpec(kind="x", cpus=1), cpus=(0,), gpus=(), units=0, memory=0, quotas=(),
                  queued_s=0.0, granted_at=0.0)
    applied = Applied(grant, lease)
    await applied.apply([a, b])
    assert applied
    assert await applied.release() == [] and not applied
    assert await applied.release() == []  # a second call has nothing left to release
    assert a.released == b.released == 1


def test_base_manager_is_a_manager_and_describes_nothing() -> None:
    class Audit(BaseManager):
        name = "audit"

    assert isinstance(Audit(), Manager) and isinstance(FakeManager(), Manager)
    assert offer_of(Audit()) == Offer()
    assert offer_of(FakeManager(offer=Offer(containers=["box"], services=("llm",)))) == Offer(("box",), ("llm",))

    class Legacy:  # written before describe() existed
        name = "legacy"

    assert offer_of(Legacy()) == Offer()

    class Broken(BaseManager):
        def describe(self) -> Any:
            return ["box"]

    with pytest.raises(ManagerError, match="must return an Offer"):
        offer_of(Broken())


def test_the_concrete_managers_declare_what_they_serve() -> None:
    pytest.importorskip("torch")
    from tangram_sdk.managers import TorchGpuManager

    gpu = TorchGpuManager(devices={0: "cpu"})
    import torch

    gpu.register("tiny", module=torch.nn.Linear(2, 2))
    assert gpu.describe() == Offer(services=("tiny",))
