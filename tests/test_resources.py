"""A new counted resource is one Pool declaration plus its manager (issue 16, part 3).

``sandbox_slots`` below exists nowhere in the package: the pool declares it, the specs ask for it,
and :class:`SlotManager` (about twenty lines on :class:`BaseManager`) hands out concrete slot ids
by what the lease says was granted. Everything else -- admission, feasibility, release on raise and
cancel, statistics, metrics, the simulator, traces -- comes from iterating over the pool's
counted kinds. The memory tests at the end pin that the built-in counted kind behaves as before.
"""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Any

import attrs
import pytest

from tangram_sdk import (
    ActionSpec,
    BaseManager,
    Counted,
    InfeasibleSpecError,
    ManagerContext,
    ManagerError,
    Pool,
    Quota,
    ResourceKind,
    SpecError,
    Tangram,
)
from tangram_sdk.integrations._config import pool_from_mapping, spec_from_mapping
from tangram_sdk.lease import Lease
from tangram_sdk.observe import PrometheusMetrics
from tangram_sdk.resources import BUILTIN_KINDS, MEMORY
from tangram_sdk.scheduler import Grant, Reject, Scheduler
from tangram_sdk.sim.baselines import make_policy
from tangram_sdk.sim.engine import Act, Trajectory, simulate
from tangram_sdk.sim.trace import TraceRecorder, load_trace, trace_workload
from tangram_sdk.testing import FakeManager
from tangram_sdk.top import from_prometheus, from_ray

SLOTS = "sandbox_slots"
POOL = Pool(cpus=8, resources={SLOTS: Counted(2, "slots")})  # the one declaration
SPEC = ActionSpec(kind="rollout", cpus=1, needs={SLOTS: 1})


class SlotManager(BaseManager):
    """The new resource's manager: owns concrete slot ids (as many as the pool declares) and gives
    each lease the number the scheduler granted it (``lease.counted``), back on release."""

    name = "sandbox-slots"

    def __init__(self) -> None:
        self.free: list[int] = []
        self.held: dict[int, list[int]] = {}
        self.peak = 0

    async def start(self, ctx: ManagerContext) -> None:
        self.free = list(range(ctx.pool.counted[SLOTS]))

    async def apply(self, grant: Grant, lease: Lease) -> None:
        n = lease.counted.get(SLOTS, 0)
        if n > len(self.free):  # the scheduler over-granted: the bug this whole test is about
            raise ManagerError(f"{n} slots granted, {len(self.free)} free", resource=SLOTS)
        ids = self.held[lease.action_id] = [self.free.pop() for _ in range(n)]
        self.peak = max(self.peak, sum(map(len, self.held.values())))
        await asyncio.sleep(0)  # real managers do I/O here; a cancel may land
        lease.attach(SLOTS, tuple(ids))

    async def release(self, grant: Grant, lease: Lease) -> None:
        self.free.extend(self.held.pop(lease.action_id, ()))


def _free(t: Tangram) -> int:
    return t.free_counted[SLOTS]


# ------------------------------------------------------------------------------ declaring it
def test_declarations_are_validated_and_name_the_resource() -> None:
    assert POOL.counted == {SLOTS: 2}
    assert POOL.counted_kinds == ((ResourceKind(SLOTS, "slots"), 2),)
    assert Pool(resources={"disk": 10}).resources == (("disk", Counted(10, "units")),)
    assert attrs.evolve(POOL, cpus=2).resources == POOL.resources  # the stored pairs round-trip
    assert Pool(memory=5, resources={"a": 1}).counted == {"a": 1, "memory": 5}  # memory is the built-in one
    assert BUILTIN_KINDS["memory"] is MEMORY and MEMORY.kind == "counted"
    assert BUILTIN_KINDS["cpus"].kind == BUILTIN_KINDS["gpus"].kind == "placed"
    for bad, match in [({SLOTS: -1}, SLOTS), ({SLOTS: 1.5}, SLOTS), ({SLOTS: True}, SLOTS),
                       ({"memory": 5}, "memory="), ({"cpus": 5}, "cpus="), ({"": 1}, "names"), (7, "map")]:
        with pytest.raises(SpecError, match=match):
            Pool(resources=bad)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"share names.*'api'"):
        Pool(resources={"api": 1}, quotas={"api": Quota(concurrency=1)})
    with pytest.raises(SpecError, match="capacity"):
        Counted(-1)
    with pytest.raises(SpecError, match="unit"):
        Counted(2, "")


def test_spec_needs_are_validated_and_canonical() -> None:
    assert SPEC.needs == ((SLOTS, 1),)
    assert ActionSpec(kind="a", needs={"b": 1, "a": 2}).needs == (("a", 2), ("b", 1))  # sorted: hashable
    assert ActionSpec(kind="a", needs={SLOTS: 0}) == ActionSpec(kind="a")  # zero is no demand
    for bad, match in [({SLOTS: -1}, SLOTS), ({SLOTS: 1.0}, SLOTS), ({SLOTS: False}, SLOTS),
                       ({"memory": 1}, "memory="), ({"gpus": 1}, "gpus="), ([1], "map"), ({"a b": 1}, "names")]:
        with pytest.raises(SpecError, match=match):
            ActionSpec(kind="a", needs=bad)  # type: ignore[arg-type]


def test_reprs_are_unchanged_while_no_declared_resource_is_used() -> None:
    """Decision logs hash the repr of specs and grants (benchmarks/decision_hash.py): the new
    fields show only when they say something."""
    spec = ActionSpec(kind="x", cpus=2, memory=5)
    assert repr(spec) == ("ActionSpec(kind='x', cpus=2, gpus=0, memory=5, quotas=(), elastic=None, duration=None, "
                          "priority=0, container=None, service=None, tokens=())")
    assert repr(SPEC).endswith(f"tokens=(), needs=(('{SLOTS}', 1),))")
    old = "Grant(action_id=1, cpus=(0,), gpus=(), units=0, memory=5, quotas=(), restore=False, tokens=())"
    assert repr(Grant(1, (0,), memory=5)) == old
    assert repr(Grant(1, (0,), memory=5, counted=(("memory", 5),))) == old  # says no more than memory=
    assert repr(Grant(1, (0,), counted=((SLOTS, 1),))).endswith(f"tokens=(), counted=(('{SLOTS}', 1),))")
    assert Grant(1, counted=((SLOTS, 1),)) != Grant(1)


# ------------------------------------------------------------------------------ the core
def test_core_grants_rejects_and_accounts_by_name() -> None:
    s = Scheduler(POOL)
    d = s.submit(1, SPEC, 0.0) + s.submit(2, SPEC, 0.0) + s.submit(3, SPEC, 0.0)
    assert [type(x) for x in d] == [Grant, Grant]  # the third waits for a slot, with 5 cores free
    assert d[0].counted == ((SLOTS, 1),) and s.ledger.counted_free == {SLOTS: 0}
    free_cpu = s.submit(4, ActionSpec(kind="cpu-only", cpus=1), 0.0)  # a slot wait blocks only slot users
    assert [g.action_id for g in free_cpu if isinstance(g, Grant)] == [4]
    s.check_invariants()
    assert [g.action_id for g in s.release(1, 1.0) if isinstance(g, Grant)] == [3]
    s.check_invariants()
    (big,) = s.submit(5, ActionSpec(kind="big", needs={SLOTS: 3}), 1.0)
    assert big == Reject(5, f"{SLOTS}=3 exceeds the pool's 2 slots")
    (unknown,) = s.submit(6, ActionSpec(kind="u", needs={"disk": 1}), 1.0)
    assert isinstance(unknown, Reject) and "unknown resource 'disk'" in unknown.reason
    assert "sandbox_slots 2/2" in repr(s)


# ------------------------------------------------------------------------------ the runtime
@pytest.mark.looptime
async def test_admission_limits_concurrency_by_the_new_resource() -> None:
    slots = SlotManager()
    async with Tangram(POOL, managers=[slots]) as t:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        seen: list[tuple[int, ...]] = []

        async def one() -> None:
            async with t.acquire(SPEC) as lease:
                assert lease.counted == {SLOTS: 1}
                seen.append(lease.attachment(SLOTS))
                t.check_invariants()
                await asyncio.sleep(1.0)

        await asyncio.gather(*(one() for _ in range(6)))
        # 8 cores would run all six at once; two slots run them two at a time
        assert loop.time() - t0 == pytest.approx(3.0)
        assert slots.peak == 2 and sorted(set(seen)) == [(0,), (1,)]
        assert _free(t) == 2 and sorted(slots.free) == [0, 1]


@pytest.mark.looptime
async def test_every_unit_comes_back_on_raise_cancel_and_manager_failure() -> None:
    slots = SlotManager()
    bad = FakeManager("bad").fail("apply", OSError("boom"), kind="doomed")
    async with Tangram(POOL, managers=[slots, bad]) as t:
        with pytest.raises(RuntimeError):
            async with t.acquire(SPEC):
                assert _free(t) == 1
                raise RuntimeError("the action failed")
        assert _free(t) == 2

        held = asyncio.Event()

        async def hold() -> None:
            async with t.acquire(SPEC):
                held.set()
                await asyncio.sleep(10)

        holders = [asyncio.create_task(hold()) for _ in range(2)]
        await held.wait()
        await asyncio.sleep(0.1)
        assert _free(t) == 0
        waiter = asyncio.create_task(hold())  # queued behind the two holders
        await asyncio.sleep(0.1)
        assert t.queued == 1
        waiter.cancel()
        for h in holders:
            h.cancel()
        await asyncio.gather(waiter, *holders, return_exceptions=True)
        assert _free(t) == 2 and sorted(slots.free) == [0, 1] and t.queued == 0

        with pytest.raises(ManagerError):
            async with t.acquire(ActionSpec(kind="doomed", needs={SLOTS: 2})):
                pass
        assert _free(t) == 2 and sorted(slots.free) == [0, 1]
        t.check_invariants()


async def test_too_large_or_unknown_demands_fail_at_once_naming_the_resource() -> None:
    async with Tangram(POOL) as t:
        async with asyncio.timeout(1.0):  # never a hang
            with pytest.raises(InfeasibleSpecError, match=rf"{SLOTS}=3 exceeds the pool's 2 slots"):
                async with t.acquire(ActionSpec(kind="big", needs={SLOTS: 3})):
                    pass
            with pytest.raises(SpecError, match=r"unknown resource 'disk'.*sandbox_slots"):
                async with t.acquire(ActionSpec(kind="u", needs={"disk": 1})):
                    pass
        assert _free(t) == 2 and t.running == t.queued == 0


@pytest.mark.looptime
async def test_statistics_metrics_and_timeouts_report_it() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    reg = prometheus_client.CollectorRegistry()
    prom = PrometheusMetrics(registry=reg)
    async with Tangram(attrs.evolve(POOL, memory=1000), observers=[prom]) as t:
        prom.bind(t)
        async with t.acquire(ActionSpec(kind="x", cpus=1, memory=100, needs={SLOTS: 2})):
            st = t.statistics()
            assert st.counted[SLOTS] == {"total": 2, "free": 0, "used": 2, "unit": "slots"}
            assert st.counted["memory"] == {"total": 1000, "free": 900, "used": 100, "unit": "bytes"}
            assert json.loads(json.dumps(st.asdict()))["counted"][SLOTS]["used"] == 2
            text = prometheus_client.generate_latest(reg).decode()
            assert f'tangram_resource_units{{resource="{SLOTS}",state="used"}} 2.0' in text
            assert f'tangram_resource_units{{resource="{SLOTS}",state="free"}} 0.0' in text
            assert 'tangram_resource_units{resource="memory",state="used"} 100.0' in text
            view = {r["name"]: (r["allocated"], r["total"]) for r in from_prometheus(text)["resources"]}
            assert view[SLOTS] == (2, 2) and view["memory"] == (100, 1000)  # `tangram top` shows it
            assert f"{SLOTS} 2/2" in repr(t)
            with pytest.raises(TimeoutError, match=rf"1 slots {SLOTS}.*{SLOTS} 0 slots free"):
                async with t.acquire(SPEC, timeout=0.5):
                    pass
        assert t.statistics().counted[SLOTS]["free"] == 2
    prom.unregister()


def test_tangram_top_shows_it_per_ray_node() -> None:
    node = {"alive": True, "cpus_total": 8, "cpus_free": 7,
            "counted": {SLOTS: {"total": 2, "free": 1, "used": 1, "unit": "slots"}}}
    rows = {r["name"]: (r["allocated"], r["total"]) for r in from_ray({"nodes": {"n1": node}})["resources"]}
    assert rows == {"n1/cpus": (1, 8), f"n1/{SLOTS}": (1, 2)}


# ------------------------------------------------------------------------------ sim and traces
def _peak(res: Any) -> int:
    """Most actions holding a grant at once in a simulated run."""
    edges = sorted([(g, 1) for g in res.grant] + [(e, -1) for e in res.end])  # an end sorts before a grant
    peak = now = 0
    for _t, d in edges:
        now += d
        peak = max(peak, now)
    return peak


def _sim(pool: Pool, policy: str = "tangram", n: int = 6) -> Any:
    return simulate([Trajectory((Act(SPEC, 1.0, 0.0),)) for _ in range(n)], make_policy(policy, pool))


def test_the_simulator_honours_it() -> None:
    two, four = _sim(POOL), _sim(Pool(cpus=8, resources={SLOTS: 4}))
    assert (_peak(two), _peak(four)) == (2, 4) and len(two.end) == len(four.end) == 6
    assert max(two.end) > 2.5 * min(two.end) and max(four.end) < 2.5 * min(four.end)  # 3 waves vs 2
    # the action-level FIFO baseline schedules on the same core, so it honours the slots too
    assert _peak(_sim(POOL, "fifo1")) == 2
    with pytest.raises(ValueError, match="unknown resource 'sandbox_slots'"):
        _sim(Pool(cpus=8))


def test_isolated_baseline_keeps_the_declaration_on_its_cpu_lane() -> None:
    pol = make_policy("isolated", Pool(cpus=4, gpus=2, resources={SLOTS: 2}), services=["judge"])
    assert any(lane.pool.counted == {SLOTS: 2} for lane in pol.lanes)


def test_traces_carry_the_declaration_and_the_needs(tmp_path: Any) -> None:
    path = tmp_path / "t.jsonl"
    pool = attrs.evolve(POOL, memory=1 << 20)
    with TraceRecorder(path, pool=pool) as rec:
        simulate([Trajectory((Act(SPEC, 1.0, 0.0),)) for _ in range(3)], make_policy("tangram", pool),
                 observers=[rec])
    head = json.loads(path.read_text().splitlines()[0])["pool"]
    assert head["resources"] == {SLOTS: {"capacity": 2, "unit": "slots"}} and head["memory"] == 1 << 20
    tpool, rows = load_trace(path)
    assert tpool is not None and tpool.counted == pool.counted and tpool.resources == pool.resources
    assert [spec.needs for _line, _rec, spec in rows] == [((SLOTS, 1),)] * 3
    wl = trace_workload(path)
    assert _peak(simulate(wl.trajectories, make_policy("tangram", wl.pool))) == 2


def test_pools_and_specs_survive_pickling_and_config() -> None:
    """What the Ray scheduler actor and its node agents receive (pickled), and the YAML forms."""
    for obj in (POOL, SPEC, Grant(1, (0,), counted=((SLOTS, 1),))):
        assert pickle.loads(pickle.dumps(obj)) == obj
    cfg = pool_from_mapping({"cpus": 8, "resources": {SLOTS: {"capacity": 2, "unit": "slots"}, "disk": 7}})
    assert cfg.counted == {"disk": 7, SLOTS: 2} and dict(cfg.resources)[SLOTS].unit == "slots"
    assert spec_from_mapping({"kind": "rollout", "cpus": 1, "needs": {SLOTS: 1}}) == SPEC
    with pytest.raises(SpecError, match="capacity"):
        pool_from_mapping({"resources": {SLOTS: {"unit": "slots"}}})
    assert POOL.describe()["resources"] == {SLOTS: {"capacity": 2, "unit": "slots"}}


# ------------------------------------------------------------------------------ memory as before
def test_memory_is_the_built_in_counted_kind_and_behaves_as_before() -> None:
    s = Scheduler(Pool(cpus=4, memory=1000))
    spec = ActionSpec(kind="m", cpus=1, memory=600)
    (g,) = s.submit(1, spec, 0.0)
    assert isinstance(g, Grant) and g.memory == 600 and g.counted == (("memory", 600),)
    assert s.submit(2, spec, 0.0) == []  # 400 bytes left
    assert s.ledger.mem_free == 400 and s.statistics().memory_free == 400
    assert s.feasibility(ActionSpec(kind="m", memory=1001)) == "memory=1001 exceeds the pool's 1000 bytes"
    s.check_invariants()
    # a pool that does not count memory: memory= is a limit for managers only, never waited on
    s2 = Scheduler(Pool(cpus=4))
    grants = s2.submit(1, spec, 0.0) + s2.submit(2, spec, 0.0)
    assert [x.memory for x in grants if isinstance(x, Grant)] == [600, 600]
    assert all(isinstance(x, Grant) and x.counted == () for x in grants)
    assert s2.statistics().counted == {} and s2.ledger.mem_free is None
    assert "600 bytes memory" in Tangram(Pool(cpus=4)).shortage(spec)  # named in its unit, counted or not
