"""Parse and format Linux cpuset lists ("0-3,8,10-11"): the one format cgroups, Docker and users share."""

from __future__ import annotations

from collections.abc import Iterable

from .errors import SpecError

_MAX_CPU = 1 << 16  # far above any real machine; bounds the work a hostile string can cause


def parse_cpuset(text: str) -> tuple[int, ...]:
    """Return the sorted, de-duplicated core ids in a cpuset list; raise SpecError on anything else."""
    if not isinstance(text, str):
        raise SpecError(f"cpuset must be a string like '0-7,16', got {type(text).__name__}")
    out: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return ()
    for part in stripped.split(","):
        part = part.strip()
        lo_s, sep, hi_s = part.partition("-")
        try:
            lo = _cpu_id(lo_s)
            hi = _cpu_id(hi_s) if sep else lo
        except ValueError:
            raise SpecError(f"bad cpuset element {part!r} in {text!r}") from None
        if hi < lo:
            raise SpecError(f"descending range {part!r} in cpuset {text!r}")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))


def _cpu_id(s: str) -> int:
    s = s.strip()
    if not s.isascii() or not s.isdigit():
        raise ValueError(s)
    value = int(s)
    if value >= _MAX_CPU:
        raise ValueError(s)
    return value


def format_cpuset(cpus: Iterable[int]) -> str:
    """Format core ids compactly as ranges, the inverse of :func:`parse_cpuset`."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)
