"""Fuzzing the input boundaries: spec/pool validation, trace (JSONL) parsing, cpuset strings and
container ids. The contract under test: bad input gives the documented error (SpecError,
TraceError naming the line, CgroupError) and nothing else — never a TypeError/AttributeError/
RecursionError/OverflowError from deep inside. Each of these inputs once escaped as such an
error; the docstrings say which.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Quota
from tangram_sdk._cpuset import format_cpuset, parse_cpuset
from tangram_sdk.errors import CgroupError, SpecError
from tangram_sdk.spec import Table

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# anything a user, a config file or a trace could put in a field
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-3, 10),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20), st.binary(max_size=8),
    st.sampled_from(["cpu", "gpu", "0-3", "x", "", "a\n", "../x", "\x00", "é"]),
)
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                            st.dictionaries(st.one_of(st.text(max_size=5), st.integers(-2, 9)), inner, max_size=3)),
    max_leaves=6,
)


def _valid_or(exc_types: tuple[type[BaseException], ...], fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except exc_types:
        return None


# ------------------------------------------------------------------------------------- specs
@FUZZ
@given(kw=st.fixed_dictionaries({}, optional={
    "cpus": st.one_of(st.integers(0, 8), anything), "gpus": st.one_of(st.integers(0, 8), anything),
    "memory": anything, "duration": st.one_of(st.floats(0.001, 10), anything), "priority": anything,
    "container": st.one_of(st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,20}", fullmatch=True), anything),
    "service": anything,
    "elastic": st.one_of(st.none(), anything, st.builds(Elasticity, st.just("cpu"), st.integers(1, 16))),
}), kind=st.one_of(st.sampled_from(["test", "score"]), anything))
def test_actionspec_valid_or_spec_error(kw: dict[str, Any], kind: Any) -> None:
    """Random values for every field except ``quotas`` (see the bug test below)."""
    try:
        spec = ActionSpec(kind=kind, **kw)
    except SpecError:
        return
    hash(spec)  # frozen and hashable: the core keys caches by spec
    assert isinstance(spec.kind, str) and spec.cpus >= 0 and spec.gpus >= 0


@FUZZ
@given(quotas=anything)
@example(quotas=5)
@example(quotas=[1])
@example(quotas="ab")
def test_actionspec_quotas_of_the_wrong_shape_raise_spec_error(quotas: Any) -> None:
    """A non-iterable or wrongly shaped ``quotas`` (5, [1], "ab", [[1, 2, 3]]) is a SpecError, not
    a TypeError/ValueError from tuple unpacking."""
    _valid_or((SpecError,), ActionSpec, kind="x", quotas=quotas)


@FUZZ
@given(duration=st.integers(2**1024, 2**1100))
def test_actionspec_huge_integer_duration_is_a_spec_error(duration: int) -> None:
    """A duration too large for a float (``math.isfinite(10**400)`` raises OverflowError) is a
    SpecError; Quota(rate=...) likewise."""
    _valid_or((SpecError,), ActionSpec, kind="x", duration=duration)


@FUZZ
@given(p=anything, table=anything, fn_value=anything, resource=anything, max_units=anything)
@example(p="x", table={1: 1.0}, fn_value=0.5, resource="cpu", max_units=2)
@example(p=0.5, table={1: "x"}, fn_value=0.5, resource="cpu", max_units=2)
def test_efficiency_models_raise_only_spec_error(p: Any, table: Any, fn_value: Any, resource: Any,
                                                     max_units: Any) -> None:
    """``Amdahl("x")``/``Amdahl(None)``, ``Table.from_mapping({1: "x"})`` or ``([1])`` and a bad
    efficiency callable are SpecErrors naming the value, never the ValueError/TypeError/
    AttributeError of a conversion."""
    _valid_or((SpecError,), Amdahl, p)
    _valid_or((SpecError,), Table.from_mapping, table)
    _valid_or((SpecError,), Elasticity, resource, max_units, table)
    _valid_or((SpecError,), Elasticity, "cpu", 4, lambda m: fn_value)


@FUZZ
@given(cpus=anything, gpus=anything, numa=anything, cells=anything, memory=anything, quotas=anything,
       conc=anything, rate=anything, burst=anything)
@example(cpus=1.5, gpus=0, numa=None, cells=(1, 2), memory=None, quotas={}, conc=1, rate=None, burst=None)
@example(cpus=2, gpus=0, numa=5, cells=(1,), memory=None, quotas=[("a", 1)], conc=1, rate=10**400, burst=None)
def test_pool_and_quota_raise_only_spec_error(cpus: Any, gpus: Any, numa: Any, cells: Any, memory: Any,
                                                  quotas: Any, conc: Any, rate: Any, burst: Any) -> None:
    """``Pool(cpus=1.5)``/``Pool(cpus=None)``/``Pool(gpu_cells=5)``/``Pool(numa=5)``,
    ``Pool(quotas=[...])`` and ``Quota(rate=10**400)`` are SpecErrors, not the TypeError ("not
    iterable"), AttributeError or OverflowError of the conversion."""
    _valid_or((SpecError,), Quota, conc, rate, burst)
    _valid_or((SpecError,), Pool, cpus=cpus, gpus=gpus, numa=numa, gpu_cells=cells, memory=memory, quotas=quotas)


def test_pool_core_count_is_bounded_like_cpuset_strings() -> None:
    """``Pool(cpus=N)`` has the bound ``parse_cpuset`` has (ids < 65536, bounded work for hostile
    input): a trace header ``{"pool": {"cpus": 10**10}}`` is a SpecError, not exhausted memory."""
    with pytest.raises(SpecError):
        Pool(cpus=1 << 17)


# ------------------------------------------------------------------------------------- cpusets
@settings(max_examples=2000, deadline=None)
@given(text=st.one_of(st.text(max_size=40), st.text(alphabet="0123456789-, \t\n", max_size=40),
                      st.text(alphabet="0123456789-,٣", max_size=12)))
@example(text="0-65535")
@example(text="0-65536")
@example(text="3-1")
@example(text="1,,2")
@example(text="١")  # a non-ASCII digit
def test_parse_cpuset_valid_or_spec_error(text: str) -> None:
    try:
        ids = parse_cpuset(text)
    except SpecError:
        return
    assert list(ids) == sorted(set(ids)) and all(0 <= i < 65536 for i in ids)
    assert parse_cpuset(format_cpuset(ids)) == ids


@settings(max_examples=500, deadline=None)
@given(ids=st.sets(st.integers(0, 65535), max_size=200))
def test_cpuset_round_trip(ids: set[int]) -> None:
    assert parse_cpuset(format_cpuset(ids)) == tuple(sorted(ids))


@given(value=anything)
@FUZZ
def test_parse_cpuset_non_strings(value: Any) -> None:
    if isinstance(value, str):
        return
    with pytest.raises(SpecError):
        parse_cpuset(value)


# ------------------------------------------------------------------------------------- container ids
ref_like = st.one_of(
    st.text(max_size=140), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,130}", fullmatch=True),
    st.sampled_from(["../etc", "a/../b", "/abs", "a\x00b", "a\n", "é", "a" * 128, "a" * 129, ".", "..", "-x",
                     "a b", "a;rm -rf /", "$(id)", "a%2F..", "\u202e", "a\r"]),
)


@settings(max_examples=1500, deadline=None)
@given(ref=ref_like)
def test_container_ids_agree_across_layers(ref: str) -> None:
    """The spec, the Docker client and the CPU manager's check accept exactly the same ids, and
    nothing they accept can form a path or an URL segment of its own."""
    from tangram_sdk.managers._docker import validate_ref
    from tangram_sdk.managers.cpu import DockerCpuManager

    spec_ok = _valid_or((SpecError,), ActionSpec, kind="x", cpus=1, container=ref) is not None
    docker_ok = _valid_or((SpecError,), validate_ref, ref) is not None
    mgr = DockerCpuManager(backend="api")
    check_ok = spec_ok and _valid_or((SpecError,), mgr.check, ActionSpec(kind="x", cpus=1, container=ref)) is None
    assert spec_ok == docker_ok, (ref, spec_ok, docker_ok)
    if docker_ok:
        assert check_ok
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", ref)
        assert "/" not in ref and "\x00" not in ref and ref not in (".", "..") and ref.isascii()


@settings(max_examples=1500, deadline=None)
@given(cid=st.one_of(ref_like, st.from_regex(r"[0-9a-f]{64}", fullmatch=True), st.text(alphabet="0123456789abcdef./",
                                                                                        min_size=60, max_size=70)))
def test_cgroup_layer_accepts_only_full_hex_ids(cid: str) -> None:
    from tangram_sdk.managers import _cgroup

    try:
        _cgroup.validate_full_id(cid)
    except CgroupError:
        assert not re.fullmatch(r"[0-9a-f]{64}", cid)
        return
    assert re.fullmatch(r"[0-9a-f]{64}", cid)


@settings(max_examples=300, deadline=None)
@given(cid=ref_like, rel=st.sampled_from(["docker/{id}", "../{id}", "/{id}", "docker/../../{id}", "{id}/..",
                                          "system.slice/docker-{id}.scope", "docker/{id}/../other"]))
def test_locate_and_confine_never_leave_the_root(cid: str, rel: str) -> None:
    from tangram_sdk.managers import _cgroup

    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "cpuset"
        (root / "docker").mkdir(parents=True)
        layout = _cgroup.CgroupLayout(1, root, root)
        try:
            cg = _cgroup.locate(layout, cid)
        except CgroupError:
            pass
        else:  # only for a real 64-hex id whose directory exists (it never does here)
            raise AssertionError(cg)
        try:
            p = _cgroup.confine(root, root / rel.replace("{id}", cid), cid)
        except CgroupError:
            return
        assert root.resolve() in p.parents and p.name in (cid, f"docker-{cid}.scope")


# ------------------------------------------------------------------------------------- traces
GOOD = {"arrival": 0.5, "kind": "test", "cpus": 1, "duration": 2.0,
        "elastic": {"resource": "cpu", "max_units": 8, "parallel": 0.9}}
FIELDS = ["arrival", "kind", "cpus", "gpus", "memory", "quotas", "service", "elastic", "duration", "traj", "end",
          "overhead", "units", "granted", "failed", "id", "pool", "colour"]
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=5,
)


@st.composite
def trace_lines(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["good", "mutated", "pool", "text", "bytes"]))
    if kind == "good":
        return json.dumps(GOOD).encode()
    if kind == "mutated":
        rec = dict(GOOD)
        for _ in range(draw(st.integers(1, 3))):
            f = draw(st.sampled_from(FIELDS))
            if draw(st.booleans()) and f in rec:
                del rec[f]
            else:
                rec[f] = draw(json_values)
        return json.dumps(rec).encode()
    if kind == "pool":
        pool = draw(st.dictionaries(st.sampled_from(["cpus", "gpus", "numa", "quotas", "memory"]), json_values,
                                    max_size=3))
        return json.dumps({"pool": pool}).encode()
    if kind == "text":
        # one line each: a newline inside would make two (and the line numbers count those)
        return draw(st.text(max_size=30)).replace("\n", " ").encode("utf-8", "surrogatepass")
    return draw(st.binary(max_size=30)).replace(b"\n", b" ")


LINE_ERR = re.compile(r"^line (\d+): ")


def _load(lines: list[bytes]) -> None:
    from tangram_sdk.sim.trace import TraceError, load_trace, trace_workload

    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False) as f:
        f.write(b"\n".join(lines) + b"\n")
        path = f.name
    try:
        for fn in (load_trace, trace_workload):
            try:
                fn(path)
            except TraceError as exc:
                m = LINE_ERR.match(str(exc))
                if m is None:  # the one file-level message: no pool line and none passed
                    assert fn is trace_workload and "no pool" in str(exc), str(exc)
                else:
                    assert 1 <= int(m.group(1)) <= len(lines), str(exc)
    finally:
        os.unlink(path)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(trace_lines(), min_size=1, max_size=6))
def test_trace_reader_random_traces_raise_only_trace_error_naming_the_line(lines: list[bytes]) -> None:
    """Random traces (valid, mutated, pool headers, random text and bytes) raise only a
    TraceError, naming a line of the file; the cases it once found are pinned one by one below."""
    _load(lines)


@pytest.mark.parametrize("bad", [
    pytest.param(b"[" * 100_000, id="deep-nesting-RecursionError"),
    pytest.param(b'{"arrival": ' + b"1" * 5000 + b', "kind": "x", "duration": 1}', id="5000-digit-int-ValueError"),
    pytest.param(b'{"arrival": 1, "kind": "x\xff", "duration": 1}', id="invalid-utf8-UnicodeDecodeError"),
    pytest.param(b'{"pool": {"cpus": 4, "quotas": [1]}}', id="pool-quotas-list-AttributeError"),
    pytest.param(b'{"pool": {"cpus": 1}}\n{"arrival": ' + b"9" * 400 + b', "kind": "x", "duration": 1}',
                 id="huge-int-arrival-OverflowError"),
    pytest.param(b'{"pool": {"cpus": 1}}\n{"arrival": 1, "kind": "x", "duration": 1, "traj": [1]}',
                 id="unhashable-traj-TypeError"),
])
def test_trace_reader_malformed_line_cases(bad: bytes) -> None:
    """Each of these malformed lines is a TraceError naming the line (not UTF-8, bad JSON, too
    deep, a bad pool, a number past float range, an unhashable ``traj``), never another exception
    without a line number."""
    _load(bad.split(b"\n"))


def test_trace_reader_accepts_what_the_recorder_writes() -> None:
    _load([json.dumps({"pool": {"cpus": 4}}).encode(), json.dumps(GOOD).encode()])
    assert math.isfinite(GOOD["arrival"])
