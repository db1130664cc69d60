"""Which Tangram an adapter uses, and the lease of the action running now.

Why this exists: frameworks build tools, agent instances and reward functions themselves (veRL
from ``class_name`` in YAML, OpenRLHF from ``AgentExecutor()``), so an adapter cannot be handed
the Tangram through a constructor. It resolves one instead, in this order (an object beats a
description):

1. **an explicit object**: ``runtime=`` given a running ``Tangram`` or a ``RemoteTangram``
   (anything :class:`~tangram_sdk._protocol.AnyTangram`);
2. **the installed one**: the process default set with :func:`install` (or :func:`using`);
3. **config**: a description of the pool, from the adapter's ``tangram:`` YAML or a ``runtime=``
   argument: a pool mapping (``{pool: {name: rollout, cpus: 8, quotas: {...}}}``), a pool name
   (``{pool: rollout}``), or a zero-argument factory (or its import path ``"pkg.mod:make"``).
   A pool is **job-wide by name** (see :mod:`._pools`): every adapter of every worker naming it
   gets the same scheduler (the Ray actor inside a Ray job, one Tangram per process outside).
   A factory's result is kept per event loop (a ``Tangram`` it returns unentered is started on
   first use and closed with the loop);
4. none: :class:`~tangram_sdk.errors.RuntimeClosedError` saying how to give one.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, TypeVar, Union

from .._protocol import AnyTangram, is_tangram
from ..errors import InfeasibleSpecError, RuntimeClosedError, SpecError, TangramError
from ..lease import Lease
from ..runtime import Tangram
from ..spec import ActionSpec
from ._config import import_object
from ._pools import PoolDef, _Hosted, close_loop_pools, open_pool, pool_def, register, task_ended, wait_closed

__all__ = [
    "RuntimeSource",
    "action",
    "current_lease",
    "install",
    "installed",
    "resolve_runtime",
    "run_holding",
    "runtime_source",
    "shutdown",
    "using",
]

#: A Tangram/RemoteTangram, a zero-arg factory returning one, an import path to such a factory, a
#: runtime mapping (``{pool: {...} | NAME, options: {...}}`` or a bare pool mapping) or a parsed PoolDef.
RuntimeSource = Union[AnyTangram, Callable[[], Any], str, Mapping[str, Any], PoolDef]

_default: AnyTangram | None = None
_current_lease: ContextVar[Lease | None] = ContextVar("tangram_current_lease", default=None)


def install(tangram: AnyTangram | None) -> AnyTangram | None:
    """Make ``tangram`` (a ``Tangram`` or a ``RemoteTangram``) the process default for every
    adapter; returns the previous one. It wins over any pool that config describes; a
    Tangram object passed as ``runtime=`` wins over it.

    Call it where the rollout worker enters its Tangram (``install(None)`` removes it)."""
    global _default
    if tangram is not None and not is_tangram(tangram):
        raise SpecError(f"install() needs a Tangram or a RemoteTangram (acquire/astatistics/aclose), got {tangram!r}")
    previous, _default = _default, tangram
    return previous


def installed() -> AnyTangram | None:
    """The Tangram set with :func:`install`, or None."""
    return _default


@contextlib.contextmanager
def using(tangram: AnyTangram) -> Iterator[AnyTangram]:
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


def runtime_source(runtime: Any, *, where: str = "runtime") -> RuntimeSource | None:
    """Check a ``runtime=`` value where config is read, so a bad one fails at start-up: a pool
    mapping is parsed (and registered under its name) now; objects, factories and import paths
    pass through (an import path is resolved on first use: it may name the very module being
    loaded, as a veRL reward file naming its own factory does)."""
    if runtime is None or is_tangram(runtime) or isinstance(runtime, PoolDef):
        return runtime  # type: ignore[no-any-return]
    if isinstance(runtime, Mapping) or type(runtime).__name__ == "DictConfig":
        try:
            return register(pool_def(runtime))
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
    if isinstance(runtime, str) or callable(runtime):
        return runtime  # type: ignore[no-any-return]
    raise SpecError(f"{where} must be a Tangram, a RemoteTangram, a pool mapping, a factory or an import path "
                    f"to one, got {runtime!r}")


def check_spec_fits(spec: ActionSpec | None, source: Any, where: str) -> None:
    """A static spec against a pool defined in the same config, where the config is read: one
    that can never run there (a misspelt quota, more cores or GPUs than the pool has) is a
    configuration mistake, a SpecError at start-up, not every call's "not run" result to the
    model (argument-dependent specs are still judged per call)."""
    if spec is None or not isinstance(source, PoolDef) or source.pool is None:
        return
    from ..scheduler import Scheduler

    reason = Scheduler(source.pool, **dict(source.options)).feasibility(spec)
    if reason is not None:
        raise SpecError(f"{where}: its spec can never run on pool {source.name!r} ({source.pool.describe()}): {reason}")


# factories: per loop, by import path or identity
_made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = weakref.WeakKeyDictionary()
_made_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def _is_new_tangram(t: Any) -> bool:
    return isinstance(t, Tangram) and t.statistics().get("state") == "new"


async def _from_factory(source: str | Callable[[], Any]) -> AnyTangram:
    loop = asyncio.get_running_loop()
    table = _made.get(loop)
    key = source if isinstance(source, str) else f"factory:{id(source)}"
    hit = None if table is None else table.get(key)
    if hit is not None and not (isinstance(hit, _Hosted) and hit.task.done()):
        if isinstance(hit, _Hosted):
            await asyncio.shield(hit.ready)
            return hit.tangram
        return hit  # type: ignore[no-any-return]
    lock = _made_locks.get(loop)
    if lock is None:
        lock = _made_locks.setdefault(loop, asyncio.Lock())
    async with lock:
        table = _made.setdefault(loop, {})
        hit = table.get(key)
        if hit is None or (isinstance(hit, _Hosted) and hit.task.done()):
            factory = import_object(source) if isinstance(source, str) else source
            if is_tangram(factory):
                made: Any = factory
            elif isinstance(factory, Mapping):  # an import path naming a pool mapping
                return await open_pool(register(pool_def(factory)))
            elif callable(factory):
                made = factory()
            else:
                raise SpecError(f"runtime {source!r} is neither a Tangram nor a factory returning one")
            if not is_tangram(made):
                raise SpecError(f"runtime factory {source!r} returned {type(made).__name__}, not a Tangram "
                                f"or a RemoteTangram")
            hit = table[key] = _Hosted(made) if _is_new_tangram(made) else made
    if isinstance(hit, _Hosted):
        await asyncio.shield(hit.ready)
        return hit.tangram
    return hit  # type: ignore[no-any-return]


async def resolve_runtime(runtime: RuntimeSource | None = None) -> AnyTangram:
    """The Tangram an adapter should use now: an explicit object > :func:`install` > config."""
    if type(runtime) is PoolDef:  # the adapters' per-call path: a pool named in config
        if _default is not None:
            return _default
        return await open_pool(runtime)
    if runtime is not None and (isinstance(runtime, Tangram) or is_tangram(runtime)):
        return runtime  # type: ignore[return-value]
    if _default is not None:
        return _default
    if runtime is None:
        raise RuntimeClosedError(
            "no Tangram for this adapter: call tangram_sdk.integrations.install(tangram) with a Tangram "
            "or RemoteTangram, or configure a pool for it (`pool: {name: ..., cpus: ...}` under the "
            "adapter's tangram: config, or runtime={'pool': {...}})"
        )
    if isinstance(runtime, PoolDef):
        return await open_pool(runtime)
    if isinstance(runtime, Mapping) or type(runtime).__name__ == "DictConfig":
        return await open_pool(register(pool_def(runtime)))  # type: ignore[arg-type]
    if isinstance(runtime, str) or callable(runtime):
        return await _from_factory(runtime)
    raise SpecError(f"runtime must be a Tangram, a RemoteTangram, a pool mapping, a factory or an import path, "
                    f"got {runtime!r}")


async def shutdown() -> None:
    """Close what this event loop opened from config: its process pools and factory-made Tangrams,
    and its handles on job-wide Ray actors (the actors stay for the other workers; a worker's
    clean exit, or the end of a test)."""
    loop = asyncio.get_running_loop()
    table = _made.pop(loop, None) or {}
    hosts = [h for h in table.values() if isinstance(h, _Hosted)]
    for host in hosts:
        host.stop.set()
    # as close_loop_pools: a cancel of the caller wins, and the close still runs to its end
    await wait_closed(loop.create_task(_close_all(hosts), name="tangram-shutdown"))


async def _close_all(hosts: list[_Hosted]) -> None:
    for host in hosts:
        await task_ended(host.task)
    await close_loop_pools()


@contextlib.asynccontextmanager
async def action(
    spec: ActionSpec, *, timeout: float | None = None, runtime: RuntimeSource | None = None,
    expected_s: float | None = None,
) -> AsyncIterator[Lease]:
    """``async with action(spec) as lease:`` acquire from the resolved Tangram and make the lease
    visible to :func:`current_lease` inside the block. The hook for actions that are not tools.
    ``expected_s``: a length hint, as :meth:`Tangram.acquire`."""
    tangram = await resolve_runtime(runtime)
    async with tangram.acquire(spec, timeout=timeout, **_hint(expected_s)) as lease:
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
    expected_s: float | None = None,
) -> T:
    """Run ``body(lease)`` holding ``spec``'s resources, with the lease visible to
    :func:`current_lease`. A spec this pool refuses at acquire (invalid for it, or too big) gives
    ``refused(error)`` instead of raising: an argument-dependent failure becomes the tool's or the
    step's result and the rollout goes on. Everything else propagates; the lease is always released.
    ``expected_s``: a length hint, as :meth:`Tangram.acquire`."""
    tangram = await resolve_runtime(runtime)
    async with contextlib.AsyncExitStack() as stack:  # only a failed *acquire* becomes `refused`, not the body's errors
        try:
            lease = await stack.enter_async_context(tangram.acquire(spec, timeout=timeout, **_hint(expected_s)))
        except (SpecError, InfeasibleSpecError) as exc:
            return refused(exc)
        token = _set_lease(lease)
        try:
            return await body(lease)
        finally:
            _reset_lease(token)
    raise AssertionError("unreachable")  # pragma: no cover - the block always returns or raises


def _hint(expected_s: float | None) -> dict[str, float]:
    """``expected_s=`` only when there is a hint: a Tangram written to an older protocol takes none."""
    return {} if expected_s is None else {"expected_s": expected_s}


def _set_lease(lease: Lease | None) -> Any:
    """For adapters that enter the acquire context by hand; returns a token for ``_reset_lease``."""
    return _current_lease.set(lease)


def _reset_lease(token: Any) -> None:
    _current_lease.reset(token)
