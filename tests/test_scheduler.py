"""Plain synchronous tests of the pure core: events in, decisions out, time as an argument."""

import math

import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Quota, Scheduler
from tangram_sdk.scheduler.decisions import Grant, Reject
from tangram_sdk.scheduler.events import Cancelled, Released, ServiceResidency, Submitted, Tick
from tangram_sdk.sim.openloop import elastic_spec, fixed_dop_acts, fixed_pair_acts, open_loop
from tangram_sdk.sim.workloads import cpu_pool


def grants(decisions):
    return {d.action_id: d for d in decisions if isinstance(d, Grant)}


def ela(cpus=1, max_units=8, p=0.9, duration=1.0, kind="t", **kw):
    return ActionSpec(kind=kind, cpus=cpus, elastic=Elasticity("cpu", max_units=max_units, efficiency=Amdahl(p)),
                      duration=duration, **kw)


def test_simple_grant_and_release_returns_units():
    s = Scheduler(Pool(cpus=4))
    g = grants(s.handle(Submitted(1, ActionSpec(kind="a", cpus=2)), 0.0))
    assert len(g[1].cpus) == 2
    assert s.ledger.free_cpus == 2
    s.handle(Released(1), 1.0)
    assert s.ledger.free_cpus == 4
    s.check_invariants()
    st = s.statistics()
    assert st.completed == 1 and st.mean_act_s == pytest.approx(1.0) and st.cpus_free == 4
    assert st["completed"] == 1 and dict(st) == st.asdict()  # the old dict access, for one release
    with pytest.raises(AttributeError):  # frozen
        st.completed = 0  # type: ignore[misc]


def test_fcfs_no_overtaking_on_a_contended_resource():
    s = Scheduler(Pool(cpus=4))
    s.handle(Submitted(1, ActionSpec(kind="a", cpus=3)), 0)
    d = s.handle(Submitted(2, ActionSpec(kind="a", cpus=4)), 0)  # does not fit: waits
    assert not grants(d)
    d = s.handle(Submitted(3, ActionSpec(kind="a", cpus=1)), 0)  # would fit, but 2 is first
    assert not grants(d)
    d = s.handle(Released(1), 1)
    assert set(grants(d)) == {2}


def test_blocked_resource_does_not_block_other_resources():
    s = Scheduler(Pool(cpus=2, quotas={"search": Quota(concurrency=1)}))
    s.handle(Submitted(1, ActionSpec(kind="s", quotas={"search": 1})), 0)
    assert not grants(s.handle(Submitted(2, ActionSpec(kind="s", quotas={"search": 1})), 0))
    assert set(grants(s.handle(Submitted(3, ActionSpec(kind="c", cpus=1)), 0))) == {3}


def test_priority_goes_first():
    s = Scheduler(Pool(cpus=1))
    s.handle(Submitted(1, ActionSpec(kind="a", cpus=1)), 0)
    s.handle(Submitted(2, ActionSpec(kind="a", cpus=1)), 0)
    s.handle(Submitted(3, ActionSpec(kind="a", cpus=1, priority=5)), 0)
    assert set(grants(s.handle(Released(1), 1))) == {3}


def test_infeasible_is_rejected_at_once():
    s = Scheduler(Pool(cpus=4, gpus=8, quotas={"q": Quota(concurrency=2)}))
    for spec, word in [
        (ActionSpec(kind="a", cpus=5), "cores"),
        (ActionSpec(kind="a", gpus=16), "GPUs"),
        (ActionSpec(kind="a", gpus=3), "cell"),
        (ActionSpec(kind="a", quotas={"q": 3}), "concurrency"),
        (ActionSpec(kind="a", quotas={"nope": 1}), "unknown quota"),
    ]:
        d = s.handle(Submitted(100 + s.rejected, spec), 0)
        assert isinstance(d[0], Reject) and word in d[0].reason
    assert s.queued == 0


def test_numa_local_grants():
    pool = Pool(cpus="0-7", numa=[[0, 1, 2, 3], [4, 5, 6, 7]])
    s = Scheduler(pool, elastic=False)
    g1 = grants(s.handle(Submitted(1, ActionSpec(kind="a", cpus=3)), 0))[1]
    g2 = grants(s.handle(Submitted(2, ActionSpec(kind="a", cpus=3)), 0))[2]
    for g in (g1, g2):
        assert set(g.cpus) <= {0, 1, 2, 3} or set(g.cpus) <= {4, 5, 6, 7}
    assert not set(g1.cpus) & set(g2.cpus)
    # a 6-core action is larger than a node: it spans nodes, never overlapping
    s.handle(Released(1), 1)
    s.handle(Released(2), 1)
    g3 = grants(s.handle(Submitted(3, ActionSpec(kind="a", cpus=6)), 2))[3]
    assert len(g3.cpus) == 6
    s.check_invariants()


def test_elastic_action_alone_gets_its_max_without_lookahead():
    s = Scheduler(Pool(cpus=16), lookahead=False)
    g = grants(s.handle(Submitted(1, ela(max_units=8)), 0))[1]
    assert g.units == 8 and len(g.cpus) == 8


def test_elastic_units_shrink_under_queue_pressure():
    s = Scheduler(Pool(cpus=8), lookahead=False)
    d = s.handle_many([Submitted(i, ela(max_units=8, p=0.5)) for i in range(1, 9)], 0)
    g = grants(d)
    assert len(g) == 8 and all(x.units == 1 for x in g.values())
    s.check_invariants()


@pytest.mark.parametrize("planner", ["priced", "estimate"])
def test_highly_parallel_actions_arriving_together_run_one_after_the_other(planner):
    # two perfectly parallel 8-unit actions on 8 cores: one after the other (ACT 1.0 + 2.0) beats
    # side by side at 4 each (ACT 2.0 + 2.0). The priced planner gets there because a perfectly
    # parallel action costs the same core-seconds at any size, so even at its bounded price it
    # asks for all 8 and the second waits; the estimate planner by evicting the second candidate.
    s = Scheduler(Pool(cpus=8), lookahead=False, planner=planner)
    d = s.handle_many([Submitted(1, ela(max_units=8, p=1.0, duration=8.0)),
                       Submitted(2, ela(max_units=8, p=1.0, duration=8.0))], 0)
    g = grants(d)
    assert set(g) == {1} and g[1].units == 8
    assert s.queued == 1
    if planner == "estimate":
        assert s.evictions >= 1
    g2 = grants(s.handle(Released(1), 1.0))
    assert g2[2].units == 8


def test_low_parallelism_actions_run_side_by_side():
    s = Scheduler(Pool(cpus=8), lookahead=False)
    d = s.handle_many([Submitted(1, ela(max_units=8, p=0.5)), Submitted(2, ela(max_units=8, p=0.5))], 0)
    assert set(grants(d)) == {1, 2}


def test_lookahead_keeps_room_for_expected_arrivals():
    # 1-s actions (Amdahl 0.9, up to 16 cores) arriving every 100 ms on 16 cores: sizing each
    # arrival for the pool as it is now starves the next one; counting expected arrivals helps.
    spec = ela(max_units=16, p=0.9, duration=1.0)
    greedy = open_loop(Scheduler(Pool(cpus=16), lookahead=False), spec, 0.1, 1500)
    ahead = open_loop(Scheduler(Pool(cpus=16), lookahead=True), spec, 0.1, 1500)
    assert ahead < greedy


FIXED_DOPS = (1, 2, 4, 8, 16)


@pytest.mark.parametrize("gap", [0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.08, 0.066])
def test_elastic_is_never_worse_than_a_fixed_degree_of_parallelism(gap):
    """Light to heavy open-loop load on a pool one action wide: elastic mean ACT within 2 % of
    the best of fixed DoP 1, 2, 4, 8 and 16 (measured: 1.019 / 1.019 / 1.016 / 1.017 / 1.009 /
    0.976 / 0.881 / 0.878 / 0.894 of it), and at least 5 % better where the pool is busiest.
    Before stop 54's narrow-pool window (moldable._RUN_SHARE) the middle gaps lost: 1.060 /
    1.109 / 1.117 / 1.075 at 0.4 / 0.3 / 0.25 / 0.2 (the test then ran 0.5 and 0.15-0.066 only)."""
    elastic = open_loop(Scheduler(Pool(cpus=16)), ela(max_units=16, p=0.9, duration=1.0), gap, 1500)
    fixed = _fixed_dops(0.9, 16, 16, gap, 1500)
    assert elastic <= min(fixed) * 1.02, (elastic, fixed)
    if gap <= 0.08:
        assert elastic <= min(fixed) * 0.95, (elastic, fixed)


def test_on_a_narrow_pool_the_pricing_window_covers_the_widest_grants_run(monkeypatch):
    """A node one grant wide: the window is 1.6 runs of the widest grant (16 cores, 0.156 of the
    single-core time), 0.25 s here; on 15 nodes of 256 cores at cap 64 it stays 1/16. Without it (the 1/16
    window alone) the open loop at 30 % busy loses 1.109x to a fixed DoP of 8."""
    import tangram_sdk.scheduler.moldable as moldable

    def window(cores, cap, nodes=1):
        s = Scheduler(cpu_pool(nodes, cores))
        s.submit(1, ela(max_units=cap, p=0.9, duration=1.0), 0.0)
        return s._cpu._window(s._running[1])

    assert window(16, 16) == pytest.approx(1.6 * (0.1 + 0.9 / 16))
    assert window(256, 64, nodes=15) == pytest.approx(1 / 16)  # a quarter of a node, 60 grants of pool
    best = min(_fixed_dops(0.9, 16, 16, 0.3, 1500))
    assert open_loop(Scheduler(Pool(cpus=16)), ela(max_units=16, p=0.9, duration=1.0), 0.3, 1500) <= 1.02 * best
    monkeypatch.setattr(moldable, "_RUN_SHARE", 0.0)
    assert open_loop(Scheduler(Pool(cpus=16)), ela(max_units=16, p=0.9, duration=1.0), 0.3, 1500) > 1.05 * best


@pytest.mark.parametrize("p, cap, cores, load", [(0.9, 16, 64, 0.45), (0.9, 32, 128, 0.3)])
def test_on_a_pool_a_few_grants_wide_the_window_covers_the_whole_run(p, cap, cores, load, monkeypatch):
    """A pool four grants wide: one grant of 16 of 64 cores holds a quarter of the pool's supply
    for its whole run, while 4-5 more arrive at 45 % busy. The window is 1.6 of that run (not 0.4,
    the node's share), so the price sees them and sizes near the best fixed DoP (8) instead of
    mixing grants of 16 with the 3-6 cores they leave. Open loop, three streams summed: measured
    0.995 / 0.987 of the best fixed DoP, 1.072 / 1.051 with the node's share alone; a pool of 15
    such nodes keeps the 1/16 window (moldable._POOL_GRANTS)."""
    import tangram_sdk.scheduler.moldable as moldable

    def window(nodes):
        s = Scheduler(cpu_pool(nodes, cores))
        s.submit(1, ela(max_units=cap, p=p, duration=1.0), 0.0)
        return s._cpu._window(s._running[1])

    run = p / cap + (1 - p)
    assert window(1) == pytest.approx(1.6 * run)
    assert window(15) == pytest.approx(max(1 / 16, 1.6 * run * cap / cores))
    gap = 1.0 / (load * cores)
    spec = ela(max_units=cap, p=p, duration=1.0)
    fixed = [fixed_dop_acts(p, cap, cores, gap, 1500, seed=k) for k in range(3)]
    best = min(sum(f[d] for f in fixed) for d in fixed[0])

    def elastic():
        return sum(open_loop(Scheduler(Pool(cpus=cores)), spec, gap, 1500, seed=k) for k in range(3))

    assert elastic() <= 1.02 * best
    monkeypatch.setattr(moldable, "_POOL_GRANTS", 0)
    assert elastic() > 1.04 * best


@pytest.mark.parametrize("load", [0.45, 0.9])
def test_two_kinds_sharing_a_node_are_never_worse_than_a_fixed_dop_for_each(load):
    """Two elastic kinds (Amdahl 0.97 and 0.9, cap 16) arriving at random on one 16-core node: the
    simple alternative is one fixed DoP per tool, the best pair for the load. Three streams
    summed: within 2 % of it, and 5 % better at 90 % busy (measured 0.961 / 0.824; over ten
    streams 0.947 / 0.794, `benchmarks/open_loop.py --mix 0.9 --shapes 0.97:16:16`)."""
    gap = 1.0 / (load * 16)
    fixed = [fixed_pair_acts(0.97, 0.9, 16, 16, gap, 1500, seed=k) for k in range(3)]
    best = min(sum(f[pair] for f in fixed) for pair in fixed[0])
    specs = (elastic_spec(16, 0.97, 1.0, kind="t"), elastic_spec(16, 0.9, 1.0, kind="u"))
    elastic = sum(open_loop(Scheduler(Pool(cpus=16)), specs, gap, 1500, seed=k) for k in range(3))
    assert elastic <= 1.02 * best, (elastic, best)
    if load >= 0.9:
        assert elastic <= 0.95 * best, (elastic, best)


def test_one_callers_loop_is_not_priced_for_its_own_arrivals(monkeypatch):
    """A notebook or one rollout worker: acquire, run, release, acquire again. Its next action
    never arrives while this one runs, but its arrival rate says one is due within the window, so
    a pool one grant wide was priced for it: 5-6 of 8 cores for every action. Once learn.LONE
    arrivals in a row have found none of the kind in flight, its own forecast is left out: all 8."""
    import tangram_sdk.scheduler.learn as learn
    import tangram_sdk.scheduler.moldable as moldable

    def loop():
        s = Scheduler(Pool(cpus=8))
        units, t = [], 0.0
        for aid in range(80):
            (g,) = grants(s.handle(Submitted(aid, ela(max_units=8, p=0.9, duration=1.0)), t)).values()
            units.append(g.units)
            t += 0.2  # the run (its length does not matter here: nothing else arrives)
            s.handle(Released(aid), t)
            t += 0.05
        s.check_invariants()
        return units

    units = loop()
    assert set(units[learn.LONE:]) == {8}, units
    monkeypatch.setattr(moldable, "LONE", 10**9)  # the forecast always counted
    assert max(loop()[learn.LONE:]) < 8


def test_an_idle_narrow_node_is_not_split_into_a_fragment(monkeypatch):
    """Near-linear work (Amdahl 0.97) on a 16-core node, 30 % busy: the price sizes a test at 12
    of the 16 idle cores, and the next arrival, due within the run two times in five, starts on
    the 4 left (3.7x slower than on 16) or waits. Weighing that leftover (moldable._past_fragment)
    takes the whole node: within 2 % of the best fixed DoP (16; measured 0.989), where without it
    the stream lost 1.148x."""
    import tangram_sdk.scheduler.moldable as moldable

    gap = 1 / (0.3 * 16)
    best = min(_fixed_dops(0.97, 16, 16, gap, 1500))
    assert open_loop(Scheduler(Pool(cpus=16)), ela(max_units=16, p=0.97, duration=1.0), gap, 1500) <= 1.02 * best
    monkeypatch.setattr(moldable, "_FRAGMENT_GRANTS", 0)
    assert open_loop(Scheduler(Pool(cpus=16)), ela(max_units=16, p=0.97, duration=1.0), gap, 1500) > 1.1 * best


def test_the_fragment_rule_stands_aside_for_widely_spread_lengths(monkeypatch):
    """With log-normal work of sigma 1.5 short tests gain from passing long ones on smaller grants,
    and taking the whole node held them behind: summed over three streams, 1.208x the mean ACT of
    the price alone with lengths learned, 1.150x with the duration declared. Past
    moldable._FRAGMENT_SPREAD (learned log-variance, or the declared kind's runs' spread) the rule
    stands aside: 1.025x / 1.002x. With exponential work (log-variance ~1.6) it still acts:
    0.896x / 0.890x. (The sizing for heavy tails that takes over past it is off here: the next
    test.)"""
    import tangram_sdk.scheduler.moldable as moldable

    monkeypatch.setattr(moldable, "_HEAVY_SPREAD", math.inf)
    gap = 1 / (0.3 * 16)

    def run(sigma, duration):
        spec = ela(max_units=16, p=0.97, duration=duration)
        return sum(open_loop(Scheduler(Pool(cpus=16)), spec, gap, 1500, seed, sigma) for seed in range(3))

    cases = [(1.5, None), (1.5, 1.0), (None, None), (None, 1.0)]
    on = [run(*c) for c in cases]
    monkeypatch.setattr(moldable, "_FRAGMENT_GRANTS", 0)
    off = [run(*c) for c in cases]
    monkeypatch.setattr(moldable, "_FRAGMENT_GRANTS", 2)
    monkeypatch.setattr(moldable, "_FRAGMENT_SPREAD", math.inf)
    unbounded = [run(*c) for c in cases[:2]]
    ratio = [x / y for x, y in zip(on, off)]
    assert ratio[0] <= 1.05 and ratio[1] <= 1.02, ratio
    assert unbounded[0] > 1.15 * off[0] and unbounded[1] > 1.1 * off[1], (unbounded, off)
    assert ratio[2] <= 0.93 and ratio[3] <= 0.93, ratio


@pytest.mark.parametrize("load", [0.15, 0.3])
@pytest.mark.parametrize("duration", [None, 1.0], ids=["learned", "declared"])
def test_heavy_tailed_lengths_size_a_narrow_node_as_the_best_fixed_dop(duration, load, monkeypatch):
    """Log-normal work of sigma 1.5, near linear (Amdahl 0.97) on a 16-core node, 15 / 30 % busy:
    a fixed DoP of 8 beats the whole node, because a short test arriving during a long one starts
    on the other half instead of waiting. The price, near zero, grants all 16. Past
    moldable._HEAVY_SPREAD such a node is sized as the best fixed DoP of a G/G/c model at the
    kind's rate (idle: that DoP; busy: no more): summed over three streams, within 5 % of the best
    fixed DoP (measured 0.989 / 1.009 learned, 0.997 / 0.920 declared); without it above 1.15x
    (1.342 / 1.201, 1.346 / 1.188)."""
    import tangram_sdk.scheduler.moldable as moldable

    gap = 1 / (load * 16)
    spec = ela(max_units=16, p=0.97, duration=duration)

    def run():
        return sum(open_loop(Scheduler(Pool(cpus=16)), spec, gap, 1500, seed, 1.5) for seed in range(3))

    fixed = [fixed_dop_acts(0.97, 16, 16, gap, 1500, seed, FIXED_DOPS, 1.5) for seed in range(3)]
    best = min(sum(f[d] for f in fixed) for d in fixed[0])
    assert run() <= 1.05 * best, run() / best
    monkeypatch.setattr(moldable, "_HEAVY_SPREAD", math.inf)
    assert run() > 1.15 * best, run() / best


def test_heavy_tailed_sizing_picks_its_dop_for_the_stream_not_the_burst(monkeypatch):
    """The best fixed DoP is picked for a stream's load, and a fixed policy keeps it through a
    burst. Sized at the 32-arrival window's rate, the G/G/c model above chose 4 cores in each
    Poisson burst (more servers for a passing peak) and those runs were still in flight, slow,
    after it: near-linear work on 16 cores at 30 % busy, log-normal sigma 1.5, lost 1.051 to fifo8
    over ten streams of 5,000 (8 of 10 losing). At the lower of that rate and the mean over the
    last ~512 arrivals (``KindStats.slow_rate``), 1.007. Three of those streams, summed (seeds
    1-3, three of the worst before): measured 1.027, and 1.078 at the windowed rate."""
    import tangram_sdk.scheduler.moldable as moldable

    gap, n, seeds = 1 / (0.3 * 16), 5000, (1, 2, 3)
    spec = elastic_spec(16, 0.97, 1.0)

    def run():
        return sum(open_loop(Scheduler(Pool(cpus=16)), spec, gap, n, seed=s, sigma=1.5) for s in seeds)

    fifo8 = sum(fixed_dop_acts(0.97, 16, 16, gap, n, s, (8,), 1.5)[8] for s in seeds)
    assert run() <= 1.045 * fifo8, run() / fifo8
    monkeypatch.setattr(moldable, "_HEAVY_SLOW", False)
    assert run() > 1.06 * fifo8, run() / fifo8


def _fixed_dops(p, cap, cores, gap, n):
    """Mean ACT of each fixed DoP in FIXED_DOPS up to ``cap`` (Amdahl ``p``), same open loop."""
    return list(fixed_dop_acts(p, cap, cores, gap, n, dops=FIXED_DOPS).values())


@pytest.mark.parametrize("p, cap, gap", [(0.97, 8, 0.05), (0.99, 16, 0.08)])
def test_near_linear_work_is_not_priced_below_a_fixed_dop(p, cap, gap, monkeypatch):
    """Near-linear work costs about the same core-seconds at any size, so a price that shrinks it
    for its own queue makes no room: it only turns waits into slower runs. Open loop, 32 cores,
    ~75 % busy: within 2 % of the best fixed DoP (measured 0.996 / 1.003); with its own demand
    counted in full, as before (``_FULL_SAVING`` ~0), 1.072 / 1.054."""
    import tangram_sdk.scheduler.moldable as moldable

    best = min(_fixed_dops(p, cap, 32, gap, 3000))
    elastic = open_loop(Scheduler(Pool(cpus=32)), ela(max_units=cap, p=p), gap, 3000)
    assert elastic <= best * 1.02, (elastic, best)
    monkeypatch.setattr(moldable, "_FULL_SAVING", 1e-9)  # every kind's demand in full
    # (and no fallback to a fixed DoP, which on 3000 arrivals rescues part of the loss: 1.034)
    full = open_loop(Scheduler(Pool(cpus=32), fallback=False), ela(max_units=cap, p=p), gap, 3000)
    assert full > best * 1.04, (full, best)


def test_another_kinds_queue_still_prices_cores(monkeypatch):
    """The discount is for an action's own kind only: a queue of near-linear actions holds cores
    whatever their size, so an Amdahl 0.9 action ahead of it is priced as if it counted in full."""
    import tangram_sdk.scheduler.moldable as moldable

    def units_ahead_of(queue):
        s = Scheduler(Pool(cpus=16), lookahead=False)
        s.submit(0, ActionSpec(kind="hog", cpus=16, duration=10.0), 0.0)
        s.submit(1, ela(max_units=16, p=0.9, kind="par"), 0.0)  # waits for the hog
        for i in range(queue):  # near-linear actions of another kind queue behind it
            s.submit(2 + i, ela(max_units=16, p=0.99, kind="lin"), 0.0)
        return grants(s.release(0, 1.0))[1].units

    alone, behind = units_ahead_of(0), units_ahead_of(3)
    assert behind < alone == 16
    monkeypatch.setattr(moldable, "_FULL_SAVING", 1e-9)  # every kind's demand in full
    assert units_ahead_of(3) == behind


def test_quota_concurrency_and_rate():
    s = Scheduler(Pool(quotas={"api": Quota(concurrency=2, rate=10.0, burst=1)}))
    spec = ActionSpec(kind="search", quotas={"api": 1})
    assert set(grants(s.handle(Submitted(1, spec), 0.0))) == {1}
    assert not grants(s.handle(Submitted(2, spec), 0.0))  # no token left
    assert s.next_wakeup == pytest.approx(0.1)
    assert set(grants(s.handle(Tick(), 0.1))) == {2}
    assert not grants(s.handle(Submitted(3, spec), 0.5))  # concurrency 2 reached, token available
    assert s.next_wakeup is None
    assert set(grants(s.handle(Released(1), 0.6))) == {3}
    s.check_invariants()


def test_cancel_queued_and_running():
    s = Scheduler(Pool(cpus=1))
    s.handle(Submitted(1, ActionSpec(kind="a", cpus=1)), 0)
    s.handle(Submitted(2, ActionSpec(kind="a", cpus=1)), 0)
    s.handle(Submitted(3, ActionSpec(kind="a", cpus=1)), 0)
    s.handle(Cancelled(2), 0.1)  # queued
    assert s.queued == 1
    d = s.handle(Cancelled(1), 0.2)  # running: acts as a release
    assert set(grants(d)) == {3}
    s.handle(Cancelled(99), 0.3)  # unknown: ignored
    s.check_invariants()
    assert s.statistics()["cancelled"] == 2


def test_duration_is_learned_per_kind():
    s = Scheduler(Pool(cpus=4), default_duration=1.0, lookahead=False, elastic=False)
    spec = ActionSpec(kind="slow", cpus=1)
    for i in range(5):
        s.handle(Submitted(i, spec), 10.0 * i)
        s.handle(Released(i), 10.0 * i + 4.0)
    assert s.estimated_duration(spec) == pytest.approx(4.0)
    espec = ela(kind="e", p=1.0, duration=None, max_units=4)
    s.handle(Submitted(100, espec), 100.0)
    g = s.grant_of(100)
    s.handle(Released(100), 100.0 + 2.0)
    # 2 s on g.units perfectly parallel units -> 2*units seconds on one unit
    assert s.estimated_duration(espec, 1) == pytest.approx(2.0 * g.units)


def test_gpu_cells_are_aligned():
    s = Scheduler(Pool(gpus=8), elastic=False)
    g1 = grants(s.handle(Submitted(1, ActionSpec(kind="a", gpus=1)), 0))[1]
    g2 = grants(s.handle(Submitted(2, ActionSpec(kind="a", gpus=2)), 0))[2]
    g4 = grants(s.handle(Submitted(3, ActionSpec(kind="a", gpus=4)), 0))[3]
    assert g2.gpus[0] % 2 == 0 and g2.gpus == tuple(range(g2.gpus[0], g2.gpus[0] + 2))
    assert g4.gpus[0] % 4 == 0 and len(g4.gpus) == 4
    assert not (set(g1.gpus) & set(g2.gpus)) and not (set(g2.gpus) & set(g4.gpus))
    s.check_invariants()


def test_gpu_elastic_units_are_cell_sizes():
    s = Scheduler(Pool(gpus=8), lookahead=False)
    spec = ActionSpec(kind="score", gpus=1, elastic=Elasticity("gpu", max_units=8, efficiency={1: 1, 2: 0.95, 4: 0.9, 8: 0.85}),
                      duration=4.0)
    g = grants(s.handle(Submitted(1, spec), 0))[1]
    assert g.units in (1, 2, 4, 8) and len(g.gpus) == g.units and g.gpus[0] % g.units == 0


def test_gpu_prefers_resident_cell_and_reports_restore():
    s = Scheduler(Pool(gpus=4), elastic=False)
    spec = ActionSpec(kind="score", gpus=1, service="rm")
    g1 = grants(s.handle(Submitted(1, spec), 0))[1]
    assert g1.restore is True
    s.handle(Released(1), 1)
    other = ActionSpec(kind="other", gpus=1, service="teacher")
    s.handle(ServiceResidency("teacher", (3,), True), 1)
    g2 = grants(s.handle(Submitted(2, spec), 2))[2]
    assert g2.gpus == g1.gpus and g2.restore is False  # warm copy reused
    g3 = grants(s.handle(Submitted(3, other), 2))[3]
    assert g3.gpus == (3,) and g3.restore is False


def test_waits_for_a_resident_instance_when_that_is_quicker_than_a_restore():
    s = Scheduler(Pool(gpus=2), elastic=False, default_restore_s=5.0)
    spec = ActionSpec(kind="score", gpus=1, service="rm", duration=1.0)
    s.handle(ServiceResidency("rm", (0,), True), 0)
    g1 = grants(s.handle(Submitted(1, spec), 0))[1]
    assert g1.gpus == (0,) and not g1.restore
    # rm is resident (and busy) on g1's GPU; a restore elsewhere costs 5 s > 1 s remaining
    assert not grants(s.handle(Submitted(2, spec), 0.1))
    g2 = grants(s.handle(Released(1), 1.0))[2]
    assert g2.gpus == g1.gpus and not g2.restore
    # with a cheap restore it goes to the free GPU at once
    s2 = Scheduler(Pool(gpus=2), elastic=False, default_restore_s=0.01)
    h1 = grants(s2.handle(Submitted(1, spec), 0))[1]
    h2 = grants(s2.handle(Submitted(2, spec), 0.1))[2]
    assert h1.gpus != h2.gpus and h2.restore


def test_residency_eviction_event_forgets_the_copy():
    s = Scheduler(Pool(gpus=1), elastic=False)
    spec = ActionSpec(kind="score", gpus=1, service="rm")
    s.handle(Submitted(1, spec), 0)
    s.handle(Released(1), 1)
    s.handle(ServiceResidency("rm", (0,), False, restore_s=0.3), 1)
    g = grants(s.handle(Submitted(2, spec), 2))[2]
    assert g.restore is True


def test_memory_accounting():
    s = Scheduler(Pool(cpus=4, memory=1000))
    s.handle(Submitted(1, ActionSpec(kind="a", memory=600)), 0)
    assert not grants(s.handle(Submitted(2, ActionSpec(kind="a", memory=600)), 0))
    assert set(grants(s.handle(Released(1), 1))) == {2}
    d = s.handle(Submitted(3, ActionSpec(kind="a", memory=2000)), 1)
    assert isinstance(d[0], Reject)


def test_duplicate_id_and_unknown_release_are_loud():
    s = Scheduler(Pool(cpus=1))
    s.handle(Submitted(1, ActionSpec(kind="a", cpus=1)), 0)
    with pytest.raises(ValueError):
        s.handle(Submitted(1, ActionSpec(kind="a", cpus=1)), 0)
    with pytest.raises(KeyError):
        s.handle(Released(42), 0)


def test_repr_and_statistics_say_what_is_held():
    s = Scheduler(Pool(cpus=4, gpus=2))
    s.handle(Submitted(1, ActionSpec(kind="a", cpus=3, gpus=1)), 0)
    assert "cpu 3/4" in repr(s) and "gpu 1/2" in repr(s)
    st = s.statistics()
    assert st["cpus_free"] == 1 and st["gpus_free"] == 1 and st["running"] == 1


def test_known_gpu_capacity_lets_a_service_scale_out_beside_another_copy():
    """With ``gpu_slots`` the core prices a restore by the copies an LRU cache would really evict.
    A GPU holding one copy of a hot service has room for a second model when it holds two, so a
    waiter restores there instead of queueing behind its busy warm copy (MOPD on 16-24 GPUs went
    from 5-6 s mean ACT to ~1 s with this)."""

    def run(slots):
        s = Scheduler(Pool(gpus=2), gpu_slots=slots)
        s.handle(ServiceResidency("x", (0,), True, 1.0), 0.0)
        s.handle(ServiceResidency("y", (1,), True, 5.0), 0.0)
        x = ActionSpec(kind="x", gpus=1, service="x", duration=4.0)
        y = ActionSpec(kind="y", gpus=1, service="y", duration=0.01)
        assert s.handle(Submitted(1, x), 0.0)[0].gpus == (0,)  # warm copy, busy until t=4
        for i in range(20):  # y is called 20 times a second on GPU 1
            t = i * 0.05
            (g,) = s.handle(Submitted(100 + i, y), t)
            assert g.gpus == (1,)
            s.handle(Released(100 + i), t + 0.01)
        return s.handle(Submitted(2, x), 1.0)

    # capacity unknown: restoring x on GPU 1 is priced as evicting y (5 s x its call rate), so x
    # waits 3 s for its warm copy
    assert run(None) == []
    # two models per GPU: nothing is evicted, a 1 s restore beats a 3 s wait
    (g,) = run(2.0)
    assert isinstance(g, Grant) and g.gpus == (1,) and g.restore
    # one model per GPU: y would be evicted, same as unknown
    assert run(1.0) == []


def test_residency_lru_victims_respect_capacity_and_tensor_parallel_shares():
    from tangram_sdk.scheduler.residency import Residency

    r = Residency(4)
    r.add(("a", (0,)), 1.0)
    r.add(("b", (0,)), 2.0)
    r.add(("c", (2, 3)), 3.0)  # TP-2: half a model on each of GPUs 2 and 3
    assert r.evicted_by((1,), 2.0) == set()  # empty GPU
    assert r.evicted_by((0,), 2.0) == {"a"}  # full: the least recently used goes
    assert r.evicted_by((0,), 3.0) == set()
    assert r.evicted_by((2,), 1.0) == {"c"}  # 0.5 used + 1 > 1
    assert r.evicted_by((2,), 1.5) == set()
    assert r.evicted_by((0, 1), 2.0) == {"a"}  # a TP-2 instance needs half a slot on GPU 0
    r.remove(("a", (0,)))
    assert r.evicted_by((0,), 2.0) == set()


def _tiny_busy(truth, seeds=range(10), trajs=2, cores=2, measured=True):
    """``trajs`` coding trajectories on one node of ``cores`` (2 on 2: ``tangram demo``'s shape,
    with shells), tests declared Amdahl 0.95, truly ``truth`` (a busy machine), runs measured
    (``measured=False``: efficiency learned from durations alone):
    Tangram's mean ACT over the best fixed DoP's (fifo1, fifo2, ... up to the node) per seed,
    geometric mean and worst."""
    from tangram_sdk.sim.metrics import summarise
    from tangram_sdk.sim.workloads import ai_coding, run_policy

    fixed = [f"fifo{d}" for d in (1, 2, 4, 8) if d <= cores]
    rs = []
    for seed in seeds:
        wl = ai_coding(trajs, nodes=1, cores=cores, seed=seed, test_max_cpus=cores, test_parallel=0.95,
                       true_parallel=truth)
        act = {p: summarise(run_policy(wl, p, measured=measured))["act_mean_s"] for p in ("tangram", *fixed)}
        rs.append(act["tangram"] / min(act[p] for p in fixed))
    return math.exp(sum(map(math.log, rs)) / len(rs)), max(rs)


def test_a_job_of_eight_callers_learns_from_durations_that_its_tests_do_not_scale(monkeypatch):
    """Eight trajectories on one 8-core node, tests declared Amdahl 0.95 and truly flat, runs not
    measured: durations are the only evidence, and a job this small never makes the 32
    completions at two sizes that an open stream needs (1.37x the best fixed DoP's mean ACT over
    ten seeds). Counting twice the kind's peak in flight per size (``learn._CENSOR``), the slope
    is learned within the job: 1.26x. Still a loss (docs/evaluation.md, durations only), bounded
    by what 50-odd tests of log-normal length can tell; a true declaration is not hurt."""
    from tangram_sdk.scheduler import learn

    with_rule = _tiny_busy(0.0, trajs=8, cores=8, measured=False)
    declared = _tiny_busy(None, trajs=8, cores=8, measured=False)
    monkeypatch.setattr(learn, "_CENSOR", 0)
    without = _tiny_busy(0.0, trajs=8, cores=8, measured=False)
    declared_without = _tiny_busy(None, trajs=8, cores=8, measured=False)
    assert with_rule[0] <= 1.30, with_rule
    assert without[0] >= 1.34, without
    assert declared[0] <= declared_without[0] + 0.01, (declared, declared_without)


def test_the_closed_pool_wait_is_the_machine_repairman_model():
    """``queueing.closed_wq``: a caller never queues behind itself; two callers on one server
    match the closed form; many callers become the open M/M/c queue; a fractional server count
    lies between its neighbours; an overloaded pool of 64 callers stays finite (logs)."""
    from tangram_sdk.scheduler.queueing import closed_wq, mmc_wq

    assert closed_wq(1, 1.0, 2.0, 0.5) == 0.0
    # M/M/1//2, t = z = 1: states 0, 1, 2 in proportion 1 : 2 : 2; L = 6/5, X = 4/5, R = 3/2
    assert closed_wq(2, 1.0, 1.0, 1.0) == pytest.approx(0.5)
    lam, t = 1.5, 1.0  # 300 callers thinking 200 s each: an open stream of 1.5/s on 2 servers
    assert closed_wq(300, 2.0, t, 300 / lam) == pytest.approx(mmc_wq(2, lam * t, t), rel=0.1)
    assert closed_wq(4, 2.0, t, 4 / lam) < 0.5 * mmc_wq(2, lam * t, t)  # few callers wait far less
    assert closed_wq(6, 2.0, 1.0, 2.0) < closed_wq(6, 1.5, 1.0, 2.0) < closed_wq(6, 1.0, 1.0, 2.0)
    w = closed_wq(64, 1.0, 1.0, 0.01)
    assert math.isfinite(w) and w == pytest.approx(63.0, rel=0.01)  # all others ahead, always


def test_a_busy_tiny_node_grants_no_more_than_a_closed_pool_of_its_callers_says(monkeypatch):
    """Four coding trajectories on one 8-core node, tests declared Amdahl 0.95 and truly gaining
    1.33x at 2 cores: grants of 4-7 cores made while others ran left the next shells and tests
    waiting, 1.13x the mean ACT of two cores per test. Capped by the fixed DoP the closed pool
    of its callers says is best (``CpuSizing._closed_dop``) within 2 % over ten seeds (0.997).
    With a true declaration it costs nothing (over 40 seeds 0.997 without, 0.996 with; these ten
    seeds 1.018 either way)."""
    from tangram_sdk.scheduler import moldable

    with_rule = _tiny_busy(0.5, trajs=4, cores=8)
    declared = _tiny_busy(None, trajs=4, cores=8)
    monkeypatch.setattr(moldable, "_CLOSED_MAX", 0)
    without = _tiny_busy(0.5, trajs=4, cores=8)
    assert with_rule[0] <= 1.02, with_rule
    assert without[0] >= 1.10, without
    assert declared[0] <= 1.04, declared


def test_the_exact_closed_chain_sees_a_wide_request_block_the_line():
    """``queueing.closed_fcfs_act``: one class of one core is the machine-repairman model; one
    class of ``d`` cores is it with ``cores // d`` servers; four callers on four cores, tests that
    gain 3.5x at four cores among 1-core shells, are best served at 2 cores per test (where
    identical servers of the mean request rate 3 and 4 as good as 2, or better); past
    ``FCFS_STATES`` or wider than the node there is no answer (inf)."""
    from tangram_sdk.scheduler.queueing import FCFS_STATES, closed_fcfs_act, closed_wq, fcfs_states

    assert closed_fcfs_act(5, 2, 2.0, ((1.0, 1, 1.0),)) == pytest.approx(1.0 + closed_wq(5, 2, 1.0, 2.0), rel=0.01)
    assert closed_fcfs_act(6, 8, 1.5, ((1.0, 3, 2.0),)) == pytest.approx(2.0 + closed_wq(6, 2, 2.0, 1.5), rel=0.01)
    act = {d: closed_fcfs_act(4, 4, 1.0, ((0.4, d, 4 * (0.05 + 0.95 / d)), (0.6, 1, 0.45))) for d in (1, 2, 3, 4)}
    assert min(act, key=act.get) == 2
    assert act[4] > 1.15 * act[2] and act[1] > 1.2 * act[2]
    assert fcfs_states(8, 2) > FCFS_STATES
    assert closed_fcfs_act(8, 8, 1.0, ((0.5, 2, 1.0), (0.5, 1, 1.0))) == math.inf
    assert closed_fcfs_act(2, 4, 1.0, ((1.0, 5, 1.0),)) == math.inf


def test_a_tiny_node_caps_wide_grants_at_the_fixed_dop_its_exact_chain_says_is_best(monkeypatch):
    """Four trajectories on one 4-core node, tests declared (and truly) Amdahl 0.95: the best
    fixed DoP is 2 in every seed, and Tangram granted 3-4 cores while another trajectory ran
    (1.049x its mean ACT over ten seeds): the identical-server model of a closed pool rates 3 and
    4 cores as good as 2, or better, so its cap never bound. The exact chain of a fixed DoP on the node
    (``moldable._EXACT_CORES``) sees a 4-core test at the head of the line hold every shell
    behind it, and the cap binds: within 2.5 %."""
    from tangram_sdk.scheduler import moldable

    exact = _tiny_busy(None, trajs=4, cores=4)
    monkeypatch.setattr(moldable, "_EXACT_CORES", 0)
    without = _tiny_busy(None, trajs=4, cores=4)
    assert exact[0] <= 1.025, exact
    assert without[0] >= 1.04, without


def test_a_grant_of_the_whole_node_prices_the_waits_of_what_arrives_during_it(monkeypatch):
    """At the whole node every arrival waits out the run, which the price (core demand spread
    over many grants) does not see. Tests that gain 1.33x at 2 cores took both for every run
    while the other trajectory's shells waited: 1.17x the mean ACT of one core per action. With
    the waits priced (``CpuSizing._whole_node``) within 6 % over ten seeds (the early runs, before
    rates are known, still take both cores); a correct declaration still ties the best fixed."""
    from tangram_sdk.scheduler import moldable

    with_rule = _tiny_busy(0.5)
    declared = _tiny_busy(None)
    monkeypatch.setattr(moldable.CpuSizing, "_whole_node", lambda self, a, want, free, mu, now: want)
    monkeypatch.setattr(moldable, "_CLOSED_MAX", 0)  # stop 59's cap alone takes back part: 1.09
    without = _tiny_busy(0.5)
    assert with_rule[0] <= 1.06, with_rule
    assert without[0] >= 1.12, without
    assert declared[0] <= 1.01, declared
