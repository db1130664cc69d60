"""The priced moldable sizing: the size-at-a-price rule against brute force, and the scheduler
behaviours built on it (idle pool -> the cap, flood -> smaller sizes, start-or-wait, overload)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Scheduler
from tangram_sdk.scheduler.decisions import Grant
from tangram_sdk.scheduler.events import Submitted
from tangram_sdk.scheduler.pricing import PRICE_GRID, dop_at_price, dops_over_grid


def ela(max_units=16, p=0.9, duration=None, kind="t", cpus=1):
    return ActionSpec(kind=kind, cpus=cpus, duration=duration,
                      elastic=Elasticity("cpu", max_units=max_units, efficiency=Amdahl(p)))


def grants(decisions):
    return {d.action_id: d for d in decisions if isinstance(d, Grant)}


@settings(max_examples=200, deadline=None)
@given(p=st.floats(0.0, 1.0), hi=st.integers(1, 64), mu=st.sampled_from(PRICE_GRID[1:-1]),
       scale=st.floats(0.01, 100.0))
def test_size_at_a_price_is_the_brute_force_minimum_and_ignores_the_length(p, hi, mu, scale):
    spec = ela(max_units=hi, p=p)
    sizes = list(range(1, hi + 1))
    m = dop_at_price(spec.relative_duration, sizes, mu)
    cost = [spec.relative_duration(k) * (1 + mu * k) for k in sizes]
    assert cost[m - 1] <= min(cost) * (1 + 1e-9)
    # an action 'scale' times longer picks the same size: T1 cancels out of T(m)(1 + mu m)
    assert dop_at_price(lambda k: scale * spec.relative_duration(k), sizes, mu) == m


def test_amdahl_size_follows_the_closed_form():
    # minimising T1((1-p) + p/m)(1 + mu m) over real m gives m* = sqrt(p / (mu (1 - p)))
    spec = ela(max_units=256, p=0.9)
    for mu in (0.01, 0.05, 0.2, 1.0):
        m = dop_at_price(spec.relative_duration, list(range(1, 257)), mu)
        assert abs(m - math.sqrt(0.9 / (mu * 0.1))) <= 1.0


def test_price_zero_gives_the_cap_and_infinity_the_minimum():
    spec = ela(max_units=12, cpus=2)
    sizes = list(range(2, 13))
    assert dop_at_price(spec.relative_duration, sizes, 0.0) == 12
    assert dop_at_price(spec.relative_duration, sizes, math.inf) == 2
    # no speedup at all: even at price 0 the minimum (units that do not help are not taken:
    # someone may want them a moment later); near-flat gains too (within 0.5 % of the fastest)
    flat = ela(max_units=12, p=0.0, cpus=2)
    assert dop_at_price(flat.relative_duration, sizes, 0.0) == 2
    assert dop_at_price(flat.relative_duration, sizes, 0.01) == 2
    wide = ela(max_units=64, p=0.9)
    m = dop_at_price(wide.relative_duration, list(range(1, 65)), 0.0)
    assert 60 <= m < 64 and wide.relative_duration(m) <= wide.relative_duration(64) * 1.005


@pytest.mark.parametrize("p", [0.0, 0.5, 0.9, 1.0])
def test_sizes_over_the_grid_never_grow_with_the_price(p):
    spec = ela(max_units=64, p=p)
    sizes = list(range(1, 65))
    dops = dops_over_grid(spec.relative_duration, sizes)
    assert list(dops) == sorted(dops, reverse=True)
    prev = sizes[-1]
    for mu, m in zip(PRICE_GRID, dops):  # each is the best size no larger than the one before
        assert m == dop_at_price(spec.relative_duration, [k for k in sizes if k <= prev], mu)
        prev = m


def test_an_idle_pool_gives_a_lone_action_its_cap():
    s = Scheduler(Pool(cpus=64))
    g = grants(s.submit(1, ela(max_units=16), 0.0))[1]
    assert g.units == 16 and len(g.cpus) == 16


def test_a_flood_shrinks_sizes_and_everyone_still_starts():
    # 32 well-parallel actions at once on 64 cores: at the cap (16) only 4 would run; the
    # clearing price sizes them so the whole flood fits, no smaller than max_price allows
    s = Scheduler(Pool(cpus=64))
    g = grants(s.handle_many([Submitted(i, ela(max_units=16)) for i in range(32)], 0.0))
    assert len(g) == 32
    assert all(2 <= x.units < 16 for x in g.values())  # max_price 2.0 -> at least 2 for p = 0.9
    assert sum(x.units for x in g.values()) <= 64
    s.check_invariants()


def test_a_backlog_beyond_the_pool_runs_at_the_minimum():
    # 100 queued actions on 8 cores: even at the minimum the backlog exceeds the pool, so the
    # price is not bounded (a floor of 2 cores would only lengthen the queue)
    s = Scheduler(Pool(cpus=8))
    d = s.handle_many([Submitted(i, ela(max_units=16)) for i in range(100)], 0.0)
    g = grants(d)
    assert len(g) == 8 and all(x.units == 1 for x in g.values())


def test_waits_for_cores_about_to_be_released_instead_of_starting_on_one():
    # 1 core free, 15 held by an action expected to end in 0.05 s; a 4-s, well-parallel action
    # finishes far sooner by waiting for them (0.05 + 0.4 s) than on the one free core (4 s)
    s = Scheduler(Pool(cpus=16), lookahead=False)
    fixed = ActionSpec(kind="hold", cpus=15, duration=0.05)
    assert grants(s.submit(1, fixed, 0.0))
    assert not grants(s.submit(2, ela(max_units=16, p=0.95, duration=4.0), 0.0))
    assert s.next_wakeup == pytest.approx(0.05)
    g = grants(s.release(1, 0.05))
    assert g[2].units == 16
    # without start-or-wait it would have started at once on the single free core
    s2 = Scheduler(Pool(cpus=16), lookahead=False, start_or_wait=False)
    s2.submit(1, fixed, 0.0)
    assert grants(s2.submit(2, ela(max_units=16, p=0.95, duration=4.0), 0.0))[2].units == 1


def test_does_not_wait_when_the_release_is_far_off():
    s = Scheduler(Pool(cpus=16), lookahead=False)
    s.submit(1, ActionSpec(kind="hold", cpus=14, duration=30.0), 0.0)
    g = grants(s.submit(2, ela(max_units=16, p=0.95, duration=4.0), 0.0))
    assert g[2].units == 2


def test_expected_arrivals_raise_the_price():
    # the same lone action on the same idle pool gets less when its kind arrives every 10 ms
    def run(lookahead):
        s = Scheduler(Pool(cpus=32), lookahead=lookahead)
        spec = ela(max_units=32, duration=1.0)
        aid = 0
        t = 0.0
        for _ in range(40):  # a steady stream (rates learned), each released as the next arrives
            aid += 1  # (one in flight at every arrival: many callers, not one caller's loop, learn.LONE)
            s.submit(aid, spec, t)
            if aid > 1:
                s.release(aid - 1, t + 0.001)
            t += 0.01
        s.release(aid, t - 0.005)  # the pool idle again
        aid += 1
        return grants(s.submit(aid, spec, t))[aid].units

    assert run(True) < run(False) == 32


def test_objective_and_price_options_are_validated():
    for kw in ({"objective": "fast"}, {"load_target": 0}, {"max_price": -1}, {"planner": "magic"}):
        with pytest.raises(ValueError):
            Scheduler(Pool(cpus=4), **kw)
    assert Scheduler(Pool(cpus=4), objective="step").max_price < Scheduler(Pool(cpus=4)).max_price


def test_act_objective_runs_an_overload_at_the_minimum():
    # a queue the pool can absorb, but expected arrivals beyond what even minimum sizes serve:
    # "balanced" keeps the floor max_price implies (2 cores for Amdahl 0.9), "act" lets the
    # price rise to everyone at their minimum
    def run(objective):
        s = Scheduler(Pool(cpus=8), objective=objective)
        spec = ela(max_units=16, duration=1.0)
        for i in range(40):  # learn a 1000/s arrival rate (each released as the next arrives: many
            s.submit(i, spec, i * 0.001)  # callers, not one caller's loop, learn.LONE)
            if i:
                s.release(i - 1, i * 0.001)
        s.release(39, 0.0395)
        return grants(s.handle_many([Submitted(100 + i, spec) for i in range(6)], 0.04))

    bal, act = run("balanced"), run("act")
    assert len(bal) == 4 and all(x.units == 2 for x in bal.values())
    assert len(act) == 6 and all(x.units == 1 for x in act.values())
