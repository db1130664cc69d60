"""Action traces as JSON Lines: record them from the live runtime, replay them in the simulator.

One line per action::

    {"arrival": 12.5, "kind": "test", "cpus": 1, "elastic": {"resource": "cpu", "max_units": 16,
     "parallel": 0.9}, "duration": 3.2, "traj": "sb-17", "end": 14.1}

``arrival`` (s) and ``duration`` (s of work at the minimum units) are required with ``kind``.
Times are relative to the first action: the recorder writes them so, and the replay shifts any
trace (one recorded with seconds since boot, say) so that its earliest ``arrival`` is 0.
``cpus``/``gpus``/``memory``/``needs``/``quotas``/``service``/``elastic``/``overhead`` describe the
demand (``needs``: units of the pool's declared counted resources, ``{"sandbox_slots": 1}``).
``traj`` groups actions into a closed-loop trajectory (the think time before an action is its
arrival minus the previous action's ``end``, or its arrival plus duration when ``end`` is absent);
lines without ``traj`` are open-loop, each its own trajectory. An optional first line
``{"pool": {"cpus": 64, "gpus": 8, "quotas": {"search": {"concurrency": 4, "rate": 10}}}}`` names the
pool (also ``numa``, ``memory`` and ``resources``: ``{"sandbox_slots": {"capacity": 8, "unit": "slots"}}``). A malformed line raises :class:`TraceError` naming the line and the field; nothing is dropped.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from typing import IO, Any

import attrs

from ..errors import SpecError, TraceError
from ..pool import Pool, Quota
from ..resources import Counted
from ..scheduler.decisions import Decision, Grant
from ..scheduler.events import Cancelled, Event, Released, ServiceResidency, Submitted
from ..spec import ActionSpec, Amdahl, Elasticity
from .engine import Act, Trajectory

__all__ = ["TraceError", "TraceRecorder", "load_trace", "trace_workload"]

_FIELDS = {"arrival", "kind", "cpus", "gpus", "memory", "needs", "quotas", "service", "elastic", "duration",
           "traj", "end", "overhead", "units", "granted", "failed", "id"}


def _finite(v: float) -> bool:
    """Finite *as a float*: the replay calls ``float()`` on these, so an int past float range
    (``9`` * 400) must be refused here rather than raise OverflowError later."""
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _num(line: int, rec: dict[str, Any], key: str, *, positive: bool = False, default: Any = None) -> Any:
    if key not in rec:
        if default is not None:
            return default
        raise TraceError(f"line {line}: missing field {key!r}")
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
        raise TraceError(f"line {line}: field {key!r} must be a finite number, got {v!r}")
    if v < 0 or (positive and v == 0):
        raise TraceError(f"line {line}: field {key!r} must be {'> 0' if positive else '>= 0'}, got {v!r}")
    return v


def _spec(line: int, rec: dict[str, Any]) -> ActionSpec:
    el = rec.get("elastic")
    elastic = None
    if el is not None:
        if not isinstance(el, dict):
            raise TraceError(f"line {line}: field 'elastic' must be an object, got {el!r}")
        extra = set(el) - {"resource", "max_units", "parallel", "table"}
        if extra:
            raise TraceError(f"line {line}: field 'elastic' has unknown keys {sorted(extra)}")
        try:
            if "table" in el:
                eff: Any = {int(k): float(v) for k, v in el["table"].items()}
            else:
                eff = Amdahl(el.get("parallel", 0.9))
            resource: Any = el.get("resource")  # untrusted JSON: Elasticity validates both
            max_units: Any = el.get("max_units")
            elastic = Elasticity(resource, max_units, eff)
        except (SpecError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise TraceError(f"line {line}: field 'elastic': {exc}") from None
    for key in ("cpus", "gpus", "memory"):
        if key in rec and (isinstance(rec[key], bool) or not isinstance(rec[key], int) or rec[key] < 0):
            raise TraceError(f"line {line}: field {key!r} must be an int >= 0, got {rec[key]!r}")
    try:
        return ActionSpec(kind=rec["kind"], cpus=rec.get("cpus", 0), gpus=rec.get("gpus", 0),
                          memory=rec.get("memory", 0), quotas=rec.get("quotas"), elastic=elastic,
                          service=rec.get("service"), needs=rec.get("needs"))
    except (SpecError, TypeError, ValueError, AttributeError) as exc:
        named = [f for f in ("kind", "quotas", "needs", "service", "cpus", "gpus") if f in str(exc)]
        field = named[0] if len(named) == 1 else "spec"  # the message names one field, or it is the spec's
        raise TraceError(f"line {line}: field {field!r}: {exc}") from None


def load_trace(path: str | os.PathLike[str]) -> tuple[Pool | None, list[tuple[int, dict[str, Any], ActionSpec]]]:
    """Parse and validate every line; returns the optional pool and ``(line, record, spec)`` rows."""
    pool: Pool | None = None
    rows: list[tuple[int, dict[str, Any], ActionSpec]] = []
    # Bytes, split on b"\n" only: each line is decoded on its own so bad UTF-8 names its line, and
    # line numbers match what ``wc -l``/an editor shows (text mode would also split on a lone \r).
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            # The one boundary: whatever a hostile line makes the parser or a constructor raise
            # becomes a TraceError naming the line; the explicit checks below give the field too.
            try:
                rec = _parse_line(i, raw)
                if rec is None:
                    continue
                if "pool" in rec:
                    if rows or pool is not None:
                        raise TraceError(f"line {i}: field 'pool' is only allowed on the first line")
                    pool = _pool(i, rec["pool"])
                    continue
                rows.append((i, rec, _record(i, rec)))
            except TraceError:
                raise
            except (ValueError, TypeError, AttributeError, KeyError, OverflowError, RecursionError) as exc:
                raise TraceError(f"line {i}: {type(exc).__name__}: {exc}") from None
    return pool, rows


def _parse_line(i: int, raw: bytes) -> dict[str, Any] | None:
    """One line's JSON object, or None for a blank line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"line {i}: not UTF-8 (byte {exc.start + 1})") from None
    if not text.strip():
        return None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"line {i}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise TraceError(f"line {i}: not valid JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an int over the 4300-digit conversion limit
        raise TraceError(f"line {i}: not valid JSON ({exc})") from None
    if not isinstance(rec, dict):
        raise TraceError(f"line {i}: expected a JSON object, got {type(rec).__name__}")
    return rec


def _record(i: int, rec: dict[str, Any]) -> ActionSpec:
    """Validate one action line's fields (types included) and build its spec."""
    unknown = set(rec) - _FIELDS
    if unknown:
        raise TraceError(f"line {i}: unknown field(s) {sorted(unknown)}")
    if "kind" not in rec:
        raise TraceError(f"line {i}: missing field 'kind'")
    _num(i, rec, "arrival")
    _num(i, rec, "duration", positive=True)
    if "end" in rec:
        _num(i, rec, "end")
    if "overhead" in rec:
        _num(i, rec, "overhead")
    if "traj" in rec:
        t = rec["traj"]
        if isinstance(t, bool) or not isinstance(t, (str, int)):  # it keys a dict of trajectories
            raise TraceError(f"line {i}: field 'traj' must be a string or an int, got {t!r}")
    return _spec(i, rec)


def _pool(line: int, p: Any) -> Pool:
    if not isinstance(p, dict):
        raise TraceError(f"line {line}: field 'pool' must be an object")
    unknown = sorted(set(p) - {"cpus", "numa", "gpus", "memory", "quotas", "resources"})
    if unknown:  # nothing is dropped silently: a misspelt "gpu" would replay on no GPUs
        raise TraceError(f"line {line}: field 'pool' has unknown key(s) {unknown}; known: cpus, numa, gpus, "
                         "memory, quotas, resources")
    raw_quotas = p.get("quotas") or {}
    if not isinstance(raw_quotas, dict):
        raise TraceError(f"line {line}: field 'pool.quotas' must be an object, got {raw_quotas!r}")
    quotas: dict[str, Quota] = {}
    for n, q in raw_quotas.items():
        if not isinstance(q, dict) or set(q) - {"concurrency", "rate", "burst"}:
            raise TraceError(f"line {line}: field 'pool.quotas.{n}' must be an object with concurrency, "
                             f"rate and/or burst, got {q!r}")
        try:
            quotas[n] = Quota(**q)
        except SpecError as exc:
            raise TraceError(f"line {line}: field 'pool.quotas.{n}': {exc}") from None
    raw_res = p.get("resources") or {}
    if not isinstance(raw_res, dict):
        raise TraceError(f"line {line}: field 'pool.resources' must be an object, got {raw_res!r}")
    resources: dict[str, Counted] = {}
    for n, r in raw_res.items():
        if not isinstance(r, dict) or "capacity" not in r or set(r) - {"capacity", "unit"}:
            raise TraceError(f"line {line}: field 'pool.resources.{n}' must be an object with capacity "
                             f"and optionally unit, got {r!r}")
        try:
            resources[n] = Counted(**r)
        except SpecError as exc:
            raise TraceError(f"line {line}: field 'pool.resources.{n}': {exc}") from None
    try:
        return Pool(cpus=p.get("cpus", 0), numa=p.get("numa"), gpus=p.get("gpus", 0), memory=p.get("memory"),
                    quotas=quotas, resources=resources)
    except (SpecError, TypeError) as exc:
        raise TraceError(f"line {line}: field 'pool': {exc}") from None


def trace_workload(path: str | os.PathLike[str], pool: Pool | None = None, *, cpus: int | None = None,
                   gpus: int | None = None) -> Any:
    """A :class:`~.workloads.Workload` replaying the trace at ``path`` (closed loop per ``traj``).

    ``pool`` replaces the trace's pool line; ``cpus``/``gpus`` resize only that dimension of it
    (quotas, memory and the other dimension stay as recorded; resized CPUs lose the NUMA layout).
    """
    from .workloads import Workload

    tpool, rows = load_trace(path)
    pool = pool or tpool
    if cpus is not None or gpus is not None:
        base = pool or Pool()
        pool = attrs.evolve(base, cpus=base.cpus if cpus is None else cpus,
                            numa=base.numa if cpus is None else None,
                            gpus=base.gpus if gpus is None else gpus)
    if pool is None:
        raise TraceError(f"{path}: no pool: add a first line {{\"pool\": {{...}}}} or pass --cpus/--gpus")
    groups: dict[Any, list[tuple[int, dict[str, Any], ActionSpec]]] = {}
    for n, (line, rec, spec) in enumerate(rows):
        key = ("traj", rec["traj"]) if "traj" in rec else ("line", n)
        groups.setdefault(key, []).append((line, rec, spec))
    # Times relative to the first action: a trace keyed to another clock (``loop.time()`` is
    # seconds since boot) would otherwise replay as a step of the machine's uptime, mostly idle.
    t_first = min((float(rec["arrival"]) for _line, rec, _spec in rows), default=0.0)
    # A GPU service action's recorded overhead is the restore its grant waited for (TraceRecorder):
    # the replay gives each service its median restore and lets the simulator's residency model
    # decide who pays it (isolated slices keep their models resident and never do), instead of
    # charging every replayed call what the recorded run paid
    restores: dict[str, list[float]] = {}
    for _line, rec, spec in rows:
        if spec.service and rec.get("overhead"):
            restores.setdefault(spec.service, []).append(float(rec["overhead"]))
    restore_s = {svc: float(statistics.median(v)) for svc, v in restores.items()}
    trajs = []
    services: list[str] = []
    for items in groups.values():
        items.sort(key=lambda x: (x[1]["arrival"], x[0]))
        acts = []
        prev_free = 0.0  # when the previous action of this trajectory ended
        start = float(items[0][1]["arrival"]) - t_first
        for j, (line, rec, spec) in enumerate(items):
            arr = float(rec["arrival"])
            think = 0.0 if j == 0 else arr - prev_free
            if think < -1e-9:
                raise TraceError(f"line {line}: field 'arrival' {arr} is before the previous action of "
                                 f"traj {rec.get('traj')!r} ended ({prev_free}); give overlapping actions "
                                 "different traj ids")
            over = 0.0 if spec.service else float(rec.get("overhead", 0.0))
            acts.append(Act(spec, float(rec["duration"]), max(0.0, think), over))
            prev_free = float(rec["end"]) if "end" in rec else arr + float(rec["duration"])
            if spec.service and spec.service not in services:
                services.append(spec.service)
        trajs.append(Trajectory(tuple(acts), start, 0.0))
    return Workload("trace", pool, tuple(trajs), services=tuple(services), restore_s=restore_s,
                    policies=("tangram", "fifo1", "fifo4", "fifo16") + (("isolated",) if services else ()),
                    params={"path": str(path), "actions": len(rows)})


class TraceRecorder:
    """Runtime observer writing one JSONL line per finished action (opt-in)::

        async with Tangram(pool, observers=[TraceRecorder("run.jsonl", pool=pool)]) as t: ...

    Times are seconds since the first action arrived (not the runtime clock, which counts from
    boot). ``duration`` is the measured run time, less the GPU restore its grant waited for (written
    as ``overhead``, from the manager's report), scaled back to the spec's minimum units, so a replay
    under another policy rescales the work and not the restore; ``traj`` is the spec's ``container`` (one sandbox per trajectory), else
    its ``group`` (what the framework adapters set to the trajectory): without either a replay
    cannot keep the trajectories closed-loop.
    Works as a simulator observer too. Call :meth:`close` (or use it as a context manager) to flush.
    """

    sees_every_action = True  # the simulator refuses it under a policy that hides actions (static)

    def __init__(self, path: str | os.PathLike[str] | IO[str], pool: Pool | None = None) -> None:
        self._own = not hasattr(path, "write")
        self._f: IO[str] = open(path, "w", encoding="utf-8") if self._own else path  # type: ignore[arg-type,assignment]
        # aid -> [spec, arrival, grant time, units, (service, gpus) of a restore not yet reported, overhead]
        self._open: dict[int, list[Any]] = {}
        self._t0: float | None = None  # the first action's arrival: every time is written relative to it
        self.lines = 0
        if pool is not None:
            quotas = {n: {k: v for k, v in (("concurrency", q.concurrency), ("rate", q.rate),
                                            ("burst", q.burst)) if v is not None} for n, q in pool.quotas}
            head: dict[str, Any] = {"cpus": list(pool.cpus), "gpus": list(pool.gpus), "quotas": quotas}
            if pool.numa is not None:
                head["numa"] = [list(n) for n in pool.numa]
            if pool.memory is not None:
                head["memory"] = pool.memory
            if pool.resources:
                head["resources"] = {n: {"capacity": c.capacity, "unit": c.unit} for n, c in pool.resources}
            self._write({"pool": head})

    def __call__(self, events: Sequence[Event], now: float, decisions: Sequence[Decision]) -> None:
        for ev in events:
            if isinstance(ev, Submitted):
                if self._t0 is None:
                    self._t0 = now
                self._open[ev.action_id] = [ev.spec, now, None, 0, None, 0.0]
            elif isinstance(ev, (Released, Cancelled)):
                rec = self._open.pop(ev.action_id, None)
                if rec is not None and rec[2] is not None:
                    self._finish(ev.action_id, rec, now, failed=isinstance(ev, Cancelled) or ev.failed)
            elif isinstance(ev, ServiceResidency) and ev.resident and ev.restore_s is not None:
                key = (ev.service, tuple(ev.gpus))
                for rec in self._open.values():
                    if rec[4] == key:  # the restore this action's grant waited for
                        rec[4], rec[5] = None, float(ev.restore_s)
                        break
        for d in decisions:
            if isinstance(d, Grant) and d.action_id in self._open:
                rec = self._open[d.action_id]
                rec[2], rec[3] = now, d.units
                if d.restore and rec[0].service and d.gpus:
                    rec[4] = (rec[0].service, tuple(d.gpus))

    def _finish(self, aid: int, rec: list[Any], now: float, failed: bool) -> None:
        spec, arrival, granted, units, _pending, overhead = rec
        overhead = min(overhead, max(0.0, now - granted - 1e-9))
        ran = max(1e-9, now - granted - overhead)
        work = ran / spec.relative_duration(units) if spec.elastic is not None and units else ran
        t0 = self._t0 or 0.0
        line: dict[str, Any] = {"id": aid, "arrival": round(arrival - t0, 6), "kind": spec.kind,
                                "duration": round(work, 6), "granted": round(granted - t0, 6),
                                "end": round(now - t0, 6)}
        for k in ("cpus", "gpus", "memory"):
            if getattr(spec, k):
                line[k] = getattr(spec, k)
        if spec.needs:
            line["needs"] = dict(spec.needs)
        if spec.quotas:
            line["quotas"] = dict(spec.quotas)
        if spec.service:
            line["service"] = spec.service
        if spec.elastic is not None:
            el: dict[str, Any] = {"resource": spec.elastic.resource, "max_units": spec.elastic.max_units}
            eff = spec.elastic.efficiency
            if isinstance(eff, Amdahl):
                el["parallel"] = eff.parallel
            else:
                el["table"] = {str(m): eff.efficiency(m) for m in range(1, min(spec.elastic.max_units, 64) + 1)}
            line["elastic"] = el
            line["units"] = units
        traj = spec.container or spec.group  # the sandbox, else what the adapters name (the trajectory)
        if traj:
            line["traj"] = traj
        if overhead:
            line["overhead"] = round(overhead, 6)
        if failed:
            line["failed"] = True
        self._write(line)

    def _write(self, obj: dict[str, Any]) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._f.flush()
        self.lines += 1

    def close(self) -> None:
        if self._own and not self._f.closed:
            self._f.close()

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
