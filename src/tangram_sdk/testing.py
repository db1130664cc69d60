"""Test doubles for code that runs under a Tangram, and for people writing their own managers.

:class:`FakeManager` is a real :class:`~tangram_sdk.managers.Manager` that changes nothing in the
world: it records every call, can take its time (so cancels land inside ``apply``/``release``),
fails where you tell it to, and attaches handles. Use it to check that *your* code returns what it
holds when a manager misbehaves, or as the neighbour of the manager you are testing::

    from tangram_sdk.testing import FakeManager

    slow = FakeManager("slow", release_delay=0.05)
    bad = FakeManager("bad").fail("apply", OSError("device on fire"), kind="boom")
    async with Tangram(Pool(cpus=2), managers=[slow, bad]) as t:
        with pytest.raises(ManagerError):
            async with t.acquire(ActionSpec(kind="boom", cpus=1)):
                ...
    assert slow.holding == set() and bad.released == bad.applied  # every begun apply was released

``journal=path`` appends each call as a JSON line, for managers that run in another process (a Ray
node agent): read it back with :meth:`FakeManager.read_journal`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from .managers.base import BaseManager, ManagerContext, Offer

if TYPE_CHECKING:
    from .lease import Lease
    from .scheduler.decisions import Grant
    from .spec import ActionSpec

__all__ = ["Call", "FakeManager"]

Method = Literal["start", "check", "apply", "release", "resize", "aclose"]
_METHODS = ("start", "check", "apply", "release", "resize", "aclose")
ErrorSource = BaseException | Callable[[], BaseException]


@attrs.frozen
class Call:
    """One call a :class:`FakeManager` received: ``outcome`` is ``"ok"``, ``"cancelled"`` or the
    ``repr`` of what it raised."""

    manager: str
    method: str
    action_id: int | None = None
    kind: str | None = None
    outcome: str = "ok"


@attrs.define
class _Fault:
    method: str
    error: ErrorSource
    kind: str | None
    times: int | None

    def fires(self, method: str, kind: str | None) -> bool:
        return method == self.method and (self.kind is None or self.kind == kind) and self.times != 0

    def take(self) -> BaseException:
        if self.times is not None:
            self.times -= 1
        err = self.error
        return err if isinstance(err, BaseException) else err()


class FakeManager(BaseManager):
    """A recording, fault-injecting manager (see the module docstring).

    ``apply_delay`` / ``release_delay``: seconds each call awaits before it does anything (0 still
    yields once, like a real manager's I/O). ``attach``: lease handles set on every apply (e.g.
    ``{"exec": fn}``). ``offer``: what :meth:`describe` declares. ``journal``: a file each call is
    appended to as one JSON line. ``resize_delay``: seconds each ``resize`` awaits.

    What it counts: ``applied`` (applies begun), ``released`` (releases finished), ``holding``
    (action ids whose apply began and whose release has not finished), ``calls`` (every call, in
    order, as :class:`Call`), ``resized`` (``(action_id, old cpus, new cpus)`` per resize that
    finished), ``cpus`` (the cores each held action has, as apply and resize said)."""

    def __init__(
        self,
        name: str = "fake",
        *,
        apply_delay: float = 0.0,
        release_delay: float = 0.0,
        attach: Mapping[str, Any] | None = None,
        offer: Offer | None = None,
        journal: str | os.PathLike[str] | None = None,
        resize_delay: float = 0.0,
    ) -> None:
        self.name = name
        self.apply_delay = apply_delay
        self.release_delay = release_delay
        self.attachments = dict(attach or {})
        self.offer = offer if offer is not None else Offer()
        self.journal = None if journal is None else os.fspath(journal)
        self.calls: list[Call] = []
        self.applied = 0
        self.released = 0
        self.holding: set[int] = set()
        self.resize_delay = resize_delay
        self.resized: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
        self.cpus: dict[int, tuple[int, ...]] = {}
        self.ctx: ManagerContext | None = None
        self._faults: list[_Fault] = []

    def fail(self, method: Method, error: ErrorSource, *, kind: str | None = None,
             times: int | None = None) -> FakeManager:
        """Make ``method`` raise ``error`` (an exception, or a zero-argument callable making one,
        e.g. a QuarantineError whose ``until`` future must belong to the running loop), for specs
        of ``kind`` (None: any), ``times`` times (None: always). ``apply``/``release`` raise after
        their delay, i.e. half-way (``resize`` too). Returns the manager, so calls chain."""
        if method not in _METHODS:
            raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
        self._faults.append(_Fault(method, error, kind, times))
        return self

    # -- what tests read --------------------------------------------------------------------
    def calls_to(self, method: Method) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def statistics(self) -> dict[str, Any]:
        return {"applied": self.applied, "released": self.released, "holding": sorted(self.holding),
                "calls": len(self.calls)}

    @staticmethod
    def read_journal(path: str | os.PathLike[str]) -> list[Call]:
        """The calls a FakeManager with ``journal=path`` recorded (in any process), in order."""
        try:
            with open(path, encoding="utf-8") as f:
                return [Call(**json.loads(line)) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    # -- the Manager protocol ---------------------------------------------------------------
    async def start(self, ctx: ManagerContext) -> None:
        self.ctx = ctx
        self._maybe_fail("start", None, None)
        self._record("start", None, None, "ok")

    def check(self, spec: ActionSpec) -> None:
        self._maybe_fail("check", None, spec.kind)
        self._record("check", None, spec.kind, "ok")

    async def apply(self, grant: Grant, lease: Lease) -> None:
        aid, kind = lease.action_id, lease.spec.kind
        self.applied += 1
        self.holding.add(aid)
        self.cpus[aid] = tuple(grant.cpus)
        try:
            await asyncio.sleep(self.apply_delay)
            self._raise_if("apply", kind)
            for key, value in self.attachments.items():
                lease.attach(key, value)
        except BaseException as exc:
            self._record("apply", aid, kind, _outcome(exc))
            raise
        self._record("apply", aid, kind, "ok")

    async def release(self, grant: Grant, lease: Lease) -> None:
        aid, kind = lease.action_id, lease.spec.kind
        try:
            await asyncio.sleep(self.release_delay)
            self._raise_if("release", kind)
        except BaseException as exc:
            self._record("release", aid, kind, _outcome(exc))
            raise
        finally:
            self.holding.discard(aid)
            self.cpus.pop(aid, None)
            self.released += 1
        self._record("release", aid, kind, "ok")

    async def resize(self, old: Grant, new: Grant, lease: Lease) -> None:
        aid, kind = lease.action_id, lease.spec.kind
        try:
            await asyncio.sleep(self.resize_delay)
            self._raise_if("resize", kind)
        except BaseException as exc:
            self._record("resize", aid, kind, _outcome(exc))
            raise
        if aid in self.holding:
            self.cpus[aid] = tuple(new.cpus)
        self.resized.append((aid, tuple(old.cpus), tuple(new.cpus)))
        self._record("resize", aid, kind, "ok")

    async def aclose(self) -> None:
        self._maybe_fail("aclose", None, None)
        self._record("aclose", None, None, "ok")

    def describe(self) -> Offer:
        return self.offer

    # -- internals --------------------------------------------------------------------------
    def _raise_if(self, method: str, kind: str | None) -> None:
        for f in self._faults:
            if f.fires(method, kind):
                raise f.take()

    def _maybe_fail(self, method: str, aid: int | None, kind: str | None) -> None:
        try:
            self._raise_if(method, kind)
        except BaseException as exc:
            self._record(method, aid, kind, _outcome(exc))
            raise

    def _record(self, method: str, aid: int | None, kind: str | None, outcome: str) -> None:
        call = Call(self.name, method, aid, kind, outcome)
        self.calls.append(call)
        if self.journal is not None:
            with open(self.journal, "a", encoding="utf-8") as f:
                f.write(json.dumps(attrs.asdict(call)) + "\n")

    def __repr__(self) -> str:
        return f"<FakeManager {self.name!r} applied={self.applied} released={self.released} holding={len(self.holding)}>"


def _outcome(exc: BaseException) -> str:
    return "cancelled" if isinstance(exc, asyncio.CancelledError) else repr(exc)
