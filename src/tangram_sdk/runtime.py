"""The live runtime: feeds the pure scheduler on the event loop and hands out leases.

Data flow: ``acquire`` submits to the core on the caller's stack; a grant made at once is used
directly, otherwise the waiter awaits a future that a later round (another action's release, or
the timer task for rate-limit tokens) resolves -> the waiter applies the grant through the
managers (in its own task, so a slow Docker call delays only that action) -> the action runs ->
leaving the context parks/evicts (shielded) and releases its units to the core.

Each acquire is one :class:`PendingAcquire` record (``_waiters``), registered from submit until it leaves:
the grant or refusal decided inline, the future a later round resolves, the lease, the managers
applied and the task holding it (which ``aclose`` waits for) all live there.

Cancellation is safe at every ``await``: a waiter that leaves for any reason posts *Cancelled*,
which the core treats as "drop from the queue" or "release the grant", whichever is true by then.

A *Resize* (a running malleable action grown or shrunk by the core) changes the waiter's grant and
its lease at once, in the round; the managers' part follows in one task per lease (``_resizes``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any

from ._alarm import Alarm
from ._closing import wait_for_holders
from ._deadline import check_deadline, check_expected, check_timeout, settle
from ._demand import MISSING, check_spec, shortage
from ._lookups import Lookups
from ._resizes import apply_resize
from ._validate import check_tokens_used
from ._waiters import refusal_error, PendingAcquire
from .errors import RuntimeClosedError, SchedulerBrokenError, SpecError, UsageError
from .lease import Lease
from .managers.base import Manager, ManagerContext
from .options import SchedulerOptions, merge_options
from .pool import Pool
from .scheduler import (Cancelled, Decision, Event, Grant, Observer, Released, Resize, Scheduler, Submitted,
                        ServiceResidency, Tick, TokensUsed)
from .snapshot import RuntimeStatistics
from .spec import ActionSpec

__all__ = ["Tangram", "Observer"]

log = logging.getLogger("tangram_sdk")
_EVENT_TYPES = (Submitted, Released, Cancelled, Tick, ServiceResidency, TokensUsed)


class Tangram:
    """Action-level resource manager for one pool, embedded in the current asyncio loop.

    ::

        async with Tangram(Pool(cpus=8, quotas={"search": Quota(concurrency=4)})) as tangram:
            async with tangram.acquire(ActionSpec(kind="test", cpus=1)) as lease:
                ...

    ``managers`` make grants real (Docker cpusets, GPU restores); without any, grants are pure
    accounting and ``lease.run`` pins local subprocesses. Scheduler options: ``options=``
    :class:`~tangram_sdk.options.SchedulerOptions`, or the same names as keywords (``window``,
    ``depth``, ``elastic``, ``lookahead``, ``default_duration``...), passed to :class:`Scheduler`.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        managers: Iterable[Manager] = (),
        observers: Iterable[Observer] = (),
        batch: bool = True,
        options: SchedulerOptions | None = None,
        **scheduler_options: Any,
    ) -> None:
        if not isinstance(pool, Pool):
            raise SpecError(f"Tangram needs a Pool, got {pool!r}")
        names = sorted(merge_options(options, scheduler_options))  # SpecError: not options, or both ways
        self.pool = pool
        self.managers: tuple[Manager, ...] = tuple(managers)
        for m in self.managers:  # a bare AttributeError at start (or at the first grant) otherwise
            missing = [n for n in ("start", "check", "apply", "release", "aclose") if not callable(getattr(m, n, None))]
            if missing:
                raise SpecError(f"managers must implement the Manager protocol; {m!r} has no {', '.join(missing)}")
        self._lookups = Lookups(self.managers)  # managers' lookups of what a spec names, before it queues
        self.observers: list[Observer] = list(observers)
        for obs in self.observers:  # called on every round: a bad one would break the Tangram there
            if not callable(obs):
                raise SpecError(f"observers must be callables (events, now, decisions), got {obs!r}")
        self._batch = batch
        try:
            self._core = Scheduler(pool, options=options, **scheduler_options)
        except (TypeError, ValueError) as exc:  # an unknown option, or a bad value for one
            raise SpecError(f"scheduler options {names} rejected: {exc}") from exc
        self._ids = itertools.count(1)
        self._waiters: dict[int, PendingAcquire] = {}  # every acquire from submit until it leaves
        self._pending: list[Event] = []
        self._alarm = Alarm()  # the timer on the core's next wake-up (rate-limit tokens)
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._close_done: asyncio.Future[None] | None = None  # set by the first aclose, done when it is
        self._clock: Callable[[], float] = time.monotonic  # the loop's clock, set on entry
        self._checked: dict[int, ActionSpec] = {}  # specs already checked, by identity
        self._state = "new"  # new -> starting -> open -> closed
        self._broken: BaseException | None = None
        self._started_managers: list[Manager] = []
        self._cleanups: set[asyncio.Task[None]] = set()  # manager releases still running
        # set by each leave of a lease granted while managers run (a waiter with a task), while
        # aclose waits for those holders (their exec/call keep working to the end)
        self._managed_left: asyncio.Event | None = None
        # actions whose release a manager could not complete (QuarantineError): their units stay
        # out of the pool until the manager restores the resource
        self._held_back: dict[int, asyncio.Task[None]] = {}
        self._handling = False
        self._resizes = 0  # resizes applied to running leases (managers' resize, then callbacks)
        self._resize_failures = 0  # manager resize calls that raised (the action ran on what it had)

    # ------------------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Tangram:
        return await self.start()

    async def start(self) -> Tangram:
        """Start the managers and the timer task (what ``async with`` does on entry); pair it with
        :meth:`aclose`. Once per Tangram."""
        if self._state != "new":
            raise RuntimeClosedError("a Tangram can be entered once; create a new one")
        self._loop = asyncio.get_running_loop()
        # asyncio's loop.time() is time.monotonic() behind a Python method; call the C function
        # directly when that is what it is (other loops, e.g. uvloop or a virtual clock, keep theirs)
        loop_time = self._loop.time  # looked up on the instance: a patched clock is honoured
        plain = getattr(loop_time, "__func__", None) is asyncio.BaseEventLoop.time
        self._clock = time.monotonic if plain else loop_time
        self._alarm.start(self._loop)
        ctx = ManagerContext(pool=self.pool, post=self._post)
        self._state = "starting"
        try:
            for m in self.managers:
                await m.start(ctx)
                self._started_managers.append(m)
                if self._state == "closed":  # aclose() ran meanwhile: it must not be undone
                    raise RuntimeClosedError("the Tangram was closed while it started")
        except BaseException:
            await self._close_managers()
            self._state = "closed"
            raise
        self._state = "open"
        self._task = self._loop.create_task(self._run(), name="tangram-scheduler")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self, *, cancel_after: float | None = None) -> None:
        """Stop scheduling: queued waiters get RuntimeClosedError at once; actions still holding
        leases finish normally. With managers, those holders are waited for before the managers
        close, so their ``lease.exec``/``lease.call`` keep working to the end; ``cancel_after``
        seconds: cancel the tasks still holding such leases after that long, and wait for their
        cleanup (park, evict). Then the managers close.
        If the caller is cancelled while waiting, those holders are cancelled the same way, the
        managers still close, and CancelledError propagates."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and loop is not self._loop:
            raise UsageError("aclose() was awaited on another event loop than the Tangram's; close it on "
                             "its own loop (from another thread: asyncio.run_coroutine_threadsafe)")
        if self._state == "closed":
            done = self._close_done
            if done is not None and not done.done():
                await asyncio.shield(done)  # a close is under way: return when it has finished
            return
        limit = check_timeout(cancel_after, "cancel_after")
        self._state = "closed"
        self._close_done = loop.create_future()
        try:
            await self._aclose(limit)
        finally:
            self._close_done.set_result(None)

    async def _aclose(self, limit: float | None) -> None:
        closed = RuntimeClosedError("the Tangram was closed while this action was queued")
        for w in self._waiters.values():
            fut = w.fut
            if fut is not None and not fut.done():
                fut.set_exception(closed)
        self._alarm.cancel()
        cancelled = False
        if self._task is not None:
            self._task.cancel()
            cancelled = await settle(self._task)
            if not self._task.cancelled():
                self._task.exception()  # a failure was already reported to waiters (SchedulerBrokenError)
        cancelled |= await self._lookups.end()  # one in flight would reopen a manager's closed connection
        left_event = self._managed_left = asyncio.Event()  # set by each holder's leave
        cancelled = await wait_for_holders(self._waiters, left_event, limit, cancelled)
        cleanups = asyncio.gather(*self._cleanups, return_exceptions=True)
        cancelled |= await settle(cleanups)  # releases in flight finish before managers close
        closing = asyncio.ensure_future(self._close_managers())
        cancelled |= await settle(closing)
        # managers resolve (or fail) what they held back when they close; anything still waiting
        # after that belongs to a manager that forgot: its units no longer matter
        for t in list(self._held_back.values()):
            t.cancel()
        if self._held_back:
            cancelled |= await settle(asyncio.gather(*self._held_back.values(), return_exceptions=True))
        if cancelled:
            raise asyncio.CancelledError

    async def _close_managers(self) -> None:
        for m in reversed(self._started_managers):
            try:
                await m.aclose()
            except Exception:
                log.exception("manager %s failed to close", getattr(m, "name", m))
        self._started_managers.clear()

    # ------------------------------------------------------------------------------ public API
    def acquire(self, spec: ActionSpec, *, timeout: float | None = None,
                deadline: float | None = None, expected_s: float | None = None) -> PendingAcquire:
        """Wait for ``spec``'s resources; an async context manager yielding a :class:`Lease`.

        Raises SpecError / InfeasibleSpecError at once for specs this pool can never serve,
        TimeoutError after ``timeout`` seconds of queueing (counted from the call: a manager's
        lookup before queueing, a container not met yet, is within them), RuntimeClosedError
        when closed.
        ``deadline`` (absolute, on the event loop's clock, ``loop.time()``): DeadlineError at once
        when the scheduler estimates the action cannot start by then, or when it is still queued
        then (the queue drops it; nothing is held). ``expected_s``: your estimate of this action's
        seconds at its minimum units (a length hint: the size of the suite, the last run of the same
        task). An elastic CPU action hinted among its kind's longest (one in a thousand of the
        hints seen) gets more cores and may wait for them, so it does not end the RL step alone.
        """
        # None is the common case, checked inline (the checks are calls on the uncontended path)
        return PendingAcquire(self, spec, check_timeout(timeout) if timeout is not None else None,
                       None if deadline is None else check_deadline(deadline),
                       None if expected_s is None else check_expected(expected_s))

    async def acquire_lease(self, spec: ActionSpec, *, timeout: float | None = None,
                            deadline: float | None = None, expected_s: float | None = None) -> Lease:
        """:meth:`acquire` without the ``async with``: wait for the grant, apply it, return the
        :class:`Lease`; give it back with :meth:`release`. For holds that do not fit one block (a
        sandbox bound to a whole trajectory, an adapter that enters and leaves in different
        calls). The same errors as ``acquire``; whatever happens while waiting, nothing is held
        when this raises."""
        w = PendingAcquire(self, spec, check_timeout(timeout) if timeout is not None else None, check_deadline(deadline),
                    check_expected(expected_s))
        return await w.enter()

    async def release(self, lease: Lease, *, failed: bool = False) -> None:
        """Give back a lease from :meth:`acquire_lease` (what leaving ``async with`` does):
        managers undo their work (even if the caller is cancelled meanwhile), then the units go
        back. ``failed``: the action failed (counted as such). Releasing a lease twice does
        nothing; a lease this Tangram did not grant is a SpecError."""
        w = self._owner(lease)
        if w is not None:
            await w.exit(failed=failed)

    def release_nowait(self, lease: Lease, *, failed: bool = False) -> bool:
        """:meth:`release` without awaiting, when no manager has anything to undo: the units are
        back before this returns True. False, with nothing done, when a manager must run first
        (await :meth:`release` then). The Ray actor releases this way, so a release and the next
        frame are handled in one loop iteration."""
        w = self._owner(lease)
        return True if w is None else w.exit_nowait(failed=failed)

    def _owner(self, lease: Lease) -> PendingAcquire | None:
        if not isinstance(lease, Lease):
            raise SpecError(f"release() needs the Lease acquire_lease() returned, got {type(lease).__name__}")
        w = self._waiters.get(lease.action_id)
        if w is None:
            if lease._granter is not self:  # not "already released": it was never ours
                raise SpecError(f"{lease!r} was not granted by this Tangram")
            return None  # already released
        if w.lease is not lease:
            raise SpecError(f"{lease!r} was not granted by this Tangram (or is not held any more)")
        return w

    def report_tokens(self, lease: Lease, quota: str, used: int) -> None:
        """The call behind ``lease`` really drew ``used`` tokens of weighted quota ``quota`` (its
        spec stated a guess): the bucket is corrected, so later acquires wait for the truth."""
        stated = check_tokens_used(lease.spec.tokens, lease.spec.kind, quota, used)
        if used != stated:
            self._post(TokensUsed(quota, float(used - stated)))

    def statistics(self) -> RuntimeStatistics:
        """A frozen snapshot (see :class:`~tangram_sdk.snapshot.RuntimeStatistics`): free/used per
        resource, running, queued, the core's counters and means; ``quarantined``: finished actions
        whose units a manager still holds back (a container that could not be parked yet) — they
        count as running until the manager restores them. ``.asdict()`` for JSON; ``s["key"]``
        still works."""
        return RuntimeStatistics.from_core(
            self._core.statistics(), state="broken" if self._broken is not None else self._state,
            waiters=len(self._waiters), quarantined=len(self._held_back), resizes=self._resizes,
            resize_failures=self._resize_failures)

    async def astatistics(self) -> RuntimeStatistics:
        """:meth:`statistics`, awaitable: the form a ``RemoteTangram`` also offers, so code written
        against :class:`~tangram_sdk._protocol.AnyTangram` reads either the same way."""
        return self.statistics()

    @property
    def scheduler(self) -> Scheduler:
        """The pure core (read it; do not feed it events behind the runtime's back)."""
        return self._core

    # -- cheap reads (no snapshot built: safe to call from an observer, every round) -------------
    @property
    def running(self) -> int:
        """Actions holding a grant right now."""
        return self._core.running

    @property
    def queued(self) -> int:
        """Actions waiting for a grant right now."""
        return self._core.queued

    @property
    def free_cpus(self) -> int:
        return self._core.ledger.free_cpus

    @property
    def free_gpus(self) -> int:
        return self._core.ledger.free_gpus

    @property
    def free_memory(self) -> int | None:
        """Bytes of pool memory not granted (None: the pool does not count memory)."""
        return self._core.ledger.mem_free

    @property
    def free_counted(self) -> Mapping[str, int]:
        """Free units per counted kind (memory when counted, the pool's declared ``resources``): a
        read-only live view."""
        return MappingProxyType(self._core.ledger.counted_free)

    @property
    def quota_used(self) -> Mapping[str, int]:
        """Units in use per quota (a read-only live view)."""
        return MappingProxyType(self._core.ledger.q_used)

    def feasibility(self, spec: ActionSpec) -> str | None:
        """Why ``spec`` can never be granted by this pool (None: it can be)."""
        if not isinstance(spec, ActionSpec):
            raise SpecError(f"feasibility() needs an ActionSpec, got {type(spec).__name__}")
        return self._core.feasibility(spec)

    def check_invariants(self) -> None:
        """AssertionError when the core's ledger disagrees with its grants (tests, ``check_invariants``
        deployments)."""
        self._core.check_invariants()

    def post(self, ev: Event) -> None:
        """Feed an event to the core (what :class:`ManagerContext`'s ``post`` does): e.g. a
        ServiceResidency a node agent reported. Ignored once the Tangram is closed."""
        if type(ev) not in _EVENT_TYPES:  # a wrong object would break the scheduler task on its round
            raise SpecError(f"post() takes a scheduler event ({', '.join(t.__name__ for t in _EVENT_TYPES)}), "
                            f"got {type(ev).__name__}")
        self._post(ev)

    def __repr__(self) -> str:
        core = self._core
        state = "" if self._state == "open" and self._broken is None else f" [{self.statistics().state}]"
        return f"<Tangram {core.ledger.usage() or 'empty pool'} | {core.running} running, {core.queued} queued{state}>"

    # ------------------------------------------------------------------------------ internals
    def shortage(self, spec: ActionSpec) -> str:
        """``waited for 2 cpus + api x1 (cpus 0/4 free, api 1/1 used, 3 queued)``."""
        return shortage(self._core, self.pool, spec)

    def _post(self, ev: Event, now: float | None = None) -> None:
        """Feed an event to the core now, on the caller's stack (no await: decide, then act).

        Handling inline instead of hopping to the scheduler task saves two task switches per
        acquire; events posted while a round is being dispatched (re-entrancy) are queued and
        handled right after it, in order. The scheduler task only serves timers (rate-limit
        tokens) and wake-ups, so every decision is still made on the event loop's thread.
        """
        if self._state != "open" or self._broken is not None:
            self._after_close(ev)
            return
        if self._handling:
            self._pending.append(ev)
            return
        self._handling = True
        try:
            if now is None:
                now = self._clock()
            self._dispatch((ev,), now, self._core.handle(ev, now))
            self._settle_round()
        except BaseException as exc:
            self._die(exc)
        finally:
            self._handling = False

    # The two hot paths, ``Submitted`` and ``Released`` without building the event (the core's
    # direct methods), unless someone needs the event object (an observer, the re-entrant queue).
    def _submitted(self, aid: int, spec: ActionSpec, now: float) -> None:
        if self._state != "open" or self._broken is not None:
            return
        if self._handling or self.observers:
            self._post(Submitted(aid, spec), now)
            return
        self._handling = True
        try:
            decisions = self._core.submit(aid, spec, now)
            if decisions or self.observers:  # an arrival that queues decides nothing
                self._dispatch((), now, decisions)
            if self._pending or self._core.next_wakeup != self._alarm.at:  # _settle_round, inline
                self._settle_round()
        except BaseException as exc:
            self._die(exc)
        finally:
            self._handling = False

    def _released(self, aid: int, failed: bool, parallelism: float | None = None) -> None:
        if self._state != "open" or self._broken is not None:
            self._after_close(Released(aid, failed=failed, parallelism=parallelism))
            return
        if self._handling or self.observers:
            self._post(Released(aid, failed=failed, parallelism=parallelism))
            return
        self._handling = True
        try:
            now = self._clock()
            decisions = self._core.release(aid, now, failed=failed, parallelism=parallelism)
            if decisions or self.observers:  # a release with nothing queued decides nothing
                self._dispatch((), now, decisions)
            if self._pending or self._core.next_wakeup != self._alarm.at:  # _settle_round, inline
                self._settle_round()
        except BaseException as exc:
            self._die(exc)
        finally:
            self._handling = False

    def _after_close(self, ev: Event) -> None:
        """A holder leaving (or a waiter dropping out) after the Tangram closed: the core still
        records it, so statistics() shows the units back; nothing is granted any more (each
        waiter still queued at the close leaves with RuntimeClosedError, its Cancelled applied
        here too), so the decisions are dropped. Before the start, or once broken, the core is
        not fed."""
        if self._state != "closed" or self._broken is not None or type(ev) not in (Released, Cancelled):
            return
        now = self._clock()
        try:
            self._core.handle(ev, now)
        except KeyError:  # an id the core no longer knows (released before the close): nothing to do
            return
        for obs in self.observers:  # metrics and timelines see the action leave too (no decisions)
            obs((ev,), now, ())

    def _settle_round(self) -> None:
        """After a round: handle what it queued, and keep the timer on the core's next wake-up."""
        if self._pending:
            self._drain()
        elif self._core.next_wakeup != self._alarm.at:
            self._alarm.arm(self._core.next_wakeup)

    def _die(self, exc: BaseException) -> None:
        self._break(exc)
        if self._task is not None:
            self._task.cancel()

    def _drain(self) -> None:
        core = self._core
        while self._pending:
            events, self._pending = self._pending, []
            now = self._clock()
            if self._batch:
                self._dispatch(events, now, core.handle_many(events, now))
            else:
                for ev in events:
                    self._dispatch((ev,), now, core.handle(ev, now))
        self._alarm.arm(core.next_wakeup)

    async def _run(self) -> None:
        """Serve timer wake-ups: a rate-limited quota's next token, then a Tick round."""
        wake = self._alarm.wake
        assert wake is not None
        while True:
            await wake.wait()
            wake.clear()
            self._post(Tick())
            if self._broken is not None:
                return

    def _dispatch(self, events: Sequence[Event], now: float, decisions: Sequence[Decision]) -> None:
        if not decisions and not self.observers:
            return
        waiters = self._waiters
        for d in decisions:
            aid = d.action_id
            w = waiters.get(aid)
            if isinstance(d, Resize):
                if w is not None:  # unknown or finished: nothing runs to resize
                    apply_resize(w, d)
                continue
            fut = None if w is None else w.fut
            if fut is None:
                if w is not None and w.inline:  # decided while its acquire() is still on the stack
                    if isinstance(d, Grant):
                        w.grant = d
                    else:
                        del waiters[aid]
                        w.error = refusal_error(d)
                elif isinstance(d, Grant):  # the waiter left before the grant: give it back
                    self._pending.append(Cancelled(aid))
            elif isinstance(d, Grant):
                if fut.done():  # cancelled/timed out between grant and wake-up
                    self._pending.append(Cancelled(aid))
                else:
                    fut.set_result(d)
            elif not fut.done():
                fut.set_exception(refusal_error(d))
        for obs in self.observers:
            obs(events, now, decisions)

    def _break(self, exc: BaseException) -> None:
        self._broken = exc
        log.error("tangram scheduler died: %r", exc)
        for aid, w in list(self._waiters.items()):
            fut = w.fut
            if w.inline or (fut is not None and not fut.done()):
                err = SchedulerBrokenError(f"the scheduler task died: {exc!r}")
                err.__cause__ = exc
                if fut is not None:
                    fut.set_exception(err)
                else:  # broke while this action's acquire() is on the stack
                    del self._waiters[aid]
                    w.error = err

    def _hold_back(self, w: PendingAcquire, failed: bool, until: list[Any]) -> None:
        """The waiter has left, but its units return only once every ``until`` (a manager's
        re-park...) has resolved; until then they count as ``quarantined``."""
        aid = w.aid
        par = None if w.lease is None else w.lease.parallelism
        self._forget(w)

        async def later() -> None:
            try:
                await asyncio.gather(*until, return_exceptions=True)
            finally:
                self._held_back.pop(aid, None)
                self._released(aid, failed, par)

        self._held_back[aid] = asyncio.get_running_loop().create_task(later(), name=f"tangram-held-back-{aid}")

    def _track(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A manager release in flight: closing the Tangram waits for it."""
        task = asyncio.ensure_future(coro)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        return task

    def _ensure_open(self) -> None:
        if self._broken is not None:
            raise SchedulerBrokenError(f"the scheduler task died: {self._broken!r}") from self._broken
        if self._state != "open":
            raise RuntimeClosedError(
                "this Tangram is not running; use `async with Tangram(pool) as tangram:`"
                if self._state in ("new", "starting") else "this Tangram has been closed"
            )

    def _submit(self, w: PendingAcquire, now: float) -> Grant | asyncio.Future[Grant]:
        """Register ``w`` and submit its spec: the grant when the core made it inline (the
        uncontended fast path: no future is created), else the future a later round resolves."""
        spec = w.spec
        if self.managers or self._checked.get(id(spec), MISSING) is not spec:  # check_spec's cache, inline
            check_spec(self._core, self.managers, self._checked, spec)
        aid = w.aid = next(self._ids)
        self._waiters[aid] = w
        w.inline = True  # decisions for it are stored on the record while we are on the stack
        if w.deadline is None and w.expected is None:
            self._submitted(aid, spec, now)
        else:
            self._post(Submitted(aid, spec, w.deadline, w.expected), now)
        w.inline = False
        if w.grant is not None:
            return w.grant
        assert self._loop is not None
        fut: asyncio.Future[Grant] = self._loop.create_future()
        if aid in self._waiters:  # still queued (not rejected/broken while posting)
            w.fut = fut
        else:
            fut.set_exception(w.error if w.error is not None else RuntimeClosedError("the Tangram closed"))
        return fut

    def _forget(self, w: PendingAcquire) -> None:
        """``w`` is no longer held by its task (aclose may stop waiting for it)."""
        if self._waiters.pop(w.aid, None) is not None and w.task is not None and self._managed_left is not None:
            self._managed_left.set()

    def _leave(self, w: PendingAcquire, *, failed: bool, granted: bool) -> None:
        """The waiter is done (released, cancelled, or failed to apply): forget it, and return
        its units (``granted``) or drop it from the queue."""
        if self._waiters.pop(w.aid, None) is not None and w.task is not None and self._managed_left is not None:
            self._managed_left.set()  # inline _forget: this is the hot path
        if granted:
            lease = w.lease  # its measured parallelism, read inline: most leases ran no command
            self._released(w.aid, failed, None if lease is None or not lease._run_s else lease.parallelism)
        else:
            self._post(Cancelled(w.aid))
