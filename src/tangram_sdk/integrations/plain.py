"""Framework-free adapters: a drop-in for ``async with SEMAPHORE:`` and a blocking API for threads.

Why: most rollout code limits its environment actions with a global ``asyncio.Semaphore(N)``
(a fixed degree of parallelism, the baseline the paper beats). :class:`Guard` keeps that exact
shape -- ``async with guard:`` -- but each entry acquires an ActionSpec from the Tangram, so the
limit becomes "what the pool can give now" and elastic actions get more cores when they are free.

Frameworks that run ``env.step`` in worker threads (thread pools, gym vector envs) cannot await;
:class:`SyncTangram` runs the acquire on the Tangram's loop from the thread and hands back a plain
context manager. The whole ``async with acquire`` lives in one task on the loop, so enter and
exit run in the same task, and the lease is released on every way out of the ``with`` block.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from types import TracebackType
from typing import Any

import attrs

from .._deadline import check_expected
from ..errors import RuntimeClosedError, SpecError
from ..lease import Lease
from ..pool import Pool
from .._protocol import AnyTangram
from ..runtime import Tangram
from ..spec import ActionSpec
from ._host import RuntimeSource, _reset_lease, _set_lease, resolve_runtime, runtime_source

__all__ = ["Guard", "SyncTangram"]

SpecSource = ActionSpec | Callable[[], ActionSpec]


class Guard:
    """``async with guard:`` like a semaphore, but each entry acquires ``spec`` from a Tangram.

    ``spec`` is an ActionSpec or a zero-argument callable evaluated at each entry (a derived
    spec). ``guard(cpus=4)`` is a one-off variant with some fields changed. One Guard may be
    entered by many tasks at once and re-entered in one task: the open acquisitions are kept per
    task in a context variable, innermost last. ``guard.lease`` is the current task's lease.
    """

    def __init__(
        self,
        spec: SpecSource,
        *,
        runtime: RuntimeSource | None = None,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(spec, ActionSpec) and not callable(spec):
            raise SpecError(f"Guard needs an ActionSpec or a callable returning one, got {spec!r}")
        self._spec = spec
        self._runtime = runtime_source(runtime, where="Guard(runtime=)")
        self._timeout = timeout
        self._stack: ContextVar[tuple[tuple[contextlib.AsyncExitStack, Lease, Any], ...]] = ContextVar(f"guard-{id(self)}", default=())

    def __call__(self, **changes: Any) -> Guard:
        """A Guard for the same runtime with ``attrs.evolve(spec, **changes)``."""
        return Guard(lambda: attrs.evolve(self.spec(), **changes), runtime=self._runtime, timeout=self._timeout)

    def spec(self) -> ActionSpec:
        spec = self._spec() if callable(self._spec) and not isinstance(self._spec, ActionSpec) else self._spec
        if not isinstance(spec, ActionSpec):
            raise SpecError(f"the Guard's spec callable returned {spec!r}, not an ActionSpec")
        return spec

    @property
    def lease(self) -> Lease | None:
        stack = self._stack.get()
        return stack[-1][1] if stack else None

    async def __aenter__(self) -> Lease:
        tangram = await resolve_runtime(self._runtime)
        held = contextlib.AsyncExitStack()  # the acquire's own context, left in __aexit__ (any handle fits)
        lease = await held.enter_async_context(tangram.acquire(self.spec(), timeout=self._timeout))
        self._stack.set((*self._stack.get(), (held, lease, _set_lease(lease))))
        return lease

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        stack = self._stack.get()
        held, _lease, token = stack[-1]
        self._stack.set(stack[:-1])
        _reset_lease(token)
        return await held.__aexit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        spec = self._spec if isinstance(self._spec, ActionSpec) else "<derived>"
        return f"<Guard {spec!r} held={len(self._stack.get())}>"


class _ThreadActionFailed(Exception):
    """Raised inside the holder task so the runtime records a failed action."""


_SLICE = 0.25  # seconds a blocked thread waits before checking that the loop still runs


class SyncTangram:
    """Blocking access to a Tangram (or a RemoteTangram) from threads that are not its event loop.

    ``SyncTangram(tangram)`` must be built on the Tangram's loop (it remembers it), or given
    ``loop=``. ``SyncTangram.start(pool, ...)`` instead runs a new Tangram on a private loop
    thread, for fully synchronous programs; ``close()`` stops it.

    ``with sync.acquire(spec, timeout=None) as lease:`` blocks the calling thread until granted.
    Calling it on the loop's own thread would deadlock, so that raises RuntimeError.
    """

    def __init__(self, tangram: AnyTangram, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if not callable(getattr(tangram, "acquire", None)):
            raise SpecError(f"SyncTangram needs a Tangram (or a RemoteTangram), got {type(tangram).__name__}")
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError(
                    "SyncTangram(tangram) must be created on the Tangram's event loop, or given loop="
                ) from None
        self.tangram = tangram
        self.loop = loop
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._holds: set[asyncio.Task[Any]] = set()  # threads' leases held on the loop (close waits)

    # -- a private loop thread, for programs with no event loop at all -------------------------
    @classmethod
    def start(cls, pool: Pool, **tangram_options: Any) -> SyncTangram:
        """Start ``Tangram(pool, **tangram_options)`` on a daemon loop thread and return its handle."""
        loop = asyncio.new_event_loop()
        ready: concurrent.futures.Future[SyncTangram] = concurrent.futures.Future()

        async def host() -> None:
            try:
                tangram = Tangram(pool, **tangram_options)
                async with tangram:
                    sync = cls(tangram, loop=loop)
                    sync._stop = asyncio.Event()
                    ready.set_result(sync)
                    await sync._stop.wait()
                    # as aclose promises: queued waiters fail now, threads holding leases finish
                    # normally (their `with` exits need this loop), then the loop stops
                    await tangram.aclose()
                    while sync._holds:
                        await asyncio.wait(set(sync._holds))
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        def run() -> None:
            asyncio.set_event_loop(loop)
            with contextlib.suppress(BaseException):
                loop.run_until_complete(host())
            with contextlib.suppress(BaseException):  # what asyncio.run does before closing a loop
                for _ in range(3):  # a thread's acquire handed over meanwhile starts here, then ends
                    loop.run_until_complete(asyncio.sleep(0))
                    left = asyncio.all_tasks(loop)
                    if not left:
                        break
                    for t in left:
                        t.cancel()
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        thread = threading.Thread(target=run, name="tangram-loop", daemon=True)
        thread.start()
        sync = ready.result()
        sync._thread = thread
        return sync

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop a Tangram started with :meth:`start`: queued waiters get RuntimeClosedError at
        once; threads holding leases finish normally, and the loop stops once they have left.
        Waits up to ``timeout`` seconds for that (None: for as long as it takes)."""
        if self._stop is None or self._thread is None:
            raise RuntimeError("close() is for a SyncTangram made by SyncTangram.start(); exit your own Tangram")
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def __enter__(self) -> SyncTangram:  # noqa: PYI034 (Self needs Python 3.11)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self.close()

    # -- the blocking API -------------------------------------------------------------------------
    def statistics(self) -> Mapping[str, Any]:
        """``tangram.statistics()``, read on the loop so the snapshot is consistent."""
        stats: Mapping[str, Any] = self._call(self._stats())
        return stats

    async def _stats(self) -> Mapping[str, Any]:
        return await self.tangram.astatistics()

    def _call(self, coro: Any) -> Any:
        self._check_thread()
        return self._wait(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def _wait(self, fut: concurrent.futures.Future[Any]) -> Any:
        """``fut.result()``, in slices that notice the loop closing: work handed to a loop that
        stops before running it is dropped with the loop, and its future never resolves (a thread
        that called acquire() while close() ran hung there for good)."""
        # (not `except TimeoutError` around result(): since 3.11 that is also what an acquire that
        # timed out raises through the future, and the loop would spin on it)
        while not fut.done():
            concurrent.futures.wait([fut], timeout=_SLICE)
            if self.loop.is_closed() and not fut.done():
                raise RuntimeClosedError("the SyncTangram's event loop closed while this thread waited")
        return fut.result()

    def _check_thread(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError(
                "SyncTangram.acquire() was called on the Tangram's own event loop thread, where it would "
                "deadlock; use `async with tangram.acquire(spec)` there"
            )
        if self.loop.is_closed():
            raise RuntimeClosedError("the SyncTangram's event loop is closed")

    @contextlib.contextmanager
    def acquire(self, spec: ActionSpec, *, timeout: float | None = None,
                expected_s: float | None = None) -> Iterator[Lease]:
        """Block until ``spec`` is granted; release when the ``with`` block ends, however it ends.
        ``expected_s``: a length hint, as :meth:`Tangram.acquire`."""
        self._check_thread()
        check_expected(expected_s)  # in the caller's thread, before anything is started
        granted: concurrent.futures.Future[Lease] = concurrent.futures.Future()
        leave: list[asyncio.Event] = []
        failed = [False]
        tangram = self.tangram

        async def hold() -> None:
            done = asyncio.Event()
            leave.append(done)
            me = asyncio.current_task()
            assert me is not None
            self._holds.add(me)
            me.add_done_callback(self._holds.discard)
            try:
                # a hint only when given: a handle written to the older protocol takes no expected_s
                hint: dict[str, float] = {} if expected_s is None else {"expected_s": expected_s}
                async with tangram.acquire(spec, timeout=timeout, **hint) as lease:
                    granted.set_result(lease)
                    await done.wait()
                    if failed[0]:
                        raise _ThreadActionFailed
            except _ThreadActionFailed:
                pass
            except BaseException as exc:
                if not granted.done():
                    granted.set_exception(exc)  # the thread re-raises it from granted.result()
                    if isinstance(exc, Exception):
                        return
                raise

        try:
            task = asyncio.run_coroutine_threadsafe(hold(), self.loop)
        except RuntimeError:  # closed between the check and here
            raise RuntimeClosedError("the SyncTangram's event loop is closed") from None
        try:
            lease = self._wait(granted)
        except BaseException:
            with contextlib.suppress(RuntimeError):  # the loop may be closed already
                task.cancel()  # e.g. KeyboardInterrupt while queued: stop waiting on the loop too
            with contextlib.suppress(BaseException):
                self._wait(task)
            raise
        try:
            yield lease
        except BaseException:
            failed[0] = True
            raise
        finally:
            # the loop outlives every holder (close() waits for them), so it is still running here
            self.loop.call_soon_threadsafe(leave[0].set)
            self._wait(task)  # returns once the runtime has released the grant
