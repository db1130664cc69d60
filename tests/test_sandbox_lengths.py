"""Length hints learned per sandbox (``ActionSpec.container``; ``scheduler/lengths.py``): a sandbox
whose earlier runs were its kind's far tail has its next run sized as a step risk without any
``expected_s``; sandboxes that do not differ change nothing; and the sandbox name never splits the
market (specs that differ only in ``container`` are priced and queued as one)."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import attrs
import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Scheduler
from tangram_sdk.errors import SpecError
from tangram_sdk.scheduler import Grant, Released, Submitted
from tangram_sdk.scheduler.lengths import MIN_KEYS, SandboxLengths
from tangram_sdk.sim.baselines import make_policy
from tangram_sdk.sim.engine import Act, Trajectory, simulate
from tangram_sdk.sim.workloads import ai_coding, run_policy

sys.path.insert(0, str(Path(__file__).parent))
from resize_equivalence import assert_same_decisions
from test_hints import waits_for_the_hold_then_takes_all

TEST = ActionSpec(kind="t", cpus=1, elastic=Elasticity("cpu", 16, Amdahl(0.9)))
FIXED = ActionSpec(kind="f", cpus=12)


def boxed(name: str, field: str = "container") -> ActionSpec:
    """TEST in sandbox ``name`` (``container``), or one of group ``name`` (``group``: a
    trajectory's name that routes nothing; what the veRL/OpenRLHF adapters set)."""
    return attrs.evolve(TEST, **{field: name})


def test_shrinks_each_sandbox_towards_its_kind_by_how_much_sandboxes_differ() -> None:
    rng = random.Random(1)
    differ = SandboxLengths()
    for i in range(40):
        f = math.exp(rng.gauss(0.0, 1.0))  # sandboxes really differ (between sigma 1)
        for _ in range(4):
            differ.observe(f"b{i}", f * math.exp(rng.gauss(0.0, 0.3)))
    differ.observe("long", 50.0)
    differ.observe("long", 60.0)
    p_long, p_one = differ.predict("long"), differ.predict("b0")
    assert p_long is not None and p_one is not None
    assert 20.0 < p_long < 60.0  # its own mean, pulled only a little towards the kind's (~1.6)
    assert differ.predict("never-ran") is None

    alike = SandboxLengths()  # every sandbox the same: nothing to learn per sandbox
    for i in range(40):
        for w in (1.0, 2.0, 4.0):
            alike.observe(f"b{i}", w)
    assert alike.predict("b3") is None

    few = SandboxLengths()  # too few sandboxes with two runs to tell within from between
    for i in range(MIN_KEYS - 1):
        few.observe(f"b{i}", 1.0 + i)
        few.observe(f"b{i}", 1.5 + i)
    assert few.predict("b0") is None


def _taught(field: str = "container") -> tuple[Scheduler, float]:
    """16 cores; 48 sandboxes (lengths lognormal per sandbox, sigma 0.7, and within, sigma 0.5)
    run 3 tests each, one at a time on an empty pool, and sandbox "long" runs 3 of ~100 s; then a
    12-core action holds the pool, 4 cores free. No caller gave a hint."""
    s = Scheduler(Pool(cpus=16))
    rng = random.Random(5)
    t = 0.0
    aid = 1000
    boxes = [(f"b{i}", math.exp(rng.gauss(-0.5, 0.7))) for i in range(48)] + [("long", 100.0)]
    for _round in range(3):
        for name, f in boxes:
            work = f * math.exp(rng.gauss(0.0, 0.5 if name != "long" else 0.1))
            aid += 1
            g = s.handle(Submitted(aid, boxed(name, field)), t)[0]
            assert isinstance(g, Grant)
            t += work * TEST.relative_duration(g.units)
            s.handle(Released(aid), t)
    assert len(s.handle(Submitted(1, FIXED), t)[0].cpus) == 12
    return s, t


@pytest.mark.parametrize("field", ["container", "group"])
def test_a_sandbox_whose_runs_were_the_far_tail_waits_for_its_width(field: str) -> None:
    """Its earlier runs were ~100 s where its kind's are ~1 s: on 4 cores its next run would take
    ~32 s; waiting for the 12 cores back ends it sooner, so it waits and gets all 16, with no
    expected_s from anyone. A ``group`` name teaches the same as a ``container``."""
    s, t = _taught(field)
    waits_for_the_hold_then_takes_all(s, t, Submitted(2, boxed("long", field)))


def test_a_group_wins_over_the_container_for_what_is_learned() -> None:
    """Lengths are learned by ``group`` where a spec names one (the container is where it runs,
    the group what it is one of); a group must be a name, and a spec without one prints as before
    groups existed (decision-log hashes)."""
    s, t = _taught("group")
    spec = attrs.evolve(boxed("b0", "container"), group="long")  # runs in b0, belongs to "long"
    waits_for_the_hold_then_takes_all(s, t, Submitted(2, spec))
    plain = ActionSpec(kind="t", cpus=1, elastic=TEST.elastic)
    with pytest.raises(SpecError, match="group"):
        attrs.evolve(plain, group="not a name")
    assert "group" not in repr(plain) and "group='x'" in repr(attrs.evolve(plain, group="x"))


@pytest.mark.parametrize("name", ["b0", "b7", "unseen", None])
def test_an_ordinary_or_unknown_sandbox_takes_what_is_free(name: str | None) -> None:
    s, t = _taught()
    (g,) = s.handle(Submitted(2, TEST if name is None else boxed(name)), t)
    assert isinstance(g, Grant) and g.units == 4


def test_sandbox_names_change_nothing_where_sandboxes_do_not_differ() -> None:
    """Independent test lengths (the default workload): naming each trajectory's sandbox gives
    the same grants, in the same order, as not naming them (one market, no risk from noise)."""
    kw = dict(batch=64, nodes=1, cores=96, seed=3)
    plain = run_policy(ai_coding(**kw), "tangram")
    named = run_policy(ai_coding(**kw, sandbox_names=True), "tangram")
    assert named.grant == plain.grant and named.units == plain.units and named.end == plain.end


def test_group_names_decide_as_container_names_do() -> None:
    """Trajectory-correlated lengths, simulated: naming each trajectory by ``group`` (what the
    framework adapters set) gives the same grants as naming its sandbox by ``container``, and
    both differ from naming nothing (the learning is really used)."""
    kw = dict(batch=96, nodes=1, cores=96, seed=4, test_traj_sigma=0.8)
    boxes = run_policy(ai_coding(**kw, sandbox_names=True), "tangram")
    groups = run_policy(ai_coding(**kw, sandbox_names="group"), "tangram")
    plain = run_policy(ai_coding(**kw), "tangram")
    assert groups.grant == boxes.grant and groups.units == boxes.units and groups.end == boxes.end
    assert plain.units != boxes.units
    with pytest.raises(ValueError, match="sandbox_names"):
        ai_coding(4, sandbox_names="yes")


def test_simulated_sandbox_lengths_keep_the_workload() -> None:
    """``test_traj_sigma`` keeps every draw but the tests' split into a per-trajectory factor and
    the rest (own random stream): thinks and shells are unchanged, tests change, and their
    spread stays test_sigma."""
    a = ai_coding(200, seed=2)
    b = ai_coding(200, seed=2, test_traj_sigma=0.6)
    assert [x.think for t in a.trajectories for x in t.acts] == [x.think for t in b.trajectories for x in t.acts]
    logs = [math.log(x.work) for t in b.trajectories for x in t.acts if x.spec.kind == "test"]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))
    assert 0.9 < sd < 1.1
    with pytest.raises(ValueError, match="test_traj_sigma"):
        ai_coding(4, test_traj_sigma=1.5)


@pytest.mark.looptime
async def test_runtime_and_simulator_make_identical_decisions_with_sandbox_names() -> None:
    """The same-core equivalence with named sandboxes, one of them long every time and arriving
    while the pool is taken: the live runtime and the simulator log the same decisions."""
    rng = random.Random(7)
    trajs = []
    for i in range(24):
        f = math.exp(rng.gauss(-0.5, 0.7))
        spec = boxed(f"b{i}")
        trajs.append(Trajectory(tuple(Act(spec, f * math.exp(rng.gauss(0.0, 0.4)), 0.05 + 0.1 * i)
                                      for _ in range(4)), 0.0, 0.0))
    long = boxed("long")
    trajs.append(Trajectory(tuple(Act(long, 60.0 + k, 0.05) for k in range(2)), 0.0, 0.0))
    trajs.append(Trajectory((Act(ActionSpec(kind="hold", cpus=14), 2.0, 200.0),), 0.0, 0.0))
    trajs.append(Trajectory((Act(long, 60.0, 200.5),), 0.0, 0.0))
    await assert_same_decisions(trajs, Pool(cpus=16))
    # the case is the one meant: the last "long" run waited for the hold's cores (a learned step
    # risk) and then took all 16
    r = simulate(trajs, make_policy("tangram", Pool(cpus=16)), time_resolution=1e-6)
    assert r.units[-1] == 16 and r.grant[-1] > r.submit[-1] + 1.0


def test_kind_statistics_follow_a_drift_instead_of_averaging_all_history() -> None:
    """An RL job's tests get longer as its policy learns. After two horizons of lengths ~1 s
    and one of lengths ~e s, the kind-wide mean has moved most of the way (a cumulative mean
    would sit at a third of it), and its spread is still the spread of the lengths, not of the
    two eras mixed; below the horizon the statistics are exact (what the guarded decision logs
    were recorded with)."""
    from tangram_sdk.scheduler.lengths import HORIZON, add_sample

    rng = random.Random(3)
    exact, capped = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    for _ in range(1000):
        x = rng.gauss(0.0, 0.5)
        add_sample(exact, x)
        add_sample(capped, x, HORIZON)
    assert capped == exact
    n = int(HORIZON)
    for mu in [0.0] * (2 * n) + [1.0] * n:
        add_sample(capped, mu + rng.gauss(0.0, 0.5), HORIZON)
    count, mean, m2 = capped
    assert count == HORIZON and 0.55 < mean < 0.75  # exp-weighted over one horizon: 1 - 1/e = 0.63
    assert 0.25 < m2 / (count - 1.0) < 0.55  # 0.25 of noise plus the fading mix of the two eras
