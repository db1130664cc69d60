"""Malleable CPU actions in the pure core and the simulator: a test that outruns its estimate grows
into cores nobody asked for, gives them back before anyone who needs cores is admitted, and the
units it held always come back (issue 12's RL-step stragglers)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Scheduler, SpecError
from tangram_sdk.scheduler import Cancelled, Grant, Released, Resize, Submitted, Tick
from tangram_sdk.sim.baselines import make_policy
from tangram_sdk.sim.engine import Act, Trajectory, simulate

sys.path.insert(0, str(Path(__file__).parent))
from resize_equivalence import assert_same_decisions

MALL = ActionSpec(kind="m", cpus=1, elastic=Elasticity("cpu", 8, Amdahl(0.9), malleable=True))
FIXED = ActionSpec(kind="f", cpus=4)


def test_only_cpu_elasticity_can_be_malleable_and_reprs_are_unchanged() -> None:
    with pytest.raises(SpecError, match="CPU cores only"):
        Elasticity("gpu", 4, malleable=True)
    with pytest.raises(SpecError, match="True or False"):
        Elasticity("cpu", 4, malleable=1)  # type: ignore[arg-type]
    assert "malleable" not in repr(Elasticity("cpu", 4))  # decision logs of other specs unchanged
    assert "malleable=True" in repr(MALL.elastic)


def _resizes(ds: list[object]) -> list[Resize]:
    return [d for d in ds if isinstance(d, Resize)]


def test_grows_into_idle_cores_past_its_estimate_and_shrinks_before_admission() -> None:
    s = Scheduler(Pool(cpus=8), options=None)
    assert s.handle(Submitted(1, FIXED), 0.0)[0].cpus == (0, 1, 2, 3)
    g = s.handle(Submitted(2, MALL), 0.0)[0]
    assert isinstance(g, Grant) and g.units == 4
    assert _resizes(s.handle(Tick(), 0.5)) == []  # nothing idle
    # the fixed action leaves: 4 idle cores; the malleable one has outrun its estimate (prior 1 s)
    grow = _resizes(s.handle(Released(1), 6.0))
    assert grow == [Resize(2, tuple(range(8)), 8)]
    s.check_invariants()
    st = s.statistics()
    assert st.cpus_free == 0 and st.resizes == 1 and st.grown == 1
    # someone needing cores arrives: the borrowed cores go back first, then it is admitted on them
    ds = s.handle(Submitted(3, FIXED), 7.0)
    assert ds[0] == Resize(2, (4, 5, 6, 7), 4)
    assert isinstance(ds[1], Grant) and ds[1].cpus == (0, 1, 2, 3)
    s.check_invariants()
    s.handle(Released(2), 9.0)
    s.handle(Released(3), 9.5)
    s.check_invariants()
    assert s.statistics().cpus_free == 8


def test_a_minimum_wider_than_a_node_grows_on_the_nodes_it_holds() -> None:
    """A 5-core minimum on 4-core NUMA nodes is granted across both nodes; when a core frees on
    one of them it may grow there (the property test once asserted every resize stays on one
    node, which such a grant cannot), and everything comes back at release."""
    s = Scheduler(Pool(cpus="0-7", numa=[[0, 1, 2, 3], [4, 5, 6, 7]]))
    assert s.handle(Submitted(1, ActionSpec(kind="a", cpus=1)), 0.0)[0].cpus == (0,)
    wide = ActionSpec(kind="a", cpus=5, elastic=Elasticity("cpu", 8, Amdahl(1.0), malleable=True))
    g = s.handle(Submitted(2, wide), 0.0)[0]
    assert isinstance(g, Grant) and g.cpus == (1, 2, 3, 4, 5, 6, 7)
    grow = _resizes(s.handle(Released(1), 5.0))
    assert grow == [Resize(2, tuple(range(8)), 8)]
    s.check_invariants()
    s.handle(Released(2), 6.0)
    s.check_invariants()
    assert s.statistics().cpus_free == 8


def test_a_young_action_is_not_grown_and_a_grown_one_gives_everything_back_when_cancelled() -> None:
    s = Scheduler(Pool(cpus=8))
    s.handle(Submitted(1, FIXED), 0.0)
    s.handle(Submitted(2, MALL), 0.0)
    # released before the malleable action outran its estimate: no growth yet, a wakeup instead
    assert _resizes(s.handle(Released(1), 0.2)) == []
    assert s.next_wakeup is not None and s.next_wakeup > 0.2
    assert _resizes(s.handle(Tick(), s.next_wakeup)) != []  # at its estimate, the idle cores are lent
    s.handle(Cancelled(2), 5.0)
    s.check_invariants()
    assert s.statistics().cpus_free == 8 and s.running == 0


def test_non_malleable_actions_are_never_resized() -> None:
    plain = ActionSpec(kind="p", cpus=1, elastic=Elasticity("cpu", 8, Amdahl(0.9)))
    s = Scheduler(Pool(cpus=8))
    s.handle(Submitted(1, FIXED), 0.0)
    s.handle(Submitted(2, plain), 0.0)
    assert _resizes(s.handle(Released(1), 30.0)) == []


def _straggler_run(malleable: bool) -> tuple[float, list[int]]:
    spec = ActionSpec(kind="t", cpus=1, elastic=Elasticity("cpu", 8, Amdahl(0.9), malleable=malleable))
    trajs = [Trajectory((Act(spec, 1.0),)) for _ in range(15)] + [Trajectory((Act(spec, 100.0),))]
    res = simulate(trajs, make_policy("tangram", Pool(cpus=8)))
    return max(res.end), res.units


def test_simulated_straggler_finishes_on_cores_the_others_left() -> None:
    """Sixteen tests at once on 8 cores, a backlog: each starts on one or two. Fifteen take 1 s;
    the last, 100 s of single-core work, keeps its two cores for 55 s (100 * T(2) / T(1)) unless
    it may grow: then it takes the idle cores once it outruns its estimate and ends near
    2 + 98 / S(8) = 23 s. (On one core, 101 s, before the narrow-pool window of stop 54.)"""
    fixed_end, fixed_units = _straggler_run(False)
    mall_end, units = _straggler_run(True)
    assert fixed_units[-1] <= 2 and fixed_end > 55.0, (fixed_end, fixed_units)
    assert mall_end < 0.45 * fixed_end, (mall_end, units)
    assert units[-1] == 8


@pytest.mark.looptime
async def test_runtime_and_simulator_make_identical_decisions_with_resizes() -> None:
    """The same-core equivalence (tests/test_sim_engine.py) with malleable actions: the live
    runtime applies each Resize to the held lease, the action re-times its remaining work from
    ``lease.on_resize`` exactly as the simulator does, and both logs match entry by entry."""
    spec = ActionSpec(kind="t", cpus=1, elastic=Elasticity("cpu", 8, Amdahl(0.9), malleable=True))
    rng = random.Random(5)  # times on a 1 us grid from a wide range: no two events coincide

    def t(lo: float, hi: float) -> float:
        return round(rng.uniform(lo, hi), 6)

    trajs = [Trajectory(tuple(Act(spec, t(0.2, 2.0), t(0.01, 1.5)) for _ in range(3)), 0.0, t(0.1, 1.0))
             for _ in range(12)] + [Trajectory((Act(spec, 40.0, 0.123457),))]
    assert await assert_same_decisions(trajs, Pool(cpus=8)), "the trace should make the straggler grow"


def test_a_worker_start_up_is_paid_once_per_worker_on_the_cores_held() -> None:
    """The simulator's cost of malleability by ``lease.workers``: a command that starts more
    workers than it holds cores pays each worker's start-up on the cores it holds."""
    act = Act(MALL, 8.0, startup=0.5)
    assert act.exec_s(4) == pytest.approx(8.0 * MALL.relative_duration(4) + 0.5)  # one worker a core
    assert act.exec_s(1, 8) == pytest.approx(8.0 + 0.5 * 8)  # eight workers sharing one core
    assert act.exec_s(8, 8) == pytest.approx(8.0 * MALL.relative_duration(8) + 0.5)
    assert Act(MALL, 8.0).exec_s(1, 8) == 8.0  # no start-up: oversubscribing is free


def test_with_a_worker_start_up_malleable_tests_pay_it_and_fixed_policies_do_not_change() -> None:
    """Only Tangram starts ``lease.workers`` (twice its cores) for a malleable test; the fixed policies
    run the same tests at one worker a core whether or not the spec says malleable."""
    from tangram_sdk.sim.metrics import summarise
    from tangram_sdk.sim.workloads import ai_coding, run_policy

    def mean_act(policy: str, **over: object) -> float:
        wl = ai_coding(batch=48, nodes=1, cores=32, seed=3, test_max_cpus=16, **over)
        return float(summarise(run_policy(wl, policy))["act_mean_s"])

    fifo = {m: mean_act("fifo4", test_worker_startup=0.3, test_malleable=m) for m in (False, True)}
    assert fifo[False] == fifo[True]
    assert mean_act("fifo4", test_worker_startup=0.3) > mean_act("fifo4")  # the start-up costs
    cheap = mean_act("tangram", test_malleable=True)
    costly = mean_act("tangram", test_malleable=True, test_worker_startup=0.3)
    # twice the workers of its cores, each starting on the cores it holds: more than one a core pays
    assert costly > cheap + 0.3 and costly > mean_act("tangram", test_worker_startup=0.3)
    with pytest.raises(ValueError, match="test_worker_startup"):
        ai_coding(batch=4, test_worker_startup=-1.0)
