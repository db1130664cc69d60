"""Restartable CPU actions in the pure core and the simulator: a straggler that has run far past
its kind's expected length is run again, once, on cores that sit idle; never while anyone needing
cores waits; every core comes back (issue 12's RL-step stragglers for work that is idempotent but
not malleable, such as ``pytest -n N``)."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Scheduler, SpecError
from tangram_sdk.scheduler import Cancelled, Grant, Released, Resize, Submitted, Tick
from tangram_sdk.scheduler.action import Action, shape_of
from tangram_sdk.scheduler.learn import KindStats
from tangram_sdk.scheduler.ledger import Ledger
from tangram_sdk.scheduler.restart import Restarts, expected_length
from tangram_sdk.sim.baselines import make_policy
from tangram_sdk.sim.engine import Act, Trajectory, simulate

sys.path.insert(0, str(Path(__file__).parent))
from resize_equivalence import assert_same_decisions

RST = ActionSpec(kind="t", cpus=1, elastic=Elasticity("cpu", 8, Amdahl(0.95), restartable=True))
FIXED = ActionSpec(kind="f", cpus=7)


def test_only_cpu_elasticity_can_be_restartable_not_with_malleable_and_reprs_are_unchanged() -> None:
    with pytest.raises(SpecError, match="CPU cores only"):
        Elasticity("gpu", 4, restartable=True)
    with pytest.raises(SpecError, match="True or False"):
        Elasticity("cpu", 4, restartable=1)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="exclude each other"):
        Elasticity("cpu", 4, malleable=True, restartable=True)
    assert "restartable" not in repr(Elasticity("cpu", 4))  # decision logs of other specs unchanged
    assert "restartable=True" in repr(RST.elastic)


@pytest.mark.parametrize("var", [0.25, 1.0, 2.25])
def test_expected_length_matches_a_sampled_lognormal(var: float) -> None:
    """E[L | L > age] against 400k samples of a lognormal of mean 4: at, below and far above the
    mean, and in the far tail (the Mills-ratio branch) it stays continuous and above the age."""
    rng = np.random.default_rng(1)
    mean = 4.0
    s = math.sqrt(var)
    xs = rng.lognormal(math.log(mean) - var / 2, s, 400_000)
    for age in (1.0, 4.0, 12.0, 30.0):
        tail = xs[xs > age]
        if len(tail) < 2000:
            continue
        assert expected_length(mean, var, age) == pytest.approx(float(tail.mean()), rel=0.03)
    ages = [4.0 * 1.5 ** k for k in range(60)]
    vals = [expected_length(mean, var, a) for a in ages]
    assert all(v >= a for v, a in zip(vals, ages))
    assert all(b >= a for a, b in zip(vals, vals[1:]))  # an older action is expected to run on longer
    assert expected_length(mean, 0.0, 10.0) == 10.0  # no spread learned: past its estimate it is ending
    assert expected_length(mean, 0.0, 1.0) == mean


def _teach(s: Scheduler, spec: ActionSpec, n: int, seed: int, t0: float = 0.0) -> float:
    """``n`` completions of ``spec``'s kind, one at a time on an empty pool, with lognormal lengths
    (sigma 1): the kind learns its mean and its spread. Returns the time after the last."""
    rng = random.Random(seed)
    t = t0
    for i in range(n):
        aid = 10_000 + seed * 1000 + i
        g = s.handle(Submitted(aid, spec), t)[0]
        assert isinstance(g, Grant)
        t += rng.lognormvariate(-0.5, 1.0) * spec.relative_duration(g.units)
        s.handle(Released(aid), t)
    return t


def _straggler_setup() -> tuple[Scheduler, float]:
    """8 cores; the kind learned (mean ~1 s at one core, sigma 1); 7 cores held by a fixed action,
    so the restartable test #2 starts on the one left."""
    s = Scheduler(Pool(cpus=8))
    t = _teach(s, RST, 64, seed=1)
    assert s.handle(Submitted(1, FIXED), t)[0].cpus == tuple(range(7))
    g = s.handle(Submitted(2, RST), t)[0]
    assert isinstance(g, Grant) and g.units == 1
    return s, t


def _resizes(ds: list[object]) -> list[Resize]:
    return [d for d in ds if isinstance(d, Resize)]


def test_a_straggler_is_restarted_once_on_the_idle_cores_and_every_core_comes_back() -> None:
    s, t = _straggler_setup()
    # the fixed action leaves after the test has run 20x its kind's mean: 7 idle cores, nobody waits
    ds = s.handle(Released(1), t + 20.0)
    (r,) = _resizes(ds)
    assert r.action_id == 2 and r.units == 8 and r.cpus == tuple(range(8))
    s.check_invariants()
    st = s.statistics()
    assert st.restarts == 1 and st.cpus_free == 0
    # restarted already: never again, whatever happens next
    assert _resizes(s.handle(Tick(), t + 60.0)) == []
    s.handle(Released(2), t + 70.0)
    s.check_invariants()
    assert s.statistics().cpus_free == 8 and s.running == 0


def test_no_restart_while_someone_waits_for_cores_or_before_it_outruns_its_kind() -> None:
    s, t = _straggler_setup()
    # young: released 0.2 s in (its kind's mean is ~1 s): no restart, a look later instead
    s.handle(Submitted(3, FIXED), t + 0.1)  # waits for 7 cores
    ds = s.handle(Released(1), t + 0.2)
    assert _resizes(ds) == [] and any(isinstance(d, Grant) and d.action_id == 3 for d in ds)
    # #3 holds the 7 cores; #4 waits behind it: however old #2 gets, nothing is idle to restart on
    s.handle(Submitted(4, FIXED), t + 0.3)
    assert _resizes(s.handle(Tick(), t + 30.0)) == []
    # #3 leaves, #4 takes its cores at once: still nothing idle
    assert _resizes(s.handle(Released(3), t + 31.0)) == []
    assert s.statistics().restarts == 0
    # #4 leaves with nobody waiting: now it is restarted
    assert [r.action_id for r in _resizes(s.handle(Released(4), t + 32.0))] == [2]


def test_a_restarted_action_cancelled_returns_every_core() -> None:
    s, t = _straggler_setup()
    assert _resizes(s.handle(Released(1), t + 20.0))
    s.handle(Cancelled(2), t + 21.0)
    s.check_invariants()
    assert s.statistics().cpus_free == 8 and s.running == 0


@pytest.mark.parametrize("gain, mu, restarted", [(1.0, 0.0, True), (0.5, 0.0, True), (1.0, 0.05, True),
                                                (0.5, 0.05, False), (1.0, 0.1, False)])
def test_a_priced_restart_must_be_expected_to_end_sooner_by_the_gain_margin(gain: float, mu: float,
                                                                            restarted: bool) -> None:
    """A test on 1 of 8 cores at 20x its kind's mean length (sigma 1): kept, it is expected to need
    6.6 s more; rerun on 8 cores, 4.5 s. At price 0 the cores would idle: restarted whatever the
    gain. At price 0.05 the priced rerun costs 0.91 of keeping it: gain 1.0 restarts, the default
    0.5 asks for more margin; at 0.1 it costs more than keeping it: never."""
    pool = Pool(cpus=8)
    ledger = Ledger(pool)
    st = KindStats(1.0)
    st.log_var = 1.0
    a = Action(2, RST, 0, 0.0, st, shape_of(RST, pool, ledger, ()))
    g = Grant(2, (0,), units=1)
    ledger.take(g)
    a.grant, a.started, a.est_end = g, 0.0, 1.0
    rst = Restarts(ledger, gain)
    rst.admitted(a)
    out: list[object] = []
    rst.restart_idle(out, 20.0, lambda _a: (8, mu), lambda _spec: 8)
    assert (out == [Resize(2, tuple(range(8)), 8)]) is restarted
    assert rst.count == int(restarted) and len(ledger.node_free[0]) == (0 if restarted else 7)


def test_restart_gain_zero_never_restarts_and_bad_values_are_refused() -> None:
    s = Scheduler(Pool(cpus=8), restart_gain=0.0)
    t = _teach(s, RST, 64, seed=1)
    s.handle(Submitted(1, FIXED), t)
    s.handle(Submitted(2, RST), t)
    assert _resizes(s.handle(Released(1), t + 20.0)) == []
    with pytest.raises(ValueError, match="restart_gain"):
        Scheduler(Pool(cpus=8), restart_gain=1.5)


def test_non_restartable_actions_are_never_restarted() -> None:
    plain = ActionSpec(kind="t", cpus=1, elastic=Elasticity("cpu", 8, Amdahl(0.95)))
    s = Scheduler(Pool(cpus=8))
    t = _teach(s, plain, 64, seed=1)
    s.handle(Submitted(1, FIXED), t)
    s.handle(Submitted(2, plain), t)
    assert _resizes(s.handle(Released(1), t + 20.0)) == []


def _straggler_run(restartable: bool) -> tuple[float, int, int]:
    """32 tests at once on 16 cores (a backlog: each starts on one), then rounds of the same; 31
    trajectories of twelve ~1 s tests (lognormal, so the kind learns a spread) and one test of
    100 s of single-core work, last in line. Returns (last end, the straggler's units at the end,
    restarts)."""
    spec = ActionSpec(kind="t", cpus=1, elastic=Elasticity("cpu", 16, Amdahl(0.95), restartable=restartable))
    rng = random.Random(3)
    trajs = [Trajectory(tuple(Act(spec, rng.lognormvariate(-0.5, 1.0), 0.2) for _ in range(12)))
             for _ in range(31)]
    trajs.append(Trajectory((Act(spec, 100.0, 0.2),)))  # arrives with the others, last in line
    res = simulate(trajs, make_policy("tangram", Pool(cpus=16)))
    straggler = max(range(len(res.kind)), key=lambda i: res.exec_s[i])
    return max(res.end), res.units[straggler], res.scheduler_stats[0]["restarts"]


def test_simulated_straggler_is_restarted_on_the_cores_the_others_left() -> None:
    """Without restarts the 100 s test keeps its one core to the end (~100 s); restartable, it is
    run again on the cores the others leave once it has run long enough (4x its kind's length,
    and a restart expected to end sooner), and ends well before."""
    fixed_end, fixed_units, n0 = _straggler_run(False)
    end, units, n = _straggler_run(True)
    assert fixed_end > 95.0 and fixed_units == 1 and n0 == 0
    assert n >= 1 and units >= 4
    assert end < 0.6 * fixed_end, (end, fixed_end)


@pytest.mark.looptime
async def test_runtime_and_simulator_make_identical_decisions_with_restarts() -> None:
    """The same-core equivalence (tests/test_sim_engine.py) with restartable actions: the live
    runtime applies each restart to the held lease, the action starts its work over from
    ``lease.on_resize`` exactly as the simulator does, and both logs match entry by entry."""
    spec = ActionSpec(kind="t", cpus=1, elastic=Elasticity("cpu", 16, Amdahl(0.95), restartable=True))
    rng = random.Random(11)  # times on a 1 us grid from a wide range: no two events coincide

    def t(lo: float, hi: float) -> float:
        return round(rng.uniform(lo, hi), 6)

    def work() -> float:
        return round(rng.lognormvariate(-0.5, 1.0), 6)

    trajs = [Trajectory(tuple(Act(spec, work(), t(0.01, 0.4)) for _ in range(8)), 0.0, t(0.1, 1.0))
             for _ in range(24)] + [Trajectory((Act(spec, 40.0, 0.123457),))]
    assert await assert_same_decisions(trajs, Pool(cpus=16)), "the trace should make the straggler restart"
