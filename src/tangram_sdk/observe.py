"""Observability as runtime observers: a Prometheus collector and a Chrome-trace/Perfetto timeline.

Both plug into ``Tangram(pool, observers=[...])`` (and the simulator, which calls observers with the
same ``(events, now, decisions)`` signature)::

    timeline = Timeline()
    prom = PrometheusMetrics()                 # needs the optional ``prometheus_client``
    async with Tangram(pool, observers=[timeline, prom]) as tangram:
        prom.bind(tangram)                     # gauges read tangram.statistics() at scrape time
        ...
    timeline.export("run.trace.json")          # open in https://ui.perfetto.dev or chrome://tracing
"""

from __future__ import annotations

import contextlib
import json
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ._livestats import CpuBusy, LiveStats
from .scheduler.decisions import Decision, Grant, Reject
from .scheduler.events import Cancelled, Event, Released, Submitted

__all__ = ["PrometheusMetrics", "Timeline"]

# the live exporter per (registry, namespace): see PrometheusMetrics.__init__
_EXPORTERS: weakref.WeakValueDictionary[tuple[int, str], PrometheusMetrics] = weakref.WeakValueDictionary()


class Timeline:
    """Records which action held which cores/GPUs when; exports Chrome trace JSON.

    One track per core (process "cpu") and per GPU (process "gpu"); an action appears as a complete
    event on every unit it held, named ``kind#id``, with its queueing time in ``args``. Queued spans
    go to a "queue" process; counters track running and queued actions.
    """

    def __init__(self, *, max_actions: int | None = None) -> None:
        self.max_actions = max_actions
        self._kind: dict[int, str] = {}
        self._submitted: dict[int, float] = {}
        self._granted: dict[int, tuple[float, Grant]] = {}
        self._spans: list[tuple[int, str, float, float, float, Grant]] = []  # aid, kind, sub, start, end, g
        self._counters: list[tuple[float, int, int]] = []  # t, running, queued
        self._t0: float | None = None
        self.dropped = 0

    def __call__(self, events: Sequence[Event], now: float, decisions: Sequence[Decision]) -> None:
        if self._t0 is None:
            self._t0 = now
        for ev in events:
            if isinstance(ev, Submitted):
                self._kind[ev.action_id] = ev.spec.kind
                self._submitted[ev.action_id] = now
            elif isinstance(ev, (Released, Cancelled)):
                aid = ev.action_id
                got = self._granted.pop(aid, None)
                sub = self._submitted.pop(aid, now)
                kind = self._kind.pop(aid, "?")
                if got is not None:
                    if self.max_actions is not None and len(self._spans) >= self.max_actions:
                        self.dropped += 1
                    else:
                        self._spans.append((aid, kind, sub, got[0], now, got[1]))
        for d in decisions:
            if isinstance(d, Grant):
                self._granted[d.action_id] = (now, d)
            elif isinstance(d, Reject):
                self._submitted.pop(d.action_id, None)
                self._kind.pop(d.action_id, None)
        running = len(self._granted)
        queued = len(self._submitted) - running
        counters = self._counters
        # only changes, and (with max_actions) no more of them than the kept actions can make
        # (each changes the counts ~3 times): one entry per round grew without bound (~100 B each)
        if not counters or counters[-1][1] != running or counters[-1][2] != queued:
            if self.max_actions is None or len(counters) < 8 * self.max_actions:
                counters.append((now, running, queued))

    def to_chrome(self, *, now: float | None = None) -> dict[str, Any]:
        """The trace as a dict ``{"traceEvents": [...]}`` (timestamps in microseconds).
        Actions still running at ``now`` (default: the last event) are included, open-ended."""
        t0 = self._t0 or 0.0
        us = 1e6
        evs: list[dict[str, Any]] = []
        pids = {"cpu": 1, "gpu": 2, "queue": 3, "scheduler": 4}
        for name, pid in pids.items():
            evs.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        seen_threads: set[tuple[int, int]] = set()
        last = now if now is not None else (self._counters[-1][0] if self._counters else t0)
        spans = list(self._spans) + [(aid, self._kind.get(aid, "?"), self._submitted.get(aid, t), t, last, g)
                                     for aid, (t, g) in self._granted.items()]
        for aid, kind, sub, start, end, g in spans:
            name = f"{kind}#{aid}"
            args = {"id": aid, "queued_s": round(start - sub, 6), "units": g.units,
                    "cpus": list(g.cpus), "gpus": list(g.gpus)}
            for pid, units in ((1, g.cpus), (2, g.gpus)):
                for u in units:
                    if (pid, u) not in seen_threads:
                        seen_threads.add((pid, u))
                        evs.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": u,
                                    "args": {"name": f"{'core' if pid == 1 else 'gpu'} {u}"}})
                    evs.append({"ph": "X", "name": name, "cat": kind, "pid": pid, "tid": u,
                                "ts": (start - t0) * us, "dur": max(0.0, end - start) * us, "args": args})
            if start > sub:
                evs.append({"ph": "X", "name": name, "cat": "queued", "pid": 3, "tid": aid,
                            "ts": (sub - t0) * us, "dur": (start - sub) * us})
        for t, running, queued in self._counters:
            evs.append({"ph": "C", "name": "actions", "pid": 4, "tid": 0, "ts": (t - t0) * us,
                        "args": {"running": running, "queued": queued}})
        return {"traceEvents": evs, "displayTimeUnit": "ms"}

    def export(self, path: str | os.PathLike[str]) -> None:
        """Write Chrome trace / Perfetto JSON to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_chrome(), f)


class PrometheusMetrics:
    """Prometheus metrics for a runtime (or a bare Scheduler): gauges read ``statistics()`` at
    scrape time; as an observer it also counts events and decisions and records a histogram of
    action completion times (submit -> release). For ``tangram top`` it also exports, from the same
    events (:mod:`._livestats`), queued/running actions and the oldest wait per kind, the ACT split
    (queueing / overhead / execution), restores and evictions per GPU service, and how many of the
    pool's cores the OS saw busy since the previous scrape.

    ``prometheus_client`` is imported here, lazily: install the ``prometheus`` extra.
    """

    def __init__(self, source: Any = None, *, registry: Any = None, namespace: str = "tangram") -> None:
        try:
            import prometheus_client as pc
            from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("PrometheusMetrics needs prometheus_client: pip install 'tangram-sdk[prometheus]'"
                              ) from exc
        self._pc = pc
        self._gauge = GaugeMetricFamily
        self._counter = CounterMetricFamily
        self.namespace = namespace
        self.registry = registry if registry is not None else pc.REGISTRY
        self._stats: Callable[[], dict[str, Any]] | None = None
        self._busy: CpuBusy | None = None
        ns = namespace
        self.events = pc.Counter(f"{ns}_events", "Scheduler input events", ["type"], registry=None)
        self.decisions = pc.Counter(f"{ns}_decisions", "Scheduler decisions", ["type"], registry=None)
        self.act = pc.Histogram(f"{ns}_action_completion_seconds", "Submit to release, per action", ["kind"],
                                buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
                                registry=None)
        self._sub: dict[int, tuple[str, float]] = {}
        self.live = LiveStats()
        if source is not None:  # last: binding sets the busy-cores reader this constructor resets
            self.bind(source)
        # describe() gives the registry nothing to check duplicates by: a second exporter of the same
        # namespace (a new Tangram per epoch, a re-run notebook cell) was exported beside the first,
        # stale one, which it also kept alive. The newest replaces it.
        key = (id(self.registry), namespace)
        old = _EXPORTERS.get(key)
        if old is not None:
            with contextlib.suppress(KeyError):
                self.registry.unregister(old)
        _EXPORTERS[key] = self
        self.registry.register(self)

    def bind(self, source: Any) -> None:
        """Read gauges from ``source.statistics()`` (a Tangram or a Scheduler)."""
        self._stats = source.statistics
        pool = getattr(source, "pool", None)
        self._busy = CpuBusy(pool.cpus) if pool is not None and pool.cpus else None

    def __call__(self, events: Sequence[Event], now: float, decisions: Sequence[Decision]) -> None:
        self.live(events, now, decisions)
        for ev in events:
            self.events.labels(type(ev).__name__).inc()
            if isinstance(ev, Submitted):
                self._sub[ev.action_id] = (ev.spec.kind, now)
            elif isinstance(ev, Released):
                got = self._sub.pop(ev.action_id, None)
                if got is not None and not ev.failed:
                    self.act.labels(got[0]).observe(now - got[1])
            elif isinstance(ev, Cancelled):
                self._sub.pop(ev.action_id, None)
        for d in decisions:
            self.decisions.labels(type(d).__name__).inc()

    def describe(self) -> list[Any]:
        return []  # dynamic: avoid calling statistics() at registration time

    def collect(self) -> Any:
        yield from self.events.collect()
        yield from self.decisions.collect()
        yield from self.act.collect()
        yield from self._collect_live()
        if self._stats is None:
            return
        s = self._stats()
        ns = self.namespace
        G = self._gauge
        res = G(f"{ns}_resource_units", "Units per resource and state", labels=["resource", "state"])
        for r in ("cpus", "gpus"):  # the placed kinds
            total, free = s.get(f"{r}_total"), s.get(f"{r}_free")
            if total is None or free is None:
                continue
            res.add_metric([r, "free"], free)
            res.add_metric([r, "used"], total - free)
        for r, c in (s.get("counted") or {}).items():  # memory (when counted) and declared resources
            res.add_metric([r, "free"], c["free"])
            res.add_metric([r, "used"], c["used"])
        for name, q in (s.get("quotas") or {}).items():
            res.add_metric([f"quota:{name}", "used"], q.get("used", 0))
            if q.get("concurrency") is not None:
                res.add_metric([f"quota:{name}", "free"], q["concurrency"] - q.get("used", 0))
        yield res
        for key, help_ in (("running", "Actions holding resources"), ("queued", "Actions waiting")):
            g = G(f"{ns}_{key}", help_)
            g.add_metric([], s.get(key, 0) or 0)
            yield g
        if "fallback_dop" in s:  # a pool with an elastic CPU kind: is it sized elastically now?
            g = G(f"{ns}_fallback_dop", "The fixed DoP the fallback holds the pool's elastic CPU kind at while "
                  "elastic sizing is measurably behind it on this stream (0: sized elastically)")
            g.add_metric([], s.get("fallback_dop") or 0)
            yield g
        c = self._counter(f"{ns}_completed", "Actions completed")
        c.add_metric([], s.get("completed", 0) or 0)
        yield c
        for key, help_ in (("mean_act_s", "Mean action completion time, seconds"),
                           ("mean_queue_s", "Mean queueing time, seconds"),
                           ("mean_exec_s", "Mean execution time, seconds")):
            v = s.get(key)
            if v is not None:
                g = G(f"{ns}_{key.replace('_s', '_seconds')}", help_)
                g.add_metric([], v)
                yield g

    def _collect_live(self) -> Any:
        ns, G, C = self.namespace, self._gauge, self._counter
        snap = self.live.snapshot()
        q = G(f"{ns}_queued_by_kind", "Actions waiting, per action kind", labels=["kind"])
        r = G(f"{ns}_running_by_kind", "Actions holding resources, per action kind", labels=["kind"])
        w = G(f"{ns}_oldest_wait_seconds", "Wait of the oldest queued action, per action kind", labels=["kind"])
        for kind, k in sorted(snap["kinds"].items()):
            q.add_metric([kind], k["queued"])
            r.add_metric([kind], k["running"])
            w.add_metric([kind], k["oldest_wait_s"])
        yield from (q, r, w)
        part = G(f"{ns}_act_part_seconds", "Mean ACT of completed actions, split into queue, overhead "
                 "(GPU restores) and execution", labels=["part"])
        for key, name in (("queue_s", "queue"), ("overhead_s", "overhead"), ("exec_s", "execution")):
            if snap["act"][key] is not None:
                part.add_metric([name], snap["act"][key])
        yield part
        rs = C(f"{ns}_service_restores", "GPU service restores", labels=["service"])
        ev = C(f"{ns}_service_evictions", "GPU service evictions", labels=["service"])
        rsec = C(f"{ns}_service_restore_seconds", "Seconds spent restoring, per GPU service", labels=["service"])
        for svc, v in snap["services"].items():
            rs.add_metric([svc], v["restores"])
            ev.add_metric([svc], v["evictions"])
            rsec.add_metric([svc], v["restore_s"])
        yield from (rs, ev, rsec)
        busy = self._busy.sample() if self._busy is not None else None
        if busy is not None:
            b = G(f"{ns}_resource_busy_units", "Units the OS saw busy since the previous scrape "
                  "(cpus: cores' worth of busy time per second, from /proc/stat)", labels=["resource"])
            b.add_metric(["cpus"], round(busy, 3))
            yield b

    def unregister(self) -> None:
        self.registry.unregister(self)
