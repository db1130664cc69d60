"""Per-action length hints (``acquire(expected_s=)``, ``Submitted.expected``): an elastic CPU action
its caller says is among its kind's longest (one in a thousand of the hints seen) is sized for its
own completion, so it does not start on a core or two in a flood and end the RL step alone
(docs/scheduler.md#length-hints). Everything else is decided as without a hint."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Scheduler, SpecError
from tangram_sdk.runtime import Tangram
from tangram_sdk.scheduler import Grant, Released, Submitted
from tangram_sdk.sim.engine import Act, Trajectory
from tangram_sdk.sim.workloads import ai_coding, run_policy

sys.path.insert(0, str(Path(__file__).parent))
from resize_equivalence import assert_same_decisions

TEST = ActionSpec(kind="t", cpus=1, elastic=Elasticity("cpu", 16, Amdahl(0.9)))
FIXED = ActionSpec(kind="f", cpus=12)


def _taught(hinted: bool) -> tuple[Scheduler, float]:
    """16 cores; 64 tests of the kind, one at a time on an empty pool (hints lognormal around 1 s,
    sigma 1, when ``hinted``); then a 12-core action holding the pool, 4 cores free."""
    s = Scheduler(Pool(cpus=16))
    rng = random.Random(3)
    t = 0.0
    for i in range(64):
        work = rng.lognormvariate(-0.5, 1.0)
        g = s.handle(Submitted(1000 + i, TEST, expected=work if hinted else None), t)[0]
        assert isinstance(g, Grant)
        t += work * TEST.relative_duration(g.units)
        s.handle(Released(1000 + i), t)
    assert len(s.handle(Submitted(1, FIXED), t)[0].cpus) == 12
    return s, t


@pytest.mark.parametrize("hint", [None, 1.0, 3.0])
def test_an_ordinary_hint_changes_nothing(hint: float | None) -> None:
    """A test hinted at its kind's usual length (or not hinted) takes the 4 free cores at once,
    exactly as before hints existed."""
    s, t = _taught(hinted=hint is not None)
    (g,) = s.handle(Submitted(2, TEST, expected=hint), t)
    assert isinstance(g, Grant) and g.units == 4
    s.check_invariants()


def test_a_hint_in_the_kinds_far_tail_waits_for_its_width_and_gets_it() -> None:
    """Hinted 100 s where its kind's hints average ~1 s: on 4 cores it would run 32 s, waiting for
    the 12 cores back (expected within ~1 s) ends it sooner. So it waits, blocks nothing it
    should not (the core's usual FCFS), and then runs on all 16; every core comes back."""
    s, t = _taught(hinted=True)
    waits_for_the_hold_then_takes_all(s, t, Submitted(2, TEST, expected=100.0))


def waits_for_the_hold_then_takes_all(s: Scheduler, t: float, sub: Submitted) -> None:
    """``sub`` (id 2) arrives while action 1 holds 12 of 16 cores: it waits (only it is queued),
    takes all 16 when action 1 releases a second later, and gives every core back."""
    assert s.handle(sub, t) == []
    assert s.queued == 1
    ds = s.handle(Released(1), t + 1.0)
    (g,) = [d for d in ds if isinstance(d, Grant)]
    assert g.action_id == 2 and g.units == 16
    s.handle(Released(2), t + 20.0)
    s.check_invariants()
    assert s.statistics().cpus_free == 16


def test_no_risk_before_32_hints_of_the_kind_were_seen() -> None:
    """A tail needs a spread to be a tail: the first hints of a kind never mark one."""
    s = Scheduler(Pool(cpus=16))
    assert len(s.handle(Submitted(1, FIXED), 0.0)[0].cpus) == 12
    (g,) = s.handle(Submitted(2, TEST, expected=1000.0), 0.0)
    assert isinstance(g, Grant) and g.units == 4


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "5", True])
async def test_bad_hints_fail_at_once_and_hold_nothing(bad: object) -> None:
    pool = Pool(cpus=2)
    async with Tangram(pool) as tangram:
        with pytest.raises(SpecError, match="expected_s"):
            async with tangram.acquire(TEST, expected_s=bad):  # type: ignore[arg-type]
                pass
        with pytest.raises(SpecError, match="expected_s"):
            await tangram.acquire_lease(TEST, expected_s=bad)  # type: ignore[arg-type]
        assert tangram.statistics().cpus_free == 2 and tangram.statistics().core.submitted == 0
    with pytest.raises(ValueError, match="expected"):
        Scheduler(pool).handle(Submitted(1, TEST, expected=-1.0), 0.0)


async def test_the_hint_reaches_the_core_and_the_decision_log() -> None:
    seen: list[object] = []
    async with Tangram(Pool(cpus=2), observers=[lambda evs, _now, _ds: seen.extend(evs)]) as tangram:
        async with tangram.acquire(TEST, expected_s=7.5) as lease:
            assert lease.units == 2
    (sub,) = [e for e in seen if isinstance(e, Submitted)]
    assert sub.expected == 7.5
    assert repr(Submitted(1, TEST)).endswith("deadline=None)")  # the unhinted repr logs hashed


@pytest.mark.looptime
async def test_runtime_and_simulator_make_identical_decisions_with_hints() -> None:
    """The same-core equivalence with hinted tests, one of them in the far tail arriving while
    the pool is taken: the live runtime (acquire(expected_s=)) and the simulator log the same
    decisions entry by entry."""
    rng = random.Random(11)
    teach = tuple(Act(TEST, w, 0.05, hint=w) for w in (rng.lognormvariate(-0.5, 1.0) for _ in range(48)))
    hold = ActionSpec(kind="hold", cpus=14)
    trajs = [Trajectory(teach, 0.0, 0.0),
             Trajectory((Act(hold, 2.0, 120.0),), 0.0, 0.0),
             Trajectory((Act(TEST, 60.0, 120.5, hint=60.0), Act(TEST, 1.0, 0.1, hint=1.0)), 0.0, 0.0),
             Trajectory((Act(TEST, 0.8, 120.6, hint=0.8),), 0.0, 0.0)]
    await assert_same_decisions(trajs, Pool(cpus=16))


def test_simulated_hints_leave_the_workload_and_the_fixed_policies_unchanged() -> None:
    """Hints come from their own random stream and only the tangram policy is told them: the
    same trajectories, and fifo4 runs the same, with or without them."""
    a = ai_coding(24, nodes=1, cores=64, seed=4)
    b = ai_coding(24, nodes=1, cores=64, seed=4, test_hint_sigma=0.5)
    assert [(x.work, x.think) for t in a.trajectories for x in t.acts] == \
        [(x.work, x.think) for t in b.trajectories for x in t.acts]
    hints = [x.hint for t in b.trajectories for x in t.acts if x.spec.kind == "test"]
    assert hints and all(h is not None and h > 0 for h in hints)
    ra, rb = run_policy(a, "fifo4"), run_policy(b, "fifo4")
    assert ra.end == rb.end and ra.units == rb.units
