"""Which Tangram an adapter uses, and the lease of the action running now.

Why this exists: frameworks build tools, agent instances and reward functions themselves (veRL
from ``class_name`` in YAML, OpenRLHF from ``AgentExecutor()``), so an adapter cannot be handed
the Tangram through a constructor. It resolves one instead, in this order:

1. an explicit ``runtime=`` (a running Tangram, or a source below);
2. the process default set with :func:`install` (or :func:`using`);
3. a *hosted* runtime built from config: an import path ``"pkg.mod:make_tangram"`` to a
   zero-argument factory, or a pool mapping (``{cpus: 8, quotas: {...}}``). It is started on
   first use in a task of the current event loop and shared by everything that names the same
   source on that loop, so all tools of one rollout worker draw on one pool.

A Tangram belongs to the loop it was entered on; hosted runtimes are therefore kept per loop and
die with it (``asyncio.run`` cancels the host task, which closes the Tangram).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar

from ..errors import InfeasibleSpecError, RuntimeClosedError, SpecError, TangramError
from ..lease import Lease
from ..runtime import Tangram
from ..spec import ActionSpec
from ._config import import_object, pool_from_mapping

__all__ = ["RuntimeSource", "action", "current_lease", "install", "resolve_runtime", "run_holding", "shutdown", "using"]

#: A Tangram, a zero-arg factory returning one, an import path to such a factory, or a pool mapping.
RuntimeSource = Tangram | Callable[[], Tangram] | str | Mapping[str, Any]

_default: Tangram | None = None
_current_lease: ContextVar[Lease | None] = ContextVar("tangram_current_lease", default=None)


def install(tangram: Tangram | None) -> Tangram | None:
    """Make ``tangram`` the process default for every adapter; returns the previous one.

    Call it where the rollout worker enters its Tangram (``install(None)`` removes it)."""
    global _default
    if tangram is not None and not isinstance(tangram, Tangram):
        raise SpecError(f"install() needs a Tangram, got {tangram!r}")
    previous, _default = _default, tangram
    return previous


@contextlib.contextmanager
def using(tangram: Tangram) -> Iterator[Tangram]:
    """``with using(tangram):`` install it for the block, restore the previous default after."""
    previous = install(tangram)
    try:
        yield tangram
    finally:
        install(previous)


def current_lease() -> Lease | None:
    """The lease of the action running in this task (set by the adapters), or None.

    Lets code that the adapter calls but that knows nothing of tangram (a wrapped veRL tool, an
    OpenRLHF ``step``) find its cores: ``lease = current_lease(); lease.cpus``."""
    return _current_lease.get()


class _Hosted:
    """One Tangram entered in its own task, alive until the loop closes or :func:`shutdown`."""

    def __init__(self, tangram: Tangram) -> None:
        self.tangram = tangram
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.stop = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run(), name="tangram-host")

    async def _run(self) -> None:
        try:
            async with self.tangram:
                self.ready.set_result(None)
                await self.stop.wait()
        except BaseException as exc:
            if not self.ready.done():
                self.ready.set_exception(exc)
            raise


_hosted: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Hosted]] = weakref.WeakKeyDictionary()
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def _key(source: RuntimeSource) -> str:
    if isinstance(source, str):
        return "path:" + source
    if isinstance(source, Mapping):
        from ._config import _plain

        return "pool:" + json.dumps(_plain(source), sort_keys=True, default=str)
    return f"factory:{id(source)}"


def _is_open(tangram: Tangram) -> bool:
    return bool(tangram.statistics().get("state") == "open")


def _build(source: RuntimeSource) -> Tangram:
    if isinstance(source, Mapping):
        data = dict(source)
        options = dict(data.pop("options", None) or {})
        return Tangram(pool_from_mapping(data.get("pool", data)), **options)
    factory = import_object(source) if isinstance(source, str) else source
    if isinstance(factory, Tangram):
        return factory
    if not callable(factory):
        raise SpecError(f"runtime {source!r} is neither a Tangram nor a factory returning one")
    made = factory()
    if not isinstance(made, Tangram):
        raise SpecError(f"runtime factory {source!r} returned {type(made).__name__}, not a Tangram")
    return made


async def resolve_runtime(runtime: RuntimeSource | None = None) -> Tangram:
    """The Tangram an adapter should use now (see the module docstring for the order)."""
    if isinstance(runtime, Tangram):
        return runtime
    if runtime is None:
        if _default is not None:
            return _default
        raise RuntimeClosedError(
            "no Tangram for this adapter: call tangram_sdk.integrations.install(tangram) inside "
            "`async with Tangram(...)`, or configure `runtime:` (an import path to a factory) or "
            "`pool:` for it"
        )
    loop = asyncio.get_running_loop()
    lock = _locks.setdefault(loop, asyncio.Lock())
    async with lock:
        table = _hosted.setdefault(loop, {})
        key = _key(runtime)
        host = table.get(key)
        if host is None or host.task.done():
            tangram = _build(runtime)
            if _is_open(tangram):  # the factory handed us one that is already running
                return tangram
            host = table[key] = _Hosted(tangram)
        await asyncio.shield(host.ready)
        return host.tangram


async def shutdown() -> None:
    """Close every runtime hosted on the current loop (tests, or a worker's clean exit)."""
    table = _hosted.pop(asyncio.get_running_loop(), {})
    for host in table.values():
        host.stop.set()
    for host in table.values():
        with contextlib.suppress(BaseException):
            await host.task


@contextlib.asynccontextmanager
async def action(
    spec: ActionSpec, *, timeout: float | None = None, runtime: RuntimeSource | None = None
) -> AsyncIterator[Lease]:
    """``async with action(spec) as lease:`` acquire from the resolved Tangram and make the lease
    visible to :func:`current_lease` inside the block. The hook for actions that are not tools."""
    tangram = await resolve_runtime(runtime)
    async with tangram.acquire(spec, timeout=timeout) as lease:
        token = _current_lease.set(lease)
        try:
            yield lease
        finally:
            _current_lease.reset(token)


T = TypeVar("T")


async def run_holding(
    spec: ActionSpec,
    body: Callable[[Lease], Awaitable[T]],
    refused: Callable[[TangramError], T],
    *,
    runtime: RuntimeSource | None = None,
    timeout: float | None = None,
) -> T:
    """Run ``body(lease)`` holding ``spec``'s resources, with the lease visible to
    :func:`current_lease`. A spec this pool refuses at acquire (invalid for it, or too big) gives
    ``refused(error)`` instead of raising: an argument-dependent failure becomes the tool's or the
    step's result and the rollout goes on. Everything else propagates; the lease is always released."""
    tangram = await resolve_runtime(runtime)
    acm = tangram.acquire(spec, timeout=timeout)
    try:
        lease = await acm.__aenter__()
    except (SpecError, InfeasibleSpecError) as exc:
        return refused(exc)
    token = _set_lease(lease)
    try:
        result = await body(lease)
    except BaseException as exc:
        _reset_lease(token)
        await acm.__aexit__(type(exc), exc, exc.__traceback__)
        raise
    _reset_lease(token)
    await acm.__aexit__(None, None, None)
    return result


def _set_lease(lease: Lease | None) -> Any:
    """For adapters that enter the acquire context by hand; returns a token for ``_reset_lease``."""
    return _current_lease.set(lease)


def _reset_lease(token: Any) -> None:
    _current_lease.reset(token)
