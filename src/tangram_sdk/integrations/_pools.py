"""Pools by name: every adapter of a job that names a pool gets the same scheduler.

Why: veRL runs ``rollout.agent.num_workers`` AgentLoopWorker processes and OpenRLHF several rollout
actors, each loading the same tool YAML / agent file. A pool built per loader would give N
schedulers over the same cores (and N x every quota); two adapters in one worker naming "the same"
pool in different spellings used to give two. So a pool is identified by its **name** (default
``"tangram"``), and:

* inside a Ray job (the process is connected to Ray, as every veRL/OpenRLHF worker is) the name is
  the named, detached scheduler actor of :mod:`tangram_sdk.ray`, got or created in the job's Ray
  namespace: the first worker that needs it deploys it, the others attach; each event loop talks
  to it through one :class:`~tangram_sdk.ray.RemoteTangram`;
* outside Ray (or with ``scope: process``) one :class:`~tangram_sdk.runtime.Tangram` per process
  per name, started on the event loop that first asks for it and closed with that loop.

A definition (``{name, cpus, gpus, memory, quotas, ...}`` plus scheduler ``options``) is compared
after parsing, so ``cpus: 4``, ``cpus: "0-3"`` and ``cpus: [0, 1, 2, 3]`` are one pool; two
*different* definitions under one name are a SpecError (which one would win is a guess, and both
would over-grant the same cores). ``{pool: NAME}`` attaches to a pool defined elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import attrs

from .._protocol import AnyTangram
from ..errors import SpecError, TangramError
from ..options import SchedulerOptions
from ..pool import Pool
from ..runtime import Tangram
from ..scheduler import Scheduler
from ._config import _plain, pool_from_mapping

__all__ = ["DEFAULT_NAME", "PoolDef", "close_loop_pools", "open_pool", "pool_def", "register"]

DEFAULT_NAME = "tangram"
_SCOPES = ("job", "process")
_NAMING_KEYS = {"name", "namespace", "scope"}
_POOL_KEYS = {"cpus", "numa", "gpus", "gpu_cells", "memory", "resources", "quotas"}


@attrs.frozen(eq=True)
class PoolDef:
    """A pool as config names it: ``pool=None`` attaches to one defined elsewhere."""

    name: str = DEFAULT_NAME
    pool: Pool | None = None
    options: tuple[tuple[str, Any], ...] = ()
    namespace: str | None = None  # the Ray namespace (None: the job's own)
    scope: str = "job"  # "job": the Ray actor when the process is in a Ray job; "process": always local

    def describe(self) -> str:
        if self.pool is None:
            return f"pool {self.name!r} (attach)"
        d = self.pool.describe()
        shown = {k: d[k] for k in ("cpus", "gpus", "memory", "resources") if d.get(k)}
        if self.pool.quotas:
            shown["quotas"] = {n: repr(q) for n, q in self.pool.quotas}
        if self.options:
            shown["options"] = dict(self.options)
        return f"pool {self.name!r} {json.dumps(shown, default=str)}"


def _check_name(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value or value != value.strip():
        raise SpecError(f"{where} must be a non-empty name without surrounding spaces, got {value!r}")
    return value


def pool_def(source: Mapping[str, Any]) -> PoolDef:
    """Parse a runtime mapping: ``{pool: {...} | NAME, options: {...}}`` or a bare pool mapping.

    A pool mapping holds the :class:`Pool` fields (``cpus``, ``numa``, ``gpus``, ``gpu_cells``,
    ``memory``, ``resources``, ``quotas``) and optionally ``name`` (default ``"tangram"``), ``namespace`` (Ray) and
    ``scope`` (``job`` | ``process``). Unknown keys are a SpecError here, where config is read."""
    data = _plain(source)
    if not isinstance(data, Mapping):
        raise SpecError(f"a runtime mapping must be a mapping, got {source!r}")
    data = dict(data)
    options = data.pop("options", None) or {}
    if not isinstance(options, Mapping):
        raise SpecError(f"options must be a mapping of scheduler options, got {options!r}")
    # checked where the config is read (an unknown name or a bad value fails at load, not when the
    # pool first opens mid-rollout), kept as the scheduler will take them
    options = SchedulerOptions.from_mapping(dict(options)).as_kwargs()
    body = data.pop("pool") if "pool" in data else data
    if "pool" in source and data:
        raise SpecError(f"runtime: unknown key(s) {sorted(data)} next to pool:; allowed: pool, options")
    if isinstance(body, str):
        if options:
            raise SpecError(f"pool {body!r}: options belong to the pool's definition, not to an attach by name")
        return PoolDef(name=_check_name("pool", body))
    if not isinstance(body, Mapping):
        raise SpecError(f"pool must be a mapping (cpus, gpus, quotas...) or a pool name, got {body!r}")
    body = dict(body)
    unknown = sorted(set(body) - _POOL_KEYS - _NAMING_KEYS)
    if unknown:
        raise SpecError(f"pool: unknown key(s) {unknown}; allowed: {sorted(_POOL_KEYS | _NAMING_KEYS)}")
    name = _check_name("pool.name", body.pop("name", DEFAULT_NAME))
    namespace = body.pop("namespace", None)
    if namespace is not None:
        _check_name("pool.namespace", namespace)
    scope = body.pop("scope", "job")
    if scope not in _SCOPES:
        raise SpecError(f"pool.scope must be one of {list(_SCOPES)}, got {scope!r}")
    if not body:
        raise SpecError(f"pool {name!r}: no resources given (cpus, gpus, memory, resources or quotas); to attach to a pool "
                        f"defined elsewhere write pool: {name}")
    pool = pool_from_mapping(body)
    try:  # the options' ranges and combinations, as the scheduler will see them (pure: nothing starts)
        Scheduler(pool, **options)
    except ValueError as exc:
        raise SpecError(f"pool {name!r}: options {dict(options)}: {exc}") from None
    return PoolDef(name=name, pool=pool, options=tuple(sorted(options.items())), namespace=namespace, scope=scope)


# ---------------------------------------------------------------------------------- the registry
class _Hosted:
    """One Tangram entered in its own task on ``loop``, alive until the loop closes or shutdown."""

    def __init__(self, tangram: Tangram) -> None:
        loop = asyncio.get_running_loop()
        self.tangram = tangram
        self.loop = loop
        self.thread = threading.get_ident()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.stop = asyncio.Event()
        self.task = loop.create_task(self._run(), name="tangram-host")

    async def _run(self) -> None:
        try:
            async with self.tangram:
                self.ready.set_result(None)
                await self.stop.wait()
        except BaseException as exc:
            if not self.ready.done():
                self.ready.set_exception(exc)
            raise

    def alive(self) -> bool:
        return not self.loop.is_closed() and not self.task.done()


class _Local:
    __slots__ = ("closing", "defn", "host")

    def __init__(self, defn: PoolDef, host: _Hosted) -> None:
        self.defn = defn
        self.host = host
        #: set by close_loop_pools until the closed pool's holders have released: a new pool of
        #: the same name waits for it (it would grant the cores they still hold)
        self.closing: asyncio.Future[None] | None = None


async def _drained(tangram: Tangram) -> None:
    """Until no action holds a lease of the closed ``tangram`` (its holders finish normally)."""
    while tangram.running:
        await asyncio.sleep(0.02)


async def task_ended(task: asyncio.Task[Any]) -> None:
    """Until ``task`` has ended, however it ended (its outcome retrieved, so never logged)."""
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()


async def wait_closed(closer: asyncio.Task[None]) -> None:
    """Wait for ``closer``; a cancel of the caller propagates at once and leaves it running."""
    await asyncio.shield(closer)


async def _close_locals(mine: list[tuple[str, _Local]]) -> None:
    try:
        for _name, e in mine:
            await task_ended(e.host.task)
        for _name, e in mine:  # a Tangram closes at once; its holders finish normally, on its cores
            await _drained(e.host.tangram)
    finally:
        for name, e in mine:
            if _local.get(name) is e:
                _local.pop(name, None)
            assert e.closing is not None
            e.closing.set_result(None)


async def _close_with_loop(handle: Any) -> None:
    """Kept on the loop a job-wide handle serves: closes it when the loop shuts down
    (``asyncio.run`` cancels every task at its end), so a worker that runs each batch under a new
    loop (veRL's reward loop) leaves no socket behind per batch."""
    try:
        await asyncio.Event().wait()
    finally:
        await handle.aclose()


#: name -> the process's pool of that name (outside Ray, or scope: process)
_local: dict[str, _Local] = {}
#: name -> the latest definition this process's config gave (an attach by name uses it)
_defined: dict[str, PoolDef] = {}
#: per event loop: (namespace, name) -> that loop's handle on the job-wide actor
_remote: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str | None, str], Any]] = (
    weakref.WeakKeyDictionary())
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
#: per event loop: the tasks that close its job-wide handles when the loop shuts down
_keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[asyncio.Task[None]]] = weakref.WeakKeyDictionary()
_deployed: dict[tuple[str, str], PoolDef] = {}  # actors this process got-or-created, and from what
_guard = threading.Lock()


def _in_ray() -> bool:
    """Whether this process is connected to Ray (every veRL/OpenRLHF worker is). Never imports Ray."""
    ray = sys.modules.get("ray")
    try:
        return ray is not None and bool(ray.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported or stubbed module: not a Ray job
        return False


def _same(old: PoolDef, new: PoolDef) -> None:
    if new.pool is None or new is old:
        return
    if (old.pool, old.options, old.namespace, old.scope) != (new.pool, new.options, new.namespace, new.scope):
        raise SpecError(
            f"two definitions of pool {new.name!r} in one process: {old.describe()} and {new.describe()}; "
            f"a name is one pool for the whole job: give every adapter the same definition, attach with "
            f"pool: {new.name}, or use another name (or await tangram_sdk.integrations.shutdown() first)")


def register(defn: PoolDef) -> PoolDef:
    """Note a definition read from config (adapters call this where they read it, so a clash with a
    pool already running in this process fails there, and an attach by name knows what to open)."""
    if defn.pool is None:
        return defn
    entry = _local.get(defn.name)
    if entry is not None and entry.host.alive():
        _same(entry.defn, defn)
    with _guard:
        known = _defined.get(defn.name)
        if known is not None:
            _same(known, defn)  # two tools of one YAML defining one name two ways: at build, not at first call
        _defined[defn.name] = defn
    return defn


def _resolved(defn: PoolDef) -> PoolDef:
    """An attach by name becomes the definition this process knows for that name, if any."""
    if defn.pool is not None:
        return defn
    known = _defined.get(defn.name)
    return defn if known is None else known


def _fast(defn: PoolDef, loop: asyncio.AbstractEventLoop) -> AnyTangram | None:
    """The pool already open for this loop, without taking the lock (the per-call path)."""
    entry = _local.get(defn.name)
    if entry is not None and entry.host.loop is loop and entry.host.alive() and entry.host.ready.done() \
            and not entry.host.ready.exception():
        if entry.defn is not defn:
            _same(entry.defn, defn)
        return entry.host.tangram
    handles = _remote.get(loop)
    if handles:
        handle = handles.get((defn.namespace, defn.name))  # as named in config (namespace None: the job's)
        if handle is not None and not handle._closing:
            if defn.pool is not None:  # the actor runs one definition: another one is refused, not served
                known = _deployed.get((_namespace(defn), defn.name))
                if known is not None and known is not defn:
                    _same(known, defn)
            return handle  # type: ignore[no-any-return]
    return None


async def open_pool(defn: PoolDef) -> AnyTangram:
    """The scheduler named by ``defn`` for the current event loop (see the module docstring)."""
    loop = asyncio.get_running_loop()
    hit = _fast(defn, loop)
    if hit is not None:
        return hit
    defn = _resolved(register(defn))
    lock = _locks.get(loop)
    if lock is None:
        lock = _locks.setdefault(loop, asyncio.Lock())
    async with lock:
        hit = _fast(defn, loop)
        if hit is not None:
            return hit
        entry = _local.get(defn.name)
        live_local = entry is not None and entry.host.alive() and entry.host.loop.is_running()
        if defn.scope == "job" and _in_ray() and not live_local:
            handle: AnyTangram = await _job_pool(defn, loop)
            return handle
        return await _process_pool(defn, loop)


async def _process_pool(defn: PoolDef, loop: asyncio.AbstractEventLoop) -> Tangram:
    entry = _local.get(defn.name)
    if entry is not None and entry.closing is not None and entry.host.loop is loop:
        await asyncio.shield(entry.closing)  # shutdown() is waiting for its holders: then a fresh one
        entry = _local.get(defn.name)
    if entry is not None and not (entry.host.alive() and (entry.host.loop is loop or entry.host.loop.is_running())):
        entry = None  # its loop is gone: a fresh one (sequential asyncio.run calls, test loops)
    if entry is not None:
        _same(entry.defn, defn)
        if entry.host.loop is not loop:
            raise TangramError(
                f"pool {defn.name!r} runs on another event loop of this process (thread {entry.host.thread}); "
                f"one pool is one scheduler on one loop: use it from that loop, give this one "
                f"SyncTangram(tangram, loop=...) from there, or run the workers under Ray (one actor per job)")
    else:
        if defn.pool is None:
            raise SpecError(f"no pool named {defn.name!r} in this process: define it in one adapter's config "
                            f"(pool: {{name: {defn.name}, cpus: ..., quotas: ...}}) before attaching to it by name")
        entry = _local[defn.name] = _Local(defn, _Hosted(Tangram(defn.pool, **dict(defn.options))))
    await asyncio.shield(entry.host.ready)
    return entry.host.tangram


def _namespace(defn: PoolDef) -> str:
    if defn.namespace is not None:
        return defn.namespace
    ray = sys.modules["ray"]
    ns = ray.get_runtime_context().namespace
    return str(ns) if ns else "tangram"


def _anonymous(namespace: str) -> bool:
    """Ray names a job's namespace with a random UUID when ``ray.init()`` is given none."""
    try:
        return str(uuid.UUID(namespace)) == namespace
    except ValueError:
        return False


def _deploy(defn: PoolDef, namespace: str) -> None:
    """Get or create the job's actor for ``defn`` (blocking; run in a thread)."""
    from ..ray import deploy

    assert defn.pool is not None
    node_pool = attrs.evolve(defn.pool, quotas=None)
    opts = dict(defn.options)
    if defn.namespace is None and _anonymous(namespace):
        # a plain ray.init(): no later job can reach this namespace, so the pool ends with the job
        opts.setdefault("ends_with_job", True)
    cluster = deploy(defn.name, namespace=namespace, quotas=defn.pool.quota_map, pool=node_pool, **opts)
    for label, node in cluster.statistics()["nodes"].items():
        have = node.get("pool")
        if node.get("alive") and isinstance(have, Pool) and have != node_pool:
            raise SpecError(
                f"pool {defn.name!r} already runs in Ray namespace {namespace!r} with node {label!r} holding "
                f"{have.describe()}, not {node_pool.describe()}: every worker must give the same definition "
                f"(or shut the old one down: TangramCluster.get({defn.name!r}, namespace={namespace!r}).shutdown())")


async def _job_pool(defn: PoolDef, loop: asyncio.AbstractEventLoop) -> Any:
    from ..ray.client import RemoteTangram

    namespace = _namespace(defn)
    key = (namespace, defn.name)
    if defn.pool is not None and _deployed.get(key) != defn:
        # deploy() waits on Ray (bounded by its timeout); a thread keeps this worker's loop serving
        await asyncio.to_thread(_deploy, defn, namespace)
        _deployed[key] = defn
    handle = RemoteTangram(defn.name, namespace=namespace)
    try:
        await handle._ready()
    except TangramError as exc:
        if defn.pool is None and "no Tangram named" in str(exc):
            raise SpecError(f"no pool named {defn.name!r} in Ray namespace {namespace!r}: define it in one "
                            f"adapter's config (pool: {{name: {defn.name}, cpus: ...}}) or deploy() it") from None
        raise
    handles = _remote.setdefault(loop, {})
    handles[key] = handles[(defn.namespace, defn.name)] = handle  # by resolved and by configured namespace
    keeper = loop.create_task(_close_with_loop(handle), name="tangram-remote-handle")
    _keepers.setdefault(loop, []).append(keeper)
    return handle


async def close_loop_pools() -> None:
    """Close this loop's pools: the process pools it hosts (returning once the actions holding
    their leases have released them, so a new pool of the same name never grants cores still
    held), and its handles on job-wide actors (the actors themselves stay: other workers use them)."""
    loop = asyncio.get_running_loop()
    mine = [(name, e) for name, e in list(_local.items()) if e.host.loop is loop and e.closing is None]
    for _name, e in mine:
        e.closing = loop.create_future()
        e.host.stop.set()
    # the close runs to its end in a task of its own (a same-name pool waits for it), and a cancel
    # of this caller propagates at once: awaited directly, the cancel went into the host task,
    # which ended cancelled, and the suppress around it ate the caller's cancel
    await wait_closed(loop.create_task(_close_loop(loop, mine), name="tangram-close-pools"))


async def _close_loop(loop: asyncio.AbstractEventLoop, mine: list[tuple[str, _Local]]) -> None:
    if mine:
        await _close_locals(mine)
    with _guard:
        _defined.clear()  # a clean exit (or a test's end): the next config defines its pools anew
    for keeper in _keepers.pop(loop, None) or []:
        keeper.cancel()
    for handle in {id(h): h for h in (_remote.pop(loop, None) or {}).values()}.values():
        with contextlib.suppress(Exception):
            await handle.aclose()
