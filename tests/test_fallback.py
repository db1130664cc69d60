"""The fallback (scheduler/fallback.py): the fixed DoPs a user could pick, replayed on the
stream, and the fallback to the best of them while elastic sizing is measurably behind it."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Scheduler
from tangram_sdk.runtime import Tangram
from tangram_sdk.sim.baselines import CPU_UPDATE_S, make_policy
from tangram_sdk.sim.engine import Act, Trajectory, simulate
from tangram_sdk.scheduler.decisions import Grant
from tangram_sdk.scheduler.events import Cancelled, Released, Submitted
from tangram_sdk.scheduler.fallback import _Fifo
from tangram_sdk.sim.openloop import elastic_spec, fixed_dop_acts, fixed_spec, open_loop


def _stream(gap: float, n: int, seed: int) -> list[tuple[float, float]]:
    """(arrival, work) as ``open_loop`` draws them for one spec."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(1 / gap)
        out.append((t, rng.expovariate(1.0)))
    return out


def test_the_replay_of_a_fixed_dop_is_that_policy_run_on_the_same_stream() -> None:
    # the counterfactual is exact on an open stream: the replay's mean ACT at each DoP is what
    # Scheduler(elastic=False) with that DoP measures on the same arrivals and lengths
    p, cores, gap, n = 0.9, 16, 1 / (0.6 * 16), 600
    fixed = fixed_dop_acts(p, 16, cores, gap, n, seed=3)
    a = Amdahl(p)
    for d in (1, 2, 4, 8, 16):
        fifo = _Fifo((cores,))
        total = sum(fifo.run(t, d, w / a.speedup(d)) - t for t, w in _stream(gap, n, 3))
        assert abs(total / n - fixed[d]) < 1e-9 * fixed[d], d


def _run(p: float, cap: int, cores: int, load: float, n: int, seed: int, **opts: object) -> tuple[float, Scheduler]:
    sched = Scheduler(Pool(cpus=cores), **opts)  # type: ignore[arg-type]
    return open_loop(sched, elastic_spec(cap, p, 1.0), 1 / (load * cores), n, seed=seed), sched


def test_on_several_nodes_the_replay_places_as_the_core_does() -> None:
    # two 12-core nodes: a fixed DoP of 8 leaves 4 cores a node that only narrower grants use; the
    # replay (worst fit for the elastic kind, strict FIFO across nodes) is the baseline exactly
    p, gap, n = 0.9, 1 / (0.6 * 24), 600
    pool = Pool(cpus=24, numa=["0-11", "12-23"])
    a = Amdahl(p)
    for d in (1, 2, 4, 8, 12):
        base = open_loop(Scheduler(pool, elastic=False), fixed_spec(p, d), gap, n, seed=2)
        fifo = _Fifo((12, 12))
        total = sum(fifo.run(t, d, w / a.speedup(d)) - t for t, w in _stream(gap, n, 2))
        assert abs(total / n - base) < 1e-9 * base, d
    # a fixed-size action packs into the fullest node that fits (best fit), as Placement does
    fifo = _Fifo((12, 12))
    fifo.run(0.0, 8, 10.0)  # worst fit: node 0
    fifo.run(0.0, 2, 10.0, worst=False)  # best fit: node 0 (4 free), not node 1 (12)
    assert fifo.free == [2, 12]


def test_a_stream_where_elastic_sizing_loses_falls_back_to_the_best_fixed_dop() -> None:
    # near-linear work on one 16-core node at 45 % busy: two 8-core servers beat every size the
    # price picks (M/M/2 vs grants that leave fragments); the fallback finds fifo8 and keeps it.
    # Measured: 1.009-1.013 of fifo8 with it, 1.029-1.032 without (seeds 0-2)
    n = 8000
    best = fixed_dop_acts(0.97, 16, 16, 1 / (0.45 * 16), n, seed=0, dops=(8,))[8]
    with_it, sched = _run(0.97, 16, 16, 0.45, n, 0)
    without, _ = _run(0.97, 16, 16, 0.45, n, 0, fallback=False)
    assert sched._fallback.fixed("t") == 8 == sched.statistics().fallback_dop
    assert without > 1.02 * best  # what it fixes: elastic sizing alone loses here
    assert with_it < 1.02 * best


def test_lengths_learned_it_acts_on_measured_parallelism_and_never_on_durations_alone() -> None:
    # the replay divides by the kind's speedups: measured (runs report their parallelism, as
    # lease.run does) they are right and the fallback fires (1.010-1.013 of fifo8, 1.046-1.058
    # without it, seeds 0-2); learned from durations alone they are not, and nothing moves
    n, gap = 8000, 1 / (0.45 * 16)
    best = fixed_dop_acts(0.97, 16, 16, gap, n, seed=0, dops=(8,))[8]
    spec = elastic_spec(16, 0.97, None)
    runs = {}
    for measured in (True, False):
        for on in (True, False):
            sched = Scheduler(Pool(cpus=16), fallback=on)
            runs[measured, on] = open_loop(sched, spec, gap, n, seed=0, measured=measured), sched
    assert runs[True, True][1]._fallback.fixed("t") == 8
    assert runs[True, True][0] < 1.02 * best < runs[True, False][0]
    assert runs[False, True][1]._fallback.switches == 0
    assert runs[False, True][0] == runs[False, False][0]


def test_the_narrowest_dop_is_a_candidate_however_busy_it_keeps_the_node() -> None:
    # work that gains little (Amdahl 0.5) at 90 % busy: fifo1 is best and its replay keeps the node
    # over 80 % busy, the cut for wider DoPs; it spends the fewest core-seconds of any policy, so
    # it stays a candidate (seed 0: 1.006 of fifo1 with the fallback, 1.021 without)
    n, gap = 5000, 1 / (0.9 * 16)
    best = fixed_dop_acts(0.5, 16, 16, gap, n, seed=0, dops=(1,))[1]
    sched = Scheduler(Pool(cpus=16))
    with_it = open_loop(sched, elastic_spec(16, 0.5, 1.0), gap, n, seed=0)
    without = open_loop(Scheduler(Pool(cpus=16), fallback=False), elastic_spec(16, 0.5, 1.0), gap, n, seed=0)
    assert sched._fallback.mode == 1 and sched._fallback._util(0) > 0.8
    assert with_it < 1.01 * best < 1.02 * best < without


def test_where_elastic_sizing_wins_the_fallback_never_fires() -> None:
    # 90 % busy: the price's narrow grants beat every fixed DoP by over 7 %; nothing moves
    with_it, sched = _run(0.9, 8, 16, 0.9, 3000, 0)
    without, _ = _run(0.9, 8, 16, 0.9, 3000, 0, fallback=False)
    assert sched._fallback.switches == 0 and sched._fallback.on
    assert with_it == without
    fixed = fixed_dop_acts(0.9, 8, 16, 1 / (0.9 * 16), 3000, seed=0)
    assert with_it < 0.95 * min(fixed.values())


def _grants(sched: Scheduler, specs: list[ActionSpec], n: int, seed: int) -> list[tuple[int, int]]:
    """Grant decisions (id, units) for a stream of the given specs, each released 0.3 s after."""
    rng = random.Random(seed)
    out: list[tuple[int, int]] = []
    t = 0.0
    ends: list[tuple[float, int]] = []
    for i in range(n):
        t += rng.expovariate(20.0)
        while ends and ends[0][0] <= t:
            e, aid = ends.pop(0)
            out += [(g.action_id, g.units) for g in sched.handle(Released(aid), e) if isinstance(g, Grant)]
        for g in sched.handle(Submitted(i, specs[i % len(specs)]), t):
            if isinstance(g, Grant):
                out.append((g.action_id, g.units))
                ends.append((t + 0.3, g.action_id))
                ends.sort()
    return out


def test_outside_its_scope_it_is_off_and_decisions_are_exactly_as_without_it() -> None:
    el = Elasticity("cpu", max_units=8, efficiency=Amdahl(0.9))
    t = ActionSpec(kind="t", cpus=1, elastic=el)
    u = ActionSpec(kind="u", cpus=1, elastic=el)
    mall = ActionSpec(kind="m", cpus=1, elastic=Elasticity("cpu", max_units=8, efficiency=Amdahl(0.9), malleable=True))
    declared = ActionSpec(kind="d", cpus=1, duration=0.2, elastic=el)
    big = ActionSpec(kind="big", cpus=12, duration=0.2)
    cases = [
        (Pool(cpus=16), [t, u]),  # two elastic kinds: the candidates would be pairs of DoPs
        (Pool(cpus=16), [mall]),  # a malleable kind is resized, which the replay does not model
        (Pool(cpus=16, numa=["0-7", "8-15"]), [declared, big]),  # an action spanning nodes
    ]
    for pool, specs in cases:
        on = Scheduler(pool)
        got = _grants(on, specs, 400, 5)
        assert not on._fallback.on, specs
        assert got == _grants(Scheduler(pool, fallback=False), specs, 400, 5)


def test_a_new_cap_for_its_kind_starts_the_comparison_over() -> None:
    # the kind's spec changes mid-stream (another cap): other candidates, so a record with a
    # column per old candidate must not be compared against the new ones
    from tangram_sdk.scheduler.fallback import Fallback
    from tangram_sdk.scheduler.learn import KindStats

    fb = Fallback((16,))
    st = KindStats(1.0)
    wide, narrow = elastic_spec(16, 0.9, 1.0), elastic_spec(8, 0.9, 1.0)
    rng = random.Random(4)
    t = 0.0
    for i in range(3000):
        spec = wide if i < 2000 else narrow
        t += rng.expovariate(8.0)
        fb.arrived(i, spec, st, "cpu", 1, t)
        fb.ended(i, rng.expovariate(1.0) / 3.0, 4, 0.4)
    assert fb.on and fb._dops == (1, 2, 4, 8) and len(fb._elastic) <= 1000 // 32


def test_a_cancelled_or_failed_action_leaves_the_replay_without_stalling_it() -> None:
    sched = Scheduler(Pool(cpus=4))
    spec = elastic_spec(4, 0.9, 1.0)
    shell = ActionSpec(kind="sh", cpus=1, duration=0.1)
    sched.handle(Submitted(0, spec), 0.0)  # granted the node
    sched.handle(Submitted(1, spec), 0.1)  # queued
    sched.handle(Submitted(2, shell), 0.2)
    sched.handle(Cancelled(1), 0.3)  # cancelled while queued
    sched.handle(Released(0, failed=True), 0.4)  # failed
    sched.handle(Released(2), 0.5)
    fb = sched._fallback
    assert fb.on and not fb._pending and not fb.ids


@pytest.mark.looptime
async def test_the_live_runtime_and_the_simulator_fall_back_alike() -> None:
    # the same-core equivalence (tests/test_sim_engine.py) for the fallback: 3000 open-loop
    # arrivals (a trajectory of one action each) of near-linear work on one 16-core node at 45 %
    # busy, where the fallback fires (fifo8), a trial of elastic sizing and back: the simulator and
    # the live runtime on looptime log the same decisions, entry by entry. Start-or-wait is off:
    # over 3000 actions its wake-ups land on half a microsecond somewhere in every trace tried,
    # which looptime fires a microsecond later than the simulator's grid (the harness's clock
    # artefact, tests/test_sim_engine.py); its ticks are covered there.
    spec = ActionSpec(kind="t", cpus=1, duration=1.0, elastic=Elasticity("cpu", 16, Amdahl(0.97)))
    pool = Pool(cpus=16)
    rng = random.Random(0)
    t = 0.0
    trajs = []
    for _ in range(3000):
        t += rng.expovariate(0.45 * 16)
        trajs.append(Trajectory((Act(spec, round(rng.expovariate(1.0), 6), round(t, 6)),)))

    def recorder(log: list[Any]) -> Any:
        return lambda events, now, decisions: log.append((tuple(events), round(now, 6), tuple(decisions)))

    sim_log: list[Any] = []
    pol = make_policy("tangram", pool, start_or_wait=False)
    simulate(trajs, pol, observers=[recorder(sim_log)], time_resolution=1e-6)
    fb = pol.lanes[0]._fallback
    assert fb.switches >= 3 and fb.mode == 8  # fell back, tried elastic sizing again, fell back
    plain: list[Any] = []
    simulate(trajs, make_policy("tangram", pool, start_or_wait=False, fallback=False),
             observers=[recorder(plain)], time_resolution=1e-6)
    assert plain != sim_log

    rt_log: list[Any] = []
    loop = asyncio.get_running_loop()
    async with Tangram(pool, observers=[recorder(rt_log)], batch=False, start_or_wait=False) as tangram:

        async def run(tr: Trajectory) -> None:
            for act in tr.acts:
                await asyncio.sleep(act.think)
                async with tangram.acquire(act.spec) as lease:
                    now = loop.time()  # to the same 1-us tick the simulator computes
                    end = round((now + act.work * act.relative_duration(lease.units) + CPU_UPDATE_S) * 1e6) / 1e6
                    await asyncio.sleep(end - now)

        await asyncio.gather(*(run(tr) for tr in trajs))
    assert len(sim_log) == len(rt_log)
    for i, (a, b) in enumerate(zip(sim_log, rt_log)):
        assert a == b, f"entry {i} differs:\nsim {a}\nrt  {b}"


def test_operators_see_the_fallback_in_prometheus_and_in_tangram_top() -> None:
    # a pool held at a fixed DoP is not sized elastically: the exporter says which DoP, and
    # `tangram top` says so in a note (0 / no note while sizing is elastic)
    prometheus_client = pytest.importorskip("prometheus_client")
    from tangram_sdk.observe import PrometheusMetrics
    from tangram_sdk.top import from_prometheus, render

    reg = prometheus_client.CollectorRegistry()
    sched = Scheduler(Pool(cpus=16))
    prom = PrometheusMetrics(sched, registry=reg, namespace="fb")
    try:
        text = prometheus_client.generate_latest(reg).decode()
        assert "fb_fallback_dop 0.0" in text
        assert not any("fallback" in n for n in from_prometheus(text, "fb")["notes"])
        open_loop(sched, elastic_spec(16, 0.97, 1.0), 1 / (0.45 * 16), 8000, seed=0)
        assert sched.statistics().fallback_dop == 8
        text = prometheus_client.generate_latest(reg).decode()
        assert "fb_fallback_dop 8.0" in text
        snap = from_prometheus(text, "fb")
        view = "\n".join(render(snap, source="test"))
        assert "CPU sizing: fixed DoP 8, the fallback" in view
        # the job-wide Ray pool: per node
        from tangram_sdk.top import from_ray
        notes = from_ray({"name": "p", "nodes": {"a": {"alive": True, "cpus_total": 16, "cpus_free": 0,
                                                       "fallback_dop": 4},
                                                 "b": {"alive": True, "cpus_total": 16, "fallback_dop": None}}})["notes"]
        assert [n for n in notes if "fallback" in n] == [
            "a: CPU sizing: fixed DoP 4, the fallback (elastic sizing is measurably behind that fixed DoP on this "
            "stream; it is tried again now and then, and when the load moves)"]
    finally:
        prom.unregister()


def test_at_a_fixed_dop_cores_stranded_by_grants_sized_before_it_are_used() -> None:
    # FIFO at 4 on 16 cores never strands a core; a run granted 1 core before the switch to 4
    # does, for as long as it runs. The head of the line takes those cores instead of leaving them
    # idle behind a queue; once that run ends, FIFO at 4 waits for 4 as the replay does
    sched = Scheduler(Pool(cpus=16))
    t = elastic_spec(16, 0.97, 1.0)
    grants: dict[int, int] = {}

    def feed(ev: Any, now: float) -> None:
        for d in sched.handle(ev, now):
            if isinstance(d, Grant):
                grants[d.action_id] = d.units

    feed(Submitted(0, t), 0.0)  # the kind's first arrival: the replay adopts its candidates
    feed(Released(0), 1.0)
    fb = sched._fallback
    assert fb.kind == "t" and fb.mode is None and fb._dops[:3] == (1, 2, 4)
    fb._switch(0)  # fifo1 (as when the replay finds it ahead)
    feed(Submitted(1, t), 1.0)
    assert grants[1] == 1
    feed(Submitted(2, ActionSpec(kind="shell", cpus=1)), 1.5)
    fb._switch(2)  # then fifo4
    for i in range(3, 8):
        feed(Submitted(i, t), 1.5)
    assert [grants.get(i) for i in range(3, 8)] == [4, 4, 4, 2, None]  # 2: stranded by action 1
    feed(Released(1), 2.0)  # the run sized before fifo4 ends: the next waits for 4 cores
    feed(Released(2), 2.5)
    assert 7 not in grants
    feed(Released(6), 3.0)
    assert grants[7] == 4
    sched.check_invariants()


def test_stranded_cores_go_to_the_head_only_where_that_ends_it_sooner() -> None:
    # the same stranding, but a run of the fixed DoP ends within the head's run on the stranded
    # cores: waiting for 4 ends it sooner (start or wait), so it waits, as FIFO at 4 would. Taking
    # them at once ran near-linear heads on 3-5 of 8 cores while 8 came back within a run
    # (0.97:16:16 at 60 % busy, 1,500 arrivals, seed 2: 1.124 of fifo8, 1.052 waiting)
    sched = Scheduler(Pool(cpus=16))
    t = elastic_spec(16, 0.97, 1.0)  # 1 s on one core: 0.515 s on 2, 0.274 s on 4
    grants: dict[int, int] = {}

    def feed(ev: Any, now: float) -> None:
        for d in sched.handle(ev, now):
            if isinstance(d, Grant):
                grants[d.action_id] = d.units

    feed(Submitted(0, t), 0.0)
    feed(Released(0), 1.0)
    fb = sched._fallback
    fb._switch(0)
    feed(Submitted(1, t), 1.0)  # 1 core, sized before the switch to 4: expected back at 2.0
    feed(Submitted(2, ActionSpec(kind="shell", cpus=1)), 1.5)
    fb._switch(2)
    for i in range(3, 6):
        feed(Submitted(i, t), 1.5)  # 4 cores each, expected back at 1.774
    assert [grants.get(i) for i in range(3, 6)] == [4, 4, 4]
    feed(Submitted(6, t), 1.7)  # 2 stranded: 2.215 on them, 2.048 after waiting for 4
    assert 6 not in grants
    feed(Released(3), 1.774)
    assert grants[6] == 4
    sched.check_invariants()


def test_on_heavy_tailed_lengths_it_stands_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    # log-normal lengths of sigma 1.5: a block's mean is one burst behind a long run, and the test
    # on 64 of them picks whichever DoP the last burst favoured. Measured (5,000 arrivals, ten
    # seeds, 0.97:16:16 at 45 % busy): 1.066 of fifo4 acting on it, 0.998 standing aside
    import tangram_sdk.scheduler.fallback as fallback

    gap, n, seed = 1 / (0.45 * 16), 5000, 8
    spec = elastic_spec(16, 0.97, 1.0)
    off = open_loop(Scheduler(Pool(cpus=16), fallback=False), spec, gap, n, seed=seed, sigma=1.5)
    sched = Scheduler(Pool(cpus=16))
    assert open_loop(sched, spec, gap, n, seed=seed, sigma=1.5) == off
    assert sched._fallback.switches == 0 and sched._fallback.watch.spread() > fallback._HEAVY
    monkeypatch.setattr(fallback, "_HEAVY", float("inf"))  # what it stands aside from
    sched = Scheduler(Pool(cpus=16))
    acting = open_loop(sched, spec, gap, n, seed=seed, sigma=1.5)
    assert sched._fallback.switches > 0 and acting > 1.1 * off
