"""Outputs of the scheduling core: what to hand to whom. The runtime and simulator only execute them.

``Grant`` is the one object built for every action, twice per round trip's worth of work, so it
is an immutable *typed tuple* rather than a frozen attrs class: a frozen attrs ``__init__`` sets
each field through ``object.__setattr__`` and costs about twice as much, which was ~10% of an
uncontended acquire. Equality stays by type and value (a Grant never equals a Reject or a plain
tuple with the same fields), so decision logs compare as before.
"""

from __future__ import annotations

from typing import NamedTuple, Union

__all__ = ["Decision", "Grant", "Reject", "Resize"]


class Grant(NamedTuple):
    """Hand ``action_id`` these concrete cores and GPUs, ``units`` of its elastic resource (0 when
    not elastic), ``memory`` bytes and quota units. ``restore`` is True when the action's GPU service
    is not known to be resident on ``gpus`` (the manager must restore it first). ``tokens`` are drawn
    from weighted quotas (spent, not returned). ``counted``: the ``(name, units)`` taken from the
    pool's counted kinds (:mod:`tangram_sdk.resources`), sorted by name: the spec's ``needs``, plus
    ``memory`` when the pool counts memory. ``memory`` stays what the spec declared (the limit a
    manager enforces, also on a pool that does not count memory)."""

    action_id: int
    cpus: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    units: int = 0
    memory: int = 0
    quotas: tuple[tuple[str, int], ...] = ()
    restore: bool = False
    tokens: tuple[tuple[str, int], ...] = ()
    counted: tuple[tuple[str, int], ...] = ()

    def __repr__(self) -> str:
        """The namedtuple repr, leaving ``counted`` out when it says no more than ``memory=``
        does (empty, or just the memory bytes): decision logs hash this text, so a grant of no
        declared resource prints exactly as before ``counted`` existed."""
        c = self.counted
        tail = "" if not c or c == (("memory", self.memory),) else f", counted={c!r}"
        return (f"Grant(action_id={self.action_id!r}, cpus={self.cpus!r}, gpus={self.gpus!r}, "
                f"units={self.units!r}, memory={self.memory!r}, quotas={self.quotas!r}, "
                f"restore={self.restore!r}, tokens={self.tokens!r}{tail})")

    def __eq__(self, other: object) -> bool:
        return type(other) is Grant and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return tuple.__hash__(self)


class Reject(NamedTuple):
    """``action_id`` will not be granted: ``code`` "infeasible" (this pool can never serve it;
    ``reason`` says which demand is too large) or "deadline" (it cannot start, or did not start,
    before the deadline it was submitted with)."""

    action_id: int
    reason: str
    code: str = "infeasible"

    def __eq__(self, other: object) -> bool:
        return type(other) is Reject and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return tuple.__hash__(self)


class Resize(NamedTuple):
    """Running *malleable* action ``action_id`` now holds ``cpus`` (``units`` of its elastic CPU):
    grown into cores that sit idle while it runs long, or shrunk back to the size it was admitted
    at when others wait. The runtime applies it to the running work (managers' ``resize``, the
    lease's ``cpus``/``units``); what the action releases later is what it holds then."""

    action_id: int
    cpus: tuple[int, ...]
    units: int

    def __eq__(self, other: object) -> bool:
        return type(other) is Resize and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return tuple.__hash__(self)


Decision = Union[Grant, Reject, Resize]
