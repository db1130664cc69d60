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
    params = inspect.signature(Scheduler.__init__).parameters
    fields = {a.name for a in SchedulerOptions.__attrs_attrs__}
    assert fields <= set(params) - {"self", "pool"}, sorted(fields - set(params))
