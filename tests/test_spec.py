import math

import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Quota, SpecError, Table
from tangram_sdk._cpuset import format_cpuset, parse_cpuset


def test_amdahl_speedup_and_efficiency():
    a = Amdahl(0.9)
    assert a.speedup(1) == pytest.approx(1.0)
    assert a.speedup(8) == pytest.approx(1 / (0.1 + 0.9 / 8))
    assert 0 < a.efficiency(8) <= 1
    assert Amdahl(1.0).speedup(16) == pytest.approx(16)


def test_table_interpolates_speedup_and_is_flat_beyond_last_point():
    t = Table.from_mapping({1: 1.0, 2: 0.95, 4: 0.8})
    assert t.speedup(2) == pytest.approx(1.9)
    assert t.speedup(3) == pytest.approx((1.9 + 3.2) / 2)
    assert t.speedup(8) == pytest.approx(3.2)


def test_elasticity_accepts_table_and_callable():
    e = Elasticity("cpu", max_units=4, efficiency={1: 1.0, 4: 0.5})
    assert isinstance(e.efficiency, Table)
    c = Elasticity("gpu", max_units=4, efficiency=lambda m: 1.0 / math.sqrt(m))
    assert c.efficiency.speedup(4) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kind="x", cpus=-1),
        dict(kind="x", gpus=1.5),
        dict(kind="x", memory=-5),
        dict(kind="x", duration=float("nan")),
        dict(kind="x", duration=0),
        dict(kind="x", duration=float("inf")),
        dict(kind="", cpus=1),
        dict(kind="x", quotas={"search": 0}),
        dict(kind="x", quotas={"": 1}),
        dict(kind="x", cpus=1, elastic=Elasticity("cpu", max_units=2), container="../etc"),
        dict(kind="x", cpus=4, elastic=Elasticity("cpu", max_units=2)),  # range below the minimum
        dict(kind="x", elastic=Elasticity("cpu", max_units=2)),  # elastic with no minimum
        dict(kind="x", service="rm"),  # a service needs a GPU
        dict(kind="x", priority=1.5),
    ],
)
def test_invalid_specs_fail_at_construction(kwargs):
    with pytest.raises(SpecError):
        ActionSpec(**kwargs)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Elasticity("tpu", max_units=2),
        lambda: Elasticity("cpu", max_units=0),
        lambda: Elasticity("cpu", max_units=4, efficiency={1: 1.0, 2: 1.5}),
        lambda: Elasticity("cpu", max_units=4, efficiency=lambda m: 0.0),
        lambda: Elasticity("cpu", max_units=4, efficiency=lambda m: 1 / 0),
        lambda: Amdahl(1.2),
        lambda: Amdahl(float("nan")),
    ],
)
def test_invalid_elasticity(make):
    with pytest.raises(SpecError):
        make()


def test_spec_errors_are_value_errors_and_specs_are_hashable():
    with pytest.raises(ValueError):
        ActionSpec(kind="x", cpus=-1)
    s = ActionSpec(kind="x", cpus=1, quotas={"b": 1, "a": 2})
    assert s.quotas == (("a", 2), ("b", 1))
    assert hash(s) == hash(ActionSpec(kind="x", cpus=1, quotas={"a": 2, "b": 1}))


def test_relative_duration_follows_efficiency():
    s = ActionSpec(kind="x", cpus=2, elastic=Elasticity("cpu", max_units=8, efficiency=Amdahl(1.0)))
    assert s.relative_duration(2) == pytest.approx(1.0)
    assert s.relative_duration(8) == pytest.approx(0.25)


def test_cpuset_round_trip_and_errors():
    assert parse_cpuset("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpuset([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert parse_cpuset("") == ()
    for bad in ["a", "3-1", "1,,2", "-1", "1-", "0x1", "99999999"]:
        with pytest.raises(SpecError):
            parse_cpuset(bad)


def test_pool_forms_and_validation():
    p = Pool(cpus="0-3,8-11", numa=[[0, 1, 2, 3], [8, 9, 10, 11]], gpus=4, quotas={"s": Quota(concurrency=2)})
    assert p.cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert len(p.numa_nodes) == 2 and p.gpus == (0, 1, 2, 3)
    assert Pool(cpus=4).numa_nodes == ((0, 1, 2, 3),)
    with pytest.raises(SpecError):
        Pool(cpus=4, numa=[[0, 1], [1, 2, 3]])  # overlap
    with pytest.raises(SpecError):
        Pool(cpus=4, numa=[[0, 1]])  # does not cover
    with pytest.raises(SpecError):
        Pool(gpus=4, gpu_cells=(1, 3))
    with pytest.raises(SpecError):
        Quota()
    with pytest.raises(SpecError):
        Quota(rate=-1.0)
    with pytest.raises(SpecError):
        Quota(concurrency=2, burst=3)
    assert Quota(rate=2.5).bucket == 3


def test_names_with_trailing_newline_are_refused():
    for kw in (dict(container="abc\n"), dict(kind="x\n"), dict(service="rm\n", gpus=1), dict(quotas={"q\n": 1})):
        with pytest.raises(SpecError):
            ActionSpec(**{"kind": "x", **kw})
