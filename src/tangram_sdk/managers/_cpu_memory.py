"""The memory half of DockerCpuManager's per-container record, as plain functions of it: the
limit the live grants add up to, the error for a limit a container cannot meet, and the per-kind
peaks learnt from actions that had their container to themselves.

Why apart from cpu.py: these only decide and measure; they never call the daemon. Setting a limit
(``_settle_memory``, ``_set_memory``) stays on the manager, which owns the client, the backend
choice and the counters, so cpu.py reads as the grant/park/quarantine protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ActionOOMError
from ._cgroup import MemoryLimits

if TYPE_CHECKING:
    from .cpu import _Box

MAX_KINDS = 256  # per-kind memory peaks kept (least recently updated dropped first)


def mib(n: int | None) -> str:
    """Bytes for a message, in MiB (None: "unknown")."""
    return "unknown" if n is None else f"{n / 2**20:.1f} MiB"


def memory_target(box: _Box) -> MemoryLimits | None:
    """What the live grants say: the sum of their memory (no swap), or None (parked limit)
    when there is no grant or one of them declared no memory."""
    if not box.active:
        return None
    amounts = [box.mem.get(a, 0) for a in box.active]
    if not amounts or min(amounts) <= 0:
        return None
    total = sum(amounts)
    return MemoryLimits(total, total)


def limit_refused(box: _Box, want: MemoryLimits, usage: int | None) -> ActionOOMError:
    """The error for a limit the container already exceeds: killed=False, nothing was changed."""
    held = "" if usage is None or usage < 0 else f" (it holds {mib(usage)} it cannot free)"
    return ActionOOMError(
        f"container {box.id[:12]}: cannot set its memory limit to {mib(want.memory)}: it already "
        f"uses more{held}; processes or tmpfs files left by earlier actions count against the limit",
        resource=box.id, limit=want.memory, peak=usage, killed=False)


def watch_peak(box: _Box) -> None:
    """Start measuring the container's peak (cgroup backend only: one write)."""
    if box.peak is not None:
        box.peak.close()
        box.peak = None
    box.shared = False
    cg = box.cgroup
    if box.backend == "cgroup" and cg is not None and cg.memory is not None:
        box.peak = cg.memory.watch_peak()


def learn_peak(peaks: dict[str, dict[str, int]], box: _Box, kind: str, declared: int) -> None:
    """Record the action's peak for its kind (when it had the container to itself)."""
    if box.peak is None:
        return
    if not box.shared and box.peak.since_reset:
        peak = box.peak.read()
        if peak is not None:
            entry = peaks.pop(kind, None) or {"max": 0, "last": 0, "n": 0, "declared": 0}
            entry["max"] = max(entry["max"], peak)
            entry["last"] = peak
            entry["n"] += 1
            entry["declared"] = declared
            peaks[kind] = entry  # re-inserted: most recently updated last
            while len(peaks) > MAX_KINDS:
                peaks.pop(next(iter(peaks)))
    if not box.active:
        box.peak.close()
        box.peak = None
