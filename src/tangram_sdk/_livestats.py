"""What a person watching a running pool wants that ``statistics()`` does not keep: per-kind queues
and their oldest wait, ACT split into queueing / overhead / execution, GPU service restores and
evictions, and how busy the pool's cores really are. Fed as a runtime observer; read by
:class:`~tangram_sdk.observe.PrometheusMetrics` (and so by ``tangram top``).

Why an observer and the OS, not the runtime: the events (``Submitted``, grants, ``Released``,
``ServiceResidency`` from the GPU manager) already carry all of it, so nothing on the hot path
changes; "busy" is what the kernel says the pool's cores did (``/proc/stat``), which is the number
that shows an allocated sandbox sitting idle.

Overhead is what the runtime reports as overhead: GPU restores (their seconds come with
``ServiceResidency``). A CPU manager's cpuset/cgroup update is not reported separately and is
counted in execution (grant to release).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from .scheduler.decisions import Decision, Grant, Reject
from .scheduler.events import Cancelled, Event, Released, ServiceResidency, Submitted

__all__ = ["CpuBusy", "LiveStats"]


class CpuBusy:
    """Busy cores among ``cpus`` since the previous :meth:`sample`, from ``/proc/stat`` (Linux)."""

    def __init__(self, cpus: Iterable[int], path: str = "/proc/stat") -> None:
        self.cpus = tuple(cpus)
        self.path = path
        self._last = self._read()

    def _read(self) -> dict[int, tuple[int, int]] | None:
        """core -> (busy jiffies, total jiffies); None where /proc/stat cannot be read."""
        want = set(self.cpus)
        out: dict[int, tuple[int, int]] = {}
        try:
            with open(self.path, encoding="ascii") as f:
                for line in f:
                    if not line.startswith("cpu") or line.startswith("cpu "):
                        continue
                    name, *vals = line.split()
                    core = int(name[3:])
                    if core in want:
                        v = [int(x) for x in vals[:8]]
                        idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
                        out[core] = (sum(v) - idle, sum(v))
        except (OSError, ValueError):
            return None
        return out

    def sample(self) -> float | None:
        """Cores' worth of busy time per second since the last call (0..len(cpus)), or None."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        busy = 0.0
        for core, (b, t) in now.items():
            b0, t0 = last.get(core, (b, t))
            if t > t0:
                busy += (b - b0) / (t - t0)
        return busy


class LiveStats:
    """A runtime observer keeping the live view's numbers. :meth:`snapshot` reads them."""

    def __init__(self) -> None:
        self._kind: dict[int, str] = {}
        self._waiting: dict[int, float] = {}  # action -> submit time (queued, not granted)
        self._running_kind: dict[int, str] = {}
        self._granted: dict[int, float] = {}
        self._submit: dict[int, float] = {}
        self.completed = 0
        self._sum_queue = 0.0
        self._sum_hold = 0.0  # grant -> release
        self.restores: dict[str, int] = {}
        self.evictions: dict[str, int] = {}
        self.restore_s: dict[str, float] = {}
        self._offset = 0.0  # time.monotonic() - observer clock, at the last event

    def __call__(self, events: Sequence[Event], now: float, decisions: Sequence[Decision]) -> None:
        self._offset = time.monotonic() - now
        for ev in events:
            if isinstance(ev, Submitted):
                self._kind[ev.action_id] = ev.spec.kind
                self._waiting[ev.action_id] = now
                self._submit[ev.action_id] = now
            elif isinstance(ev, (Released, Cancelled)):
                aid = ev.action_id
                self._waiting.pop(aid, None)
                self._running_kind.pop(aid, None)
                self._kind.pop(aid, None)
                sub = self._submit.pop(aid, None)
                granted = self._granted.pop(aid, None)
                if isinstance(ev, Released) and not ev.failed and sub is not None and granted is not None:
                    self.completed += 1
                    self._sum_queue += granted - sub
                    self._sum_hold += now - granted
            elif isinstance(ev, ServiceResidency):
                if ev.resident and ev.restore_s is not None:
                    self.restores[ev.service] = self.restores.get(ev.service, 0) + 1
                    self.restore_s[ev.service] = self.restore_s.get(ev.service, 0.0) + ev.restore_s
                elif not ev.resident:
                    self.evictions[ev.service] = self.evictions.get(ev.service, 0) + 1
        for d in decisions:
            aid = d.action_id
            if isinstance(d, Grant):
                if self._waiting.pop(aid, None) is not None:
                    self._granted[aid] = now
                    self._running_kind[aid] = self._kind.get(aid, "?")
            elif isinstance(d, Reject):
                self._waiting.pop(aid, None)
                self._kind.pop(aid, None)
                self._submit.pop(aid, None)

    def snapshot(self) -> dict[str, Any]:
        """``kinds``: per action kind, queued / running / oldest wait (s); ``act``: mean queueing,
        overhead (restores) and execution (s) of completed actions; ``services``: restores,
        evictions and restore seconds per GPU service."""
        now = time.monotonic() - self._offset
        # a Prometheus scrape calls this on its HTTP thread while the loop's observer changes the
        # dicts: iterate copies (dict.copy() runs without letting another thread in), or a scrape
        # fails with "dictionary changed size during iteration"
        waiting, kind_of, running = self._waiting.copy(), self._kind.copy(), self._running_kind.copy()
        restores, evictions, restore_s = self.restores.copy(), self.evictions.copy(), self.restore_s.copy()
        kinds: dict[str, dict[str, Any]] = {}
        for aid, t in waiting.items():
            k = kinds.setdefault(kind_of.get(aid, "?"), {"queued": 0, "running": 0, "oldest_wait_s": 0.0})
            k["queued"] += 1
            k["oldest_wait_s"] = max(k["oldest_wait_s"], now - t)
        for kind in running.values():
            kinds.setdefault(kind, {"queued": 0, "running": 0, "oldest_wait_s": 0.0})["running"] += 1
        n = self.completed
        restore_total = sum(restore_s.values())
        act: dict[str, float | None] = {"queue_s": None, "overhead_s": None, "exec_s": None, "act_s": None}
        if n:
            overhead = restore_total / n
            act = {"queue_s": self._sum_queue / n, "overhead_s": overhead,
                   "exec_s": max(0.0, self._sum_hold / n - overhead),
                   "act_s": (self._sum_queue + self._sum_hold) / n}
        services = {s: {"restores": restores.get(s, 0), "evictions": evictions.get(s, 0),
                        "restore_s": restore_s.get(s, 0.0)}
                    for s in sorted(set(restores) | set(evictions))}
        return {"kinds": kinds, "act": act, "completed": n, "services": services}
