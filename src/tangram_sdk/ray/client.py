"""The client side: :func:`deploy` (get-or-create the scheduler actor and its node agents) and
:class:`RemoteTangram` (the same ``acquire(spec)`` API as :class:`~tangram_sdk.runtime.Tangram`,
from any process on any node of the Ray cluster).

This module holds :class:`RemoteTangram` and its acquire; :func:`deploy` and :class:`TangramCluster`
(driver code) live in :mod:`._deploy`, the connection to the actor in :mod:`._link`, the bounded
Ray calls in :mod:`._ray_calls`; all are importable from here as before."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from typing_extensions import Self

from .._deadline import check_deadline, check_expected, check_timeout, wait_future, within
from ..errors import ManagerError, NodeLostError, RuntimeClosedError, SchedulerBrokenError, SpecError, TangramError
from .._validate import check_tokens_used
from ..lease import Lease
from ..snapshot import ClusterStatistics
from ..spec import ActionSpec
from . import _wire
from ._deploy import PoolSource as PoolSource
from ._deploy import TangramCluster, deploy
from ._errors import LeaseLostError
from ._link import _OPEN_LINKS, _apply_resize, _Held, _Link
from ._ray import awaited, require
from ._ray_calls import _ensure_ray, _seconds

__all__ = ["RemoteTangram", "TangramCluster", "deploy"]


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shared attempt's failure as seen (its callers may all have been cancelled)."""
    if not task.cancelled():
        task.exception()


# beyond a remote exec's own timeout: the agent kills the command and answers within this
_AGENT_GRACE = 10.0


async def _agent_call(rt: RemoteTangram, agent: str, method: str, args: tuple[Any, ...],
                      limit: Any) -> Any:
    """``lease.exec`` / ``lease.call`` on the node agent holding the lease's resources. The agent
    enforces ``timeout``; this side waits ``_AGENT_GRACE`` longer, so a frozen agent ends in a
    ManagerError naming it, and an agent that dies ends the call in NodeLostError (Ray's own actor
    errors are not project errors). Without a timeout only the agent's death ends the wait."""
    ray = require()
    what = f"node agent {rt.namespace}/{agent}"
    bound = limit + _AGENT_GRACE if isinstance(limit, (int, float)) and math.isfinite(limit) and limit >= 0 else None
    try:
        handle = rt._agents.get(agent)
        if handle is None:  # a control-store lookup: off the loop and bounded (see RemoteTangram._connect)
            handle = await within(asyncio.to_thread(rt._agent, agent), rt.connect_timeout,
                                  lambda: f"the lookup of {what} in Ray's control store took over "
                                          f"{rt.connect_timeout:g} s (a slow or restarting GCS)")
        ref = getattr(handle, method).remote(*args)
        return await within(awaited(ref), bound,
                            lambda: f"{what} did not answer lease.{method} within {bound:g} s "
                                    "(its timeout plus a grace): frozen or unreachable")
    except ray.exceptions.RayActorError as exc:
        raise NodeLostError(f"{what} died during lease.{method}: {type(exc).__name__}") from exc
    except ValueError as exc:
        if isinstance(exc, ray.exceptions.RayError):
            raise
        raise NodeLostError(f"{what} is gone (lease.{method}): {exc}") from exc
    except TimeoutError as exc:
        if isinstance(exc, ray.exceptions.RayError):  # the remote command's own error
            raise
        raise ManagerError(str(exc), resource=what) from None


class RemoteTangram:
    """The job-wide Tangram as seen from one process (any node of the Ray cluster)::

        async with RemoteTangram("tangram", namespace="tangram") as tangram:
            async with tangram.acquire(ActionSpec(kind="test", cpus=2)) as lease:
                ...  # lease.cpus, lease.units, lease.queued_s ... as with Tangram

    Connecting needs a Ray connection (``ray.init`` is called with ``address="auto"`` when the
    process has none) to find the actor; acquire/release then use one direct TCP connection. One
    instance per event loop. If the link breaks, held actions are cancelled and raise
    :class:`LeaseLostError` (their units were released); the next ``acquire`` reconnects.
    """

    def __init__(self, name: str = "tangram", *, namespace: str = "tangram", connect_timeout: float = 10.0) -> None:
        self.name = name
        self.namespace = namespace
        self.connect_timeout = _seconds("connect_timeout", connect_timeout)
        self._actor: Any = None
        self._link: _Link | None = None
        self._connecting: asyncio.Task[_Link] | None = None
        self._keys = itertools.count(1)
        self._caller: str | None = None
        self._closing = False
        self._agents: dict[str, Any] = {}
        self._blobs: dict[int, tuple[ActionSpec, bytes]] = {}  # rollouts send the same few specs again
        self._open: dict[int, tuple[Lease, _RemoteAcquire]] = {}  # acquire_lease leases, by id()

    def _encode(self, spec: ActionSpec) -> bytes:
        hit = self._blobs.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        blob = _wire.encode_spec(spec)
        if len(self._blobs) >= 1024:
            self._blobs.clear()
        self._blobs[id(spec)] = (spec, blob)  # holds the spec, so its id is not reused while cached
        return blob

    @classmethod
    async def connect(cls, name: str = "tangram", *, namespace: str = "tangram",
                      connect_timeout: float = 10.0) -> RemoteTangram:
        """``await RemoteTangram.connect(...)``: a connected instance (close it with ``aclose()``)."""
        self = cls(name, namespace=namespace, connect_timeout=connect_timeout)
        await self._ready()
        return self

    async def __aenter__(self) -> Self:
        await self._ready()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the link: the actor releases whatever this process still holds."""
        self._closing = True
        link, self._link = self._link, None
        if link is not None:
            if link.hb is not None:
                link.hb.cancel()
            if link.proto.transport is not None:
                link.proto.flush()  # the releases queued in this iteration go out before the close
                link.proto.transport.close()

    async def _ready(self) -> _Link:
        """The live link, connecting first if needed. Concurrent callers share one attempt, bounded
        by ``connect_timeout``: against a frozen actor they all get SchedulerBrokenError after one
        bound, not one bound each behind a lock."""
        link = self._link
        if link is not None and not link.closed:
            return link
        if self._closing:
            raise RuntimeClosedError("this RemoteTangram has been closed")
        task = self._connecting
        if task is None or task.done():
            task = self._connecting = asyncio.get_running_loop().create_task(self._connect())
            task.add_done_callback(_retrieve)
        # shield: a cancelled caller leaves the shared attempt to the others; the plain await of
        # the shield's own future still delivers the cancel to this caller
        return await asyncio.shield(task)

    async def _connect(self) -> _Link:
        what = f"the Tangram scheduler actor {self.namespace}/{self.name}"
        bound = self.connect_timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound
        ray = require()
        if not ray.is_initialized():  # ray.init blocks (20 s against an unreachable address): off the loop
            try:
                await within(asyncio.to_thread(_ensure_ray, self.namespace), bound,
                             lambda: f"connecting to the Ray cluster took over {bound:g} s "
                                     f"(RAY_ADDRESS={os.environ.get('RAY_ADDRESS', 'auto')!r} unreachable?)")
            except TimeoutError as exc:
                raise SchedulerBrokenError(str(exc)) from None
        if self._caller is None:
            self._caller = ray.get_runtime_context().get_node_id()

        def late(step: str) -> str:
            return f"{what} did not answer {step} within {bound:g} s (frozen, overloaded, or its node is unreachable)"

        try:
            # the lookup asks Ray's control store: in a thread, under the same bound (on the loop,
            # a slow or frozen GCS stalled it, and every other link's heartbeats with it)
            actor = await within(asyncio.to_thread(ray.get_actor, self.name, namespace=self.namespace),
                                 bound, lambda: f"the lookup of {what} in Ray's control store took over "
                                                f"{bound:g} s (a slow or restarting GCS)")
        except TimeoutError as exc:
            raise SchedulerBrokenError(str(exc)) from None
        except ValueError:
            raise TangramError(f"no Tangram named {self.name!r} in namespace {self.namespace!r}; "
                               f"call tangram_sdk.ray.deploy() first") from None
        try:
            ep = await within(awaited(actor.endpoint.remote()), max(0.0, deadline - loop.time()),
                          lambda: late("the endpoint request"))
        except TimeoutError as exc:
            raise SchedulerBrokenError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - ActorDiedError and the like
            raise SchedulerBrokenError(f"{what} is gone: {exc!r}") from exc
        self._actor = actor
        link = _Link(self)
        try:
            await within(loop.create_connection(lambda: link.proto, ep["host"], ep["port"]),
                         max(0.0, deadline - loop.time()), lambda: late("the TCP connection"))
            link.proto.transport.write(_wire.frame(ep["token"]))  # type: ignore[union-attr]
            link.send(("hello", {"pid": os.getpid(), "node": self._caller}))
            link.config = await wait_future(link.welcome, max(0.0, deadline - loop.time()),
                                            lambda: late("the welcome"))
        except BaseException as exc:
            link.abort()
            if isinstance(exc, TimeoutError):
                raise SchedulerBrokenError(str(exc)) from None
            if isinstance(exc, OSError):
                raise SchedulerBrokenError(f"cannot connect to {what} at {ep['host']}:{ep['port']}: {exc}") from exc
            raise
        if self._closing:  # aclose() ran while this connected: the link must not outlive it
            link.abort()
            raise RuntimeClosedError("this RemoteTangram was closed while it connected")
        link.hb = loop.create_task(link.heartbeat(float(ep["heartbeat"]), float(ep["ttl"])))
        self._link = link
        _OPEN_LINKS.add(link)
        return link

    def acquire(self, spec: ActionSpec, *, timeout: float | None = None, node: str | None = None,
                deadline: float | None = None, expected_s: float | None = None) -> _RemoteAcquire:
        """Wait for ``spec``'s resources anywhere in the job; an async context manager yielding a
        :class:`~tangram_sdk.lease.Lease` (same fields as the in-process runtime's). ``node``
        forces a node label; by default a ``container=`` spec goes to its container's node, others
        to the caller's node while it has room, else the emptiest feasible node.
        ``lease.attachment("node")`` says where it landed. ``deadline``: as
        :meth:`Tangram.acquire` (this loop's ``loop.time()``; it travels as seconds from now, so
        the actor's clock need not agree): DeadlineError when the grant cannot or did not come
        by then. ``expected_s``: a length hint, as :meth:`Tangram.acquire` (sized on the node)."""
        if not isinstance(spec, ActionSpec):
            raise SpecError(f"acquire() needs an ActionSpec, got {type(spec).__name__}")
        limit = check_timeout(timeout)
        if node is not None and (not isinstance(node, str) or not node):
            raise SpecError(f"node must be None or a node label (a non-empty str), got {node!r}")
        return _RemoteAcquire(self, spec, limit, node, check_deadline(deadline), check_expected(expected_s))

    async def acquire_lease(self, spec: ActionSpec, *, timeout: float | None = None,
                            node: str | None = None, deadline: float | None = None,
                            expected_s: float | None = None) -> Lease:
        """:meth:`acquire` without the ``async with`` (as :meth:`Tangram.acquire_lease`): the
        lease, held until :meth:`release`."""
        acm = self.acquire(spec, timeout=timeout, node=node, deadline=deadline, expected_s=expected_s)
        lease = await acm.enter()
        self._open[id(lease)] = (lease, acm)  # holds the lease, so its id is not reused meanwhile
        return lease

    async def release(self, lease: Lease, *, failed: bool = False) -> None:
        """Give back a lease from :meth:`acquire_lease`. ``failed``: wait until the actor has the
        units back (as a failing ``async with`` block does). LeaseLostError when the actor took
        it back already. Releasing twice does nothing."""
        item = self._open.pop(id(lease), None)
        if item is not None:
            await item[1].exit(failed=failed)

    def report_tokens(self, lease: Lease, quota: str, used: int) -> None:
        """As :meth:`Tangram.report_tokens`, for a lease of this handle: the call really drew
        ``used`` tokens of weighted quota ``quota``; the job-wide bucket is corrected (one frame,
        not awaited: later acquires anywhere in the job wait for the truth). LeaseLostError when
        the link to the actor is gone."""
        check_tokens_used(lease.spec.tokens, lease.spec.kind, quota, used)
        link = self._link
        if link is None or link.closed:
            raise LeaseLostError("connection to the Tangram scheduler actor lost: tokens not reported")
        link.send(("tok", lease.action_id, quota, used))

    async def statistics(self) -> ClusterStatistics:
        """The scheduler actor's snapshot (:class:`~tangram_sdk.snapshot.ClusterStatistics`): per
        node, per quota, clients, peaks, invariant errors.
        SchedulerBrokenError when the actor does not answer within ``connect_timeout``."""
        link = await self._ready()
        key = next(self._keys)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.waiters[key] = fut
        link.send(("stats", key))
        try:
            out: ClusterStatistics = await wait_future(
                fut, self.connect_timeout,
                lambda: f"the Tangram scheduler actor {self.namespace}/{self.name} did not answer statistics "
                        f"within {self.connect_timeout:g} s")
        except TimeoutError as exc:
            raise SchedulerBrokenError(str(exc)) from None
        finally:
            link.waiters.pop(key, None)
        return out

    async def astatistics(self) -> ClusterStatistics:
        """:meth:`statistics` under the name every Tangram handle shares (``AnyTangram``)."""
        return await self.statistics()

    def _agent(self, name: str) -> Any:
        a = self._agents.get(name)
        if a is None:
            a = self._agents[name] = require().get_actor(name, namespace=self.namespace)
        return a

    def __repr__(self) -> str:
        link = self._link
        state = "closed" if self._closing else ("connected" if link is not None and not link.closed else "idle")
        held = 0 if link is None else len(link.held)
        waiting = 0 if link is None else len(link.waiters)
        return f"<RemoteTangram {self.namespace}/{self.name} {state} | {held} held, {waiting} waiting>"


class _RemoteAcquire:
    __slots__ = ("_deadline", "_expected", "_key", "_lease", "_link", "_node", "_rt", "_spec", "_timeout")

    def __init__(self, rt: RemoteTangram, spec: ActionSpec, timeout: float | None, node: str | None,
                 deadline: float | None = None, expected: float | None = None) -> None:
        self._rt = rt
        self._spec = spec
        self._timeout = timeout
        self._node = node
        self._deadline = deadline
        self._expected = expected
        self._key = 0
        self._link: _Link | None = None
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        return await self.enter()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.exit(failed=exc_type is not None, exc=exc)

    async def enter(self) -> Lease:
        rt = self._rt
        blob = rt._encode(self._spec)  # SpecError before anything is registered or sent
        link = await rt._ready()
        loop = asyncio.get_running_loop()
        key = self._key = next(rt._keys)
        self._link = link
        if link.closed:
            raise LeaseLostError("connection to the Tangram scheduler actor lost before the request")
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        link.waiters[key] = fut
        t0 = loop.time()
        within_s = None if self._deadline is None else self._deadline - t0
        frame: tuple[Any, ...] = ("acq", key, self._spec.kind, blob, self._timeout, self._node, rt._caller, within_s)
        if self._expected is not None:  # older actors take the frame without it
            frame += (self._expected,)
        link.send(frame)
        # the actor enforces `timeout`; this side waits a heartbeat longer for its answer, so a
        # frozen actor still yields TimeoutError on time (without a timeout, the link's silence
        # limit, ttl - heartbeat, ends the wait with LeaseLostError)
        bound = min((x for x in (self._timeout, None if within_s is None else max(0.0, within_s))
                     if x is not None), default=None)
        grace = None if bound is None else bound + float(link.config.get("heartbeat", 2.0))
        try:
            # never asyncio.wait_for: a grant landing with a cancel must not swallow the cancel
            f = await wait_future(fut, grace, self._late)
        except BaseException as exc:
            link.waiters.pop(key, None)
            link.early.pop(key, None)
            if key in link.refused:  # refused by the actor (SpecError, its own timeout...): nothing is held
                link.refused.discard(key)
                raise
            # whatever the actor has for this key goes back (no-op if nothing); raise once it has
            if await link.give_back(("cancel", key, True), key) and not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError from exc  # cancelled while giving back: the cancel wins
            raise
        held = link.held[key] = _Held(asyncio.current_task())
        now = loop.time()
        lease = Lease(f["id"], self._spec, cpus=tuple(f["cpus"]), gpus=tuple(f["gpus"]), units=f["units"],
                      memory=f["memory"], quotas=tuple(f["quotas"]), queued_s=now - t0, granted_at=now,
                      counted=tuple(f.get("counted", ())), ceiling=f.get("workers") or None)
        lease.attach("node", f["node"])
        lease.attach("ray_node_id", f["ray_node_id"])
        agent_name = f["agent"]
        if agent_name is not None:
            aid = f["node_aid"]
            keys = set(f["agent_keys"])
            if "exec" in keys:
                async def _exec(cmd: Sequence[str], **kw: Any) -> Any:
                    return await _agent_call(rt, agent_name, "exec", (aid, list(cmd), kw), kw.get("timeout"))

                lease.attach("exec", _exec)
            if "call" in keys:
                async def _call(*args: Any, **kwargs: Any) -> Any:
                    return await _agent_call(rt, agent_name, "call", (aid, args, kwargs), kwargs.get("timeout"))

                lease.attach("call", _call)
        self._lease = held.lease = lease
        for cpus, units in link.early.pop(key, ()):  # resized between the grant and now
            _apply_resize(lease, cpus, units)
        return lease

    def _late(self) -> str:
        rt = self._rt
        # the wait is bounded by the timeout, the deadline, or both (a deadline alone has no timeout)
        what = f"within {self._timeout:g} s" if self._timeout is not None else "by its deadline"
        return (f"{self._spec.kind}: not granted {what}: the scheduler actor "
                f"{rt.namespace}/{rt.name} did not answer in time")

    async def exit(self, *, failed: bool, exc: BaseException | None = None) -> None:
        """Release: pipelined when the action succeeded; a failed one waits until the actor has
        the units back. A lease the actor took back raises its LeaseLostError (from ``exc``)."""
        link = self._link
        assert link is not None
        h = link.held.pop(self._key, None)
        if h is None or h.lost is None:
            # what the lease's commands really got (lease.run / lease.exec), for the actor's learning
            par = None if self._lease is None else self._lease.parallelism
            if not failed:
                # pipelined: ordered before the next request
                link.send(("rel", self._key, False) if par is None else ("rel", self._key, False, False, par))
                return
            # a failed or cancelled action: its exception propagates once the units are back
            if await link.give_back(("rel", self._key, True, True, par), self._key) and \
                    not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError from exc
            return
        lost = h.lost
        task = h.task
        if h.cancelled and task is not None and hasattr(task, "uncancel"):
            task.uncancel()
        if exc is None or isinstance(exc, asyncio.CancelledError):
            raise lost from None
        raise lost from exc
