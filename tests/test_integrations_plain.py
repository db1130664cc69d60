"""Framework-free adapters on the real runtime: Guard, SyncTangram, runtime resolution, config
parsing, spec mapping, and the IntegrationUnavailable path."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import pytest

from tangram_sdk.errors import InfeasibleSpecError, RuntimeClosedError, SpecError, TangramError
from tangram_sdk.integrations import (
    Guard,
    IntegrationUnavailable,
    SpecMappingError,
    SyncTangram,
    action,
    current_lease,
    install,
    pool_from_mapping,
    resolve_runtime,
    shutdown,
    spec_from_mapping,
)
from tangram_sdk.integrations._config import SpecMapper, import_object
from tangram_sdk.integrations._lazy import require
from tangram_sdk.pool import Pool
from tangram_sdk.runtime import Tangram
from tangram_sdk.spec import ActionSpec

ONE_CPU = ActionSpec(kind="step", cpus=1)


class Peak:
    """Counts how many holders are inside at once."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


# -- Guard ------------------------------------------------------------------------------------------
async def test_guard_limits_like_a_semaphore_but_by_pool(tangram: Tangram) -> None:
    guard = Guard(ONE_CPU)
    peak = Peak()
    seen: list[tuple[int, ...]] = []

    async def step() -> None:
        async with guard:
            with peak:
                lease = guard.lease
                assert lease is not None and current_lease() is lease
                seen.append(lease.cpus)
                await asyncio.sleep(0.02)

    await asyncio.gather(*(step() for _ in range(6)))
    assert peak.peak == 2  # two cores in the pool, one per step
    assert len(seen) == 6 and all(len(c) == 1 for c in seen)
    assert guard.lease is None and current_lease() is None
    await asyncio.sleep(0.02)  # the scheduler task processes the last Released events
    assert tangram.statistics()["cpus_free"] == 2


async def test_guard_variant_reentry_and_release_on_error(tangram: Tangram) -> None:
    guard = Guard(lambda: ONE_CPU)
    async with guard(cpus=2) as big:
        assert len(big.cpus) == 2
    async with guard as outer:
        async with Guard(ActionSpec(kind="q", quotas={"search": 1})) as inner:
            assert current_lease() is inner
        assert current_lease() is outer
    with pytest.raises(ZeroDivisionError):
        async with guard:
            _ = 1 / 0
    await asyncio.sleep(0.02)
    assert tangram.statistics()["cpus_free"] == 2
    with pytest.raises(InfeasibleSpecError):
        async with guard(cpus=3):
            pass
    with pytest.raises(SpecError):
        async with Guard(lambda: "not a spec"):  # type: ignore[arg-type, return-value]
            pass


async def test_guard_without_runtime_says_how_to_get_one() -> None:
    previous = install(None)
    try:
        with pytest.raises(RuntimeClosedError, match="install"):
            async with Guard(ONE_CPU):
                pass
    finally:
        install(previous)


async def test_hosted_runtime_from_pool_mapping_is_shared_per_loop() -> None:
    source = {"pool": {"cpus": 1, "quotas": {"api": {"concurrency": 1, "rate": 100}}}}
    a = await resolve_runtime(source)
    b = await resolve_runtime({"pool": {"cpus": 1, "quotas": {"api": {"concurrency": 1, "rate": 100}}}})
    assert a is b and a.statistics()["state"] == "open"
    async with action(ActionSpec(kind="x", cpus=1, quotas={"api": 1}), runtime=source) as lease:
        assert lease.cpus == (0,)
    await shutdown()
    assert a.statistics()["state"] == "closed"


def make_runtime() -> Tangram:
    """A factory named by import path in config (used by the tests below)."""
    return Tangram(Pool(cpus=1))


async def test_hosted_runtime_from_import_path() -> None:
    t = await resolve_runtime(f"{__name__}:make_runtime")
    assert await resolve_runtime(f"{__name__}:make_runtime") is t
    await shutdown()
    with pytest.raises(SpecError):
        await resolve_runtime(f"{__name__}:ONE_CPU")


# -- SyncTangram ------------------------------------------------------------------------------------
async def test_sync_tangram_from_worker_threads(tangram: Tangram) -> None:
    sync = SyncTangram(tangram)
    peak = Peak()

    def env_step(i: int) -> int:
        with sync.acquire(ONE_CPU) as lease:
            with peak:
                time.sleep(0.03)
            return len(lease.cpus)

    results = await asyncio.gather(*(asyncio.to_thread(env_step, i) for i in range(5)))
    assert results == [1] * 5 and peak.peak == 2

    def failing() -> None:
        with sync.acquire(ONE_CPU):
            raise KeyError("boom")

    with pytest.raises(KeyError):
        await asyncio.to_thread(failing)
    await asyncio.sleep(0.02)
    stats = await asyncio.to_thread(sync.statistics)
    assert stats["cpus_free"] == 2 and stats["failed"] >= 1

    def infeasible() -> None:
        with sync.acquire(ActionSpec(kind="big", cpus=64)):
            pass

    with pytest.raises(InfeasibleSpecError):
        await asyncio.to_thread(infeasible)

    with pytest.raises(RuntimeError, match="deadlock"), sync.acquire(ONE_CPU):
        pass


async def test_sync_tangram_timeout_releases_the_queue(tangram: Tangram) -> None:
    sync = SyncTangram(tangram)
    async with tangram.acquire(ActionSpec(kind="hog", cpus=2)):

        def starved() -> None:
            with sync.acquire(ONE_CPU, timeout=0.05):
                pass

        with pytest.raises(TimeoutError):
            await asyncio.to_thread(starved)
    assert tangram.statistics()["queued"] == 0


def test_sync_tangram_start_runs_its_own_loop() -> None:
    with SyncTangram.start(Pool(cpus=2)) as sync:
        peak = Peak()

        def work() -> None:
            with sync.acquire(ONE_CPU), peak:
                time.sleep(0.03)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert peak.peak == 2
        assert sync.statistics()["completed"] == 4
    with pytest.raises(RuntimeError):
        SyncTangram(sync.tangram)  # no running loop here


def test_sync_tangram_passes_length_hints_and_refuses_bad_ones() -> None:
    seen: list[object] = []
    with SyncTangram.start(Pool(cpus=2)) as sync:
        sync.tangram.observers.append(lambda evs, _now, _ds: seen.extend(evs))
        with sync.acquire(ONE_CPU, expected_s=3.0):
            pass
        with pytest.raises(SpecError, match="expected_s"):
            with sync.acquire(ONE_CPU, expected_s=-1.0):
                pass
        assert sync.statistics()["completed"] == 1 and sync.statistics()["submitted"] == 1
    assert [getattr(e, "expected", None) for e in seen if type(e).__name__ == "Submitted"] == [3.0]


# -- config parsing and spec mapping ----------------------------------------------------------------
def test_spec_and_pool_from_mapping() -> None:
    spec = spec_from_mapping(
        {"cpus": 1, "quotas": {"search": 1}, "elastic": {"resource": "cpu", "max_units": 8, "parallel": 0.95}},
        default_kind="sandbox",
    )
    assert spec.kind == "sandbox" and spec.max_units == 8 and spec.quota_map == {"search": 1}
    table = spec_from_mapping({"kind": "t", "cpus": 1, "elastic": {"max_units": 2, "efficiency": {"1": 1, "2": 0.8}}})
    assert table.speedup(2) == pytest.approx(1.6)
    # a YAML tool spec says its work may be resized or run again (a test suite: restartable)
    rerun = spec_from_mapping({"kind": "pytest", "cpus": 1, "elastic": {"max_units": 16, "restartable": True}})
    assert rerun.elastic is not None and rerun.elastic.restartable and not rerun.elastic.malleable
    grow = spec_from_mapping({"kind": "make", "cpus": 1, "elastic": {"max_units": 16, "malleable": True}})
    assert grow.elastic is not None and grow.elastic.malleable
    with pytest.raises(SpecError, match="exclude each other"):
        spec_from_mapping({"kind": "t", "cpus": 1, "elastic": {"max_units": 2, "malleable": True, "restartable": True}})
    with pytest.raises(SpecError, match="unknown key"):
        spec_from_mapping({"kind": "t", "cpu": 1})
    with pytest.raises(SpecError, match="kind"):
        spec_from_mapping({"cpus": 1})
    pool = pool_from_mapping({"cpus": "0-3", "quotas": {"search": {"concurrency": 2, "rate": 5}}})
    assert pool.cpus == (0, 1, 2, 3) and pool.quota_map["search"].concurrency == 2
    with pytest.raises(SpecError, match="unknown key"):
        pool_from_mapping({"cpus": 1, "quotas": {"s": {"limit": 1}}})
    assert import_object("tangram_sdk.spec:ActionSpec") is ActionSpec
    assert import_object("tangram_sdk.spec.ActionSpec") is ActionSpec
    with pytest.raises(SpecError):
        import_object("tangram_sdk.nope:X")


def test_spec_mapper_from_parameters_and_logging_once(caplog: pytest.LogCaptureFixture) -> None:
    base = spec_from_mapping({"kind": "build", "cpus": 1, "elastic": {"max_units": 4}})
    mapper = SpecMapper(spec=base, from_parameters={"max_units": "jobs", "duration": "seconds"})
    spec = mapper("build", {"jobs": 8, "seconds": 2.5})
    assert spec.max_units == 8 and spec.duration == 2.5
    # json.loads accepts Infinity and 1e400: they were an OverflowError out of int() (stop 33)
    for bad in ({"seconds": 1}, {"jobs": "many", "seconds": 1}, {"jobs": 0, "seconds": 1},
                {"jobs": float("inf"), "seconds": 1}, {"jobs": json.loads("1e400"), "seconds": 1},
                {"jobs": 2, "seconds": float("nan")}):
        with pytest.raises(SpecMappingError):
            mapper("build", bad)

    def picky(tool: str, params: Any) -> Any:  # user code meeting the model's arguments
        return spec_from_mapping({"kind": tool, "cpus": params["args"][0]})

    picky_mapper = SpecMapper(spec_for=picky)
    for bad in ({"args": []}, {"args": None}, {}):  # IndexError, TypeError, KeyError: all the call's error
        with pytest.raises(SpecMappingError):
            picky_mapper("run", bad)
    with pytest.raises(SpecError, match="spec_for maps every call"):
        SpecMapper(spec=base, spec_for=picky, from_parameters={"max_units": "jobs"})
    with pytest.raises(SpecError):
        SpecMapper()
    with pytest.raises(SpecError, match="unknown key"):
        SpecMapper(spec=base, from_parameters={"threads": "x"})

    name = f"tool-{time.monotonic_ns()}"
    with caplog.at_level(logging.DEBUG, logger="tangram_sdk.integrations"):
        for _ in range(3):
            SpecMapper.report(name, SpecMappingError("bad"))
    records = [r for r in caplog.records if name in r.getMessage()]
    assert [r.levelno for r in records] == [logging.WARNING, logging.DEBUG, logging.DEBUG]


# -- IntegrationUnavailable -------------------------------------------------------------------------
def test_missing_framework_raises_integration_unavailable() -> None:
    with pytest.raises(IntegrationUnavailable) as info:
        require("tangram_no_such_framework.tools", framework="nosuch", install="pip install nosuch")
    err = info.value
    assert isinstance(err, TangramError) and isinstance(err, ImportError)
    assert "pip install nosuch" in str(err) and err.install == "pip install nosuch"
    assert err.framework == "nosuch"
