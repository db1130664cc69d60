"""Observers: Chrome-trace timeline and Prometheus metrics, on the live runtime and the simulator."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tangram_sdk.observe import PrometheusMetrics, Timeline
from tangram_sdk.pool import Pool
from tangram_sdk.runtime import Tangram
from tangram_sdk.sim.baselines import make_policy
from tangram_sdk.sim.engine import Act, Trajectory, simulate
from tangram_sdk.spec import ActionSpec, Amdahl, Elasticity

SPEC = ActionSpec(kind="build", cpus=1, elastic=Elasticity("cpu", 4, Amdahl(0.9)))


@pytest.mark.looptime
async def test_timeline_from_runtime(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tl = Timeline()
    async with Tangram(Pool(cpus=4), observers=[tl]) as tangram:

        async def one(delay: float) -> None:
            await asyncio.sleep(delay)
            async with tangram.acquire(SPEC):
                await asyncio.sleep(1.0)

        await asyncio.gather(one(0.0), one(0.25), one(0.5))
    path = tmp_path / "t.json"
    tl.export(path)
    data = json.loads(path.read_text())
    xs = [e for e in data["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
    names = {e["name"] for e in xs}
    assert names == {"build#1", "build#2", "build#3"}
    # the first action got all 4 cores: one event per core, 1 s long, starting at 0
    first = [e for e in xs if e["name"] == "build#1"]
    assert sorted(e["tid"] for e in first) == [0, 1, 2, 3]
    assert all(e["ts"] == 0 and e["dur"] == pytest.approx(1e6) for e in first)
    # no core is held by two actions at once
    by_core: dict[int, list[tuple[float, float]]] = {}
    for e in xs:
        by_core.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_core.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))
    assert any(e["ph"] == "C" for e in data["traceEvents"])
    assert any(e["ph"] == "M" and e["args"]["name"] == "cpu" for e in data["traceEvents"])


def test_timeline_from_simulator_marks_queueing() -> None:
    tl = Timeline()
    trajs = [Trajectory((Act(ActionSpec(kind="x", cpus=1), 1.0, 0.0),)) for _ in range(3)]
    simulate(trajs, make_policy("tangram", Pool(cpus=1)), observers=[tl])
    evs = tl.to_chrome()["traceEvents"]
    queued = [e for e in evs if e["ph"] == "X" and e["pid"] == 3]
    assert len(queued) == 2


def test_prometheus_collector_exposes_statistics() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    prom = PrometheusMetrics(registry=reg, namespace="tg")
    pol = make_policy("tangram", Pool(cpus=2, gpus=0))
    prom.bind(pol.lanes[0])
    trajs = [Trajectory((Act(ActionSpec(kind="x", cpus=1), 1.0, 0.0),) * 2) for _ in range(3)]
    simulate(trajs, pol, observers=[prom])
    text = prometheus_client.generate_latest(reg).decode()
    assert 'tg_resource_units{resource="cpus",state="free"} 2.0' in text
    assert 'tg_resource_units{resource="cpus",state="used"} 0.0' in text
    assert "tg_completed_total 6.0" in text
    assert "tg_running 0.0" in text and "tg_queued 0.0" in text
    assert 'tg_events_total{type="Submitted"} 6.0' in text
    assert 'tg_decisions_total{type="Grant"} 6.0' in text
    assert 'tg_action_completion_seconds_count{kind="x"} 6.0' in text
    assert "tg_mean_act_seconds" in text and "tg_mean_queue_seconds" in text
    prom.unregister()


@pytest.mark.looptime
async def test_prometheus_bound_to_runtime() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    prom = PrometheusMetrics(registry=reg)
    async with Tangram(Pool(cpus=4), observers=[prom]) as tangram:
        prom.bind(tangram)
        async with tangram.acquire(ActionSpec(kind="x", cpus=3)):
            text = prometheus_client.generate_latest(reg).decode()
            assert 'tangram_resource_units{resource="cpus",state="used"} 3.0' in text
            assert "tangram_running 1.0" in text


async def test_prometheus_built_on_its_source_exports_busy_cores_and_top_reads_zero() -> None:
    # the constructor form bound the source and then reset the busy-cores reader (no busy gauge);
    # top read a completed count of 0 as missing ("n/a")
    prometheus_client = pytest.importorskip("prometheus_client")
    from tangram_sdk.top import from_prometheus

    reg = prometheus_client.CollectorRegistry()
    async with Tangram(Pool(cpus=2)) as tangram:
        PrometheusMetrics(tangram, registry=reg)
        text = prometheus_client.generate_latest(reg).decode()
        assert "tangram_resource_busy_units" in text
        assert from_prometheus(text)["completed"] == 0


async def test_runtime_statistics_reads_the_core_counters_as_attributes() -> None:
    # docs/api.md lists them as fields; s.completed raised AttributeError (only s["completed"] worked)
    async with Tangram(Pool(cpus=1)) as tangram:
        async with tangram.acquire(ActionSpec(kind="x", cpus=1)):
            pass
        s = tangram.statistics()
        for name in ("submitted", "granted", "released", "cancelled", "rejected", "failed", "completed",
                     "rounds", "evictions", "mean_act_s", "mean_queue_s", "mean_exec_s", "resident_services"):
            assert getattr(s, name) == s[name] == getattr(s.core, name), name
        assert s.completed == s.granted == 1


@pytest.mark.looptime(False)  # a scraping thread beside the loop: real time
async def test_prometheus_scrapes_from_another_thread_under_load_never_fail() -> None:
    # collect() runs on the exporter's HTTP thread while the loop's observer changes the live
    # statistics: scrapes failed with "dictionary changed size during iteration"
    import threading

    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    prom = PrometheusMetrics(registry=reg)
    errors: list[BaseException] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            try:
                prometheus_client.generate_latest(reg)
            except BaseException as exc:  # noqa: BLE001 - what a scrape would report
                errors.append(exc)

    import sys

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the GIL over often, so the scrape lands mid-update
    try:
        await _churn_while(prom, scrape, stop)
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors[:3]


async def _churn_while(prom: PrometheusMetrics, scrape: Any, stop: Any) -> None:
    import threading

    async with Tangram(Pool(cpus=2), observers=[prom]) as tangram:
        prom.bind(tangram)
        th = threading.Thread(target=scrape)
        th.start()

        async def one(i: int) -> None:
            async with tangram.acquire(ActionSpec(kind=f"k{i % 7}", cpus=1)):
                await asyncio.sleep(0)

        t_end = asyncio.get_running_loop().time() + 1.0
        i = 0
        while asyncio.get_running_loop().time() < t_end:
            await asyncio.gather(*(one(i + j) for j in range(40)))
            i += 40
        stop.set()
        th.join(10)


def test_a_bounded_timeline_stays_bounded() -> None:
    # max_actions bounded the spans, but every round added a counter entry (~180 MB over a soak)
    from tangram_sdk.scheduler import Grant, Released, Submitted

    tl = Timeline(max_actions=10)
    spec = ActionSpec(kind="x", cpus=1)
    for i in range(2000):
        tl((Submitted(i, spec),), float(i), (Grant(i, cpus=(0,)),))
        tl((Released(i),), i + 0.5, ())
        tl((), i + 0.7, ())  # a round that changes nothing
    assert len(tl._spans) == 10 and len(tl._counters) <= 80


async def test_a_new_exporter_replaces_the_stale_one_of_its_namespace() -> None:
    # a new Tangram per epoch or a re-run notebook cell: both exporters were scraped (duplicate
    # families, top reading the stale one) and the registry kept the old Tangram alive
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    async with Tangram(Pool(cpus=4)) as first:
        PrometheusMetrics(first, registry=reg)
    async with Tangram(Pool(cpus=8)) as second:
        PrometheusMetrics(second, registry=reg)
        text = prometheus_client.generate_latest(reg).decode()
        assert text.count("# TYPE tangram_running gauge") == 1
        assert 'tangram_resource_units{resource="cpus",state="free"} 8.0' in text
