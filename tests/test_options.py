"""SchedulerOptions: the scheduler's knobs as one typed value, accepted beside the keyword options."""

from __future__ import annotations

import inspect
import json

import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, SchedulerOptions, SpecError, Tangram
from tangram_sdk.scheduler.core import Scheduler


async def test_options_reach_the_scheduler_like_the_keywords() -> None:
    opts = SchedulerOptions(window=4, elastic=False, mu_grid=[0, 1.5])
    async with Tangram(Pool(cpus=8), options=opts) as t, Tangram(Pool(cpus=8), window=4, elastic=False) as k:
        assert t.scheduler.window == k.scheduler.window == 4
        assert t.scheduler.elastic is k.scheduler.elastic is False
        spec = ActionSpec(kind="x", cpus=1, elastic=Elasticity("cpu", 8, Amdahl(0.99)))
        async with t.acquire(spec) as a, k.acquire(spec) as b:
            assert a.units == b.units == 1  # elastic=False: everyone gets the minimum
    async with Tangram(Pool(cpus=2), options=SchedulerOptions(window=2), depth=8) as both:
        assert (both.scheduler.window, both.scheduler.depth) == (2, 8)


def test_a_bad_option_fails_where_it_is_written() -> None:
    with pytest.raises(SpecError, match="window must be int"):
        SchedulerOptions(window="16")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="elastic must be bool"):
        SchedulerOptions(elastic=1)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="mu_grid"):
        SchedulerOptions(mu_grid="0,1")  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"unknown scheduler option\(s\) \['windwo'\]"):
        SchedulerOptions.from_mapping({"windwo": 4})
    with pytest.raises(SpecError, match="rejected"):  # a range the Scheduler refuses
        Tangram(Pool(cpus=1), options=SchedulerOptions(window=0))
    with pytest.raises(SpecError, match=r"\['window'\] given both"):
        Tangram(Pool(cpus=1), options=SchedulerOptions(window=2), window=3)
    with pytest.raises(SpecError, match="must be a SchedulerOptions"):
        Tangram(Pool(cpus=1), options={"window": 2})  # type: ignore[arg-type]


def test_deploy_checks_options_before_starting_anything() -> None:
    from tangram_sdk.ray import deploy

    with pytest.raises(SpecError, match="rejected"):  # raised before Ray is even needed
        deploy("bad-options", options=SchedulerOptions(window=0))


def test_unset_fields_leave_the_scheduler_defaults_and_the_value_serialises() -> None:
    opts = SchedulerOptions(objective="step", max_price=1.0)
    assert opts.as_kwargs() == {"objective": "step", "max_price": 1.0}
    assert json.loads(json.dumps(opts.asdict()))["objective"] == "step"
    assert SchedulerOptions().as_kwargs() == {}
    assert SchedulerOptions(window=4) == SchedulerOptions.from_mapping({"window": 4})


def test_every_field_is_a_scheduler_option() -> None:
    from tangram_sdk.options import SchedulerKeywords

    params = set(inspect.signature(Scheduler._configure).parameters) - {"self", "pool"}
    fields = {a.name for a in SchedulerOptions.__attrs_attrs__}
    # the three spellings of the options name the same ones: fields, typed keywords, defaults
    assert fields == set(SchedulerKeywords.__annotations__) == params, sorted(fields ^ params)


def test_every_option_has_a_row_in_the_documented_knobs_table() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "scheduler.md").read_text()
    missing = [a.name for a in SchedulerOptions.__attrs_attrs__ if f"| `{a.name}` |" not in doc]
    assert not missing, f"docs/scheduler.md#knobs (called 'the full list' by tuning.md) lacks {missing}"


def test_the_scheduler_takes_options_beside_its_keywords() -> None:
    pool = Pool(cpus=8)
    s = Scheduler(pool, options=SchedulerOptions(window=4, objective="step"), depth=8)
    assert (s.window, s.depth, s.objective) == (4, 8, "step")
    k = Scheduler(pool, window=4, depth=8, objective="step")
    assert (k.window, k.depth, k.objective, k.max_price) == (s.window, s.depth, s.objective, s.max_price)
    assert Scheduler(pool, options=SchedulerOptions()).window == Scheduler(pool).window  # None: the default
    with pytest.raises(SpecError, match=r"\['window'\] given both"):
        Scheduler(pool, options=SchedulerOptions(window=2), window=3)
    with pytest.raises(SpecError, match="must be a SchedulerOptions"):
        Scheduler(pool, options={"window": 2})  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # a misspelt keyword is still Python's own error
        Scheduler(pool, windwo=2)  # type: ignore[call-arg]


def test_a_simulated_policy_takes_the_same_options() -> None:
    from tangram_sdk.sim.baselines import make_policy

    pol = make_policy("tangram", Pool(cpus=8), options=SchedulerOptions(window=3, max_price=1.0))
    (lane,) = pol.lanes
    assert (lane.window, lane.max_price, lane.elastic) == (3, 1.0, True)
    fifo = make_policy("fifo4", Pool(cpus=8), options=SchedulerOptions(depth=5))
    assert fifo.lanes[0].depth == 5 and fifo.lanes[0].elastic is False
    with pytest.raises(SpecError, match="given both"):
        make_policy("tangram", Pool(cpus=8), options=SchedulerOptions(window=3), window=4)


@pytest.mark.parametrize("bad", [
    {"default_duration": 0}, {"default_duration": -1.0}, {"default_duration": float("nan")},
    {"alpha": 5}, {"alpha": -0.5}, {"duration_alpha": 2}, {"price_smoothing": 2},
    {"mu_grid": ()}, {"mu_grid": (-1,)}, {"elastic": "no"}, {"window": "8"}, {"load_target": float("inf")},
    {"max_price": -1.0}, {"max_price": float("nan")}, {"restart_gain": 2.0}, {"planner": "x"},
    {"objective": "fast"}, {"gpu_slots": 0.0},
])
def test_an_option_out_of_range_or_of_the_wrong_type_is_a_spec_error_naming_it(bad: dict) -> None:  # type: ignore[type-arg]
    # these were taken silently (default_duration=nan changed a grant from 4 cores to 2) or failed
    # deep inside as a bare TypeError
    (name,) = bad
    with pytest.raises(SpecError, match=name):
        Scheduler(Pool(cpus=2), **bad)


def test_a_scheduler_built_directly_refuses_bad_options_with_a_spec_error() -> None:
    """troubleshooting.md: every deliberate error is a TangramError. Scheduler(...) built directly
    (the simulator's, a custom driver's) raised bare ValueErrors for these; Tangram wrapped them."""
    from tangram_sdk.errors import SpecError
    from tangram_sdk.pool import Pool
    from tangram_sdk.scheduler import Scheduler

    for bad in ({"window": 0}, {"scan_limit": 0}, {"depth": -1}, {"objective": "fast"}, {"planner": "x"},
                {"restart_gain": 2.0}, {"gpu_slots": 0}, {"gpu_instances": "many"}, {"restore_horizon": -1.0}):
        with pytest.raises(SpecError):
            Scheduler(Pool(cpus=2), **bad)


def test_a_price_grid_given_as_a_generator_is_read_once_and_taken() -> None:
    # the type check used the generator up and the scheduler then refused it as an empty grid
    s = Scheduler(Pool(cpus=2), mu_grid=(x for x in (0.0, 0.5, 1.0)))
    plain = Scheduler(Pool(cpus=2), mu_grid=(0.0, 0.5, 1.0))
    assert s.mu_grid == plain.mu_grid == (0.0, 0.5, 1.0)
