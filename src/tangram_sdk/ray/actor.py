"""The scheduler actor: one named, detached async Ray actor that owns the whole job's pool.

Inside it run plain :class:`~tangram_sdk.runtime.Tangram` runtimes (no second scheduler):

* one **per node** over that node's cores, GPUs and memory, whose only manager forwards
  ``apply``/``release`` to the node's agent (see :mod:`.agent`);
* one **global** runtime over the named API quotas (a pool with no cores), so a quota holds for the
  whole job, not per process or per node.

An action needing both takes its quota units first, then its node resources (a fixed order, so no
deadlock); see ``docs/ray.md`` for why. Clients talk to the actor over the framed TCP data path in
:mod:`._wire`; each connection is a client process, and everything it holds or waits for is released
when it closes or stays silent for longer than ``ttl`` seconds.

Its parts live beside it: :mod:`._agent_manager` (the node runtime's manager), :mod:`._conn` (a
client's connection), :mod:`._specs` (request specs decoded and frozen), :mod:`._routing` (quota
part, node part, which node), :mod:`._state` (node and lease records) and :mod:`._inspect`
(statistics, invariant checks).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from .._deadline import check_expected, check_timeout, within
from ..errors import (
    RuntimeClosedError,
    SchedulerBrokenError,
    SpecError,
    TangramError,
)
from ..lease import Lease
from ..managers.base import Manager
from ..pool import Pool, Quota
from ..runtime import Tangram
from ..scheduler.decisions import Decision
from ..scheduler.events import Event
from ..snapshot import ClusterStatistics, NodeStatistics
from ..spec import ActionSpec
from . import _wire
from ._agent_manager import _AgentManager
from ._conn import _Conn
from ._errors import NodeLostError
from ._inspect import _cluster_statistics, _invariant_errors, _node_stats
from ._ray import awaited, require
from ._routing import _route, _split
from ._specs import _decode_spec
from ._state import _Held, _Node

__all__ = ["SchedulerActor"]

log = logging.getLogger("tangram_sdk.ray")


# an agent's start (a Ray worker, imports, its managers: a CUDA context, a Docker session) may take
# longer than a fast apply bound (agent_timeout) should be
_AGENT_START_MIN = 30.0


_JOB_POLL = float(os.environ.get("TANGRAM_JOB_POLL", "5"))  # seconds between looks at the job table
_JOB_LOOK_WARN = 60.0  # seconds one look may go unanswered before a warning says so


def _job_dead(job: str) -> bool:
    """Whether Ray's job table says ``job`` has ended (False when it cannot tell)."""
    try:
        from ray._private import state  # no public API reads one job's state without the dashboard

        jobs = state.jobs()  # type: ignore[no-untyped-call,unused-ignore]  # typed only where ray is installed
        return any(j.get("JobID") == job and bool(j.get("IsDead")) for j in jobs)
    except Exception:  # noqa: BLE001 - a private API: never end a pool on a guess
        log.debug("cannot read Ray's job table", exc_info=True)
        return False


async def _wait_job_end(job: str, is_dead: Callable[[str], bool] = _job_dead, poll: float | None = None) -> None:
    """Return once ``is_dead(job)`` says the job has ended, looking every ``poll`` seconds.

    Each look runs in a thread (Ray's GCS client blocks) and at most one is in flight: a look
    that a wedged GCS does not answer is waited for at the next polls instead of starting another
    (a thread per poll would pile up for as long as the GCS is wedged), and a warning names it once
    it has been waiting ``_JOB_LOOK_WARN`` s."""
    poll = _JOB_POLL if poll is None else poll
    loop = asyncio.get_running_loop()
    look: asyncio.Future[bool] | None = None
    since = 0.0
    warned = False
    try:
        while True:
            await asyncio.sleep(poll)
            if look is None:
                look, since, warned = asyncio.ensure_future(asyncio.to_thread(is_dead, job)), loop.time(), False
            await asyncio.wait([look], timeout=poll)
            if not look.done():
                if not warned and loop.time() - since >= _JOB_LOOK_WARN:
                    warned = True
                    log.warning("Ray's job table has not answered for %.0f s: the pool cannot tell whether job %s "
                                "has ended (it keeps running and looks again)", loop.time() - since, job)
                continue
            dead, look = look.result(), None
            if dead:
                return
    finally:
        if look is not None:
            look.cancel()  # the thread itself cannot be stopped; it ends when the GCS answers


class SchedulerActor:
    """Ray actor body (``ray.remote`` is applied lazily by :func:`tangram_sdk.ray.deploy`)."""

    def __init__(
        self,
        name: str,
        namespace: str,
        quotas: Mapping[str, Quota] | None = None,
        options: Mapping[str, Any] | None = None,
        ttl: float = 10.0,
        heartbeat: float = 2.0,
        check_invariants: bool = False,
        fingerprint: str = "",
        agent_timeout: float | None = 120.0,
        ends_with_job: bool = False,
        creator: str = "",
    ) -> None:
        self.name = name
        self.ends_with_job = ends_with_job
        self.creator = creator  # the token of the deploy() call that made this actor
        self.agent_timeout = agent_timeout
        self._specs: dict[bytes, ActionSpec] = {}
        self.namespace = namespace
        self._quotas = dict(quotas or {})
        self._options = dict(options or {})
        self.ttl = float(ttl)
        self.heartbeat = float(heartbeat)
        self._check = check_invariants
        self.fingerprint = fingerprint
        self._token = secrets.token_hex(16).encode()
        self._started = False
        self._lock: asyncio.Lock | None = None
        self._host = ""
        self._ray_node_id = ""
        self._port = 0
        self._server: asyncio.base_events.Server | None = None
        self._quota_rt: Tangram | None = None
        self._nodes: dict[str, _Node] = {}
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._lost_nodes: list[dict[str, Any]] = []
        self._conns: dict[int, _Conn] = {}
        self._unauthed: dict[int, _Conn] = {}
        self._cids = itertools.count(1)
        self._gids = itertools.count(1)
        self._gen = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._peak_quota: dict[str, int] = {n: 0 for n in self._quotas}
        self._errors: list[str] = []
        self.granted = self.released = self.lost = self.expired = self.failed_acquires = 0

    # ------------------------------------------------------------------------------ lifecycle
    async def _ensure_started(self) -> None:
        if self._started:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._started:
                return
            ray = require()
            self._quota_rt = Tangram(Pool(quotas=self._quotas), observers=[self._observe_quota],
                                     **self._options)
            await self._quota_rt.start()
            loop = asyncio.get_running_loop()
            host = os.environ.get("TANGRAM_RAY_BIND") or ray.util.get_node_ip_address()
            self._server = await loop.create_server(self._new_conn, host, 0)
            self._host, self._port = host, self._server.sockets[0].getsockname()[1]
            self._ray_node_id = ray.get_runtime_context().get_node_id()
            self._reaper = loop.create_task(self._reap())
            if self.ends_with_job:
                self._spawn(self._end_with_job(ray.get_runtime_context().get_job_id()), name="job watch")
            self._started = True

    async def _end_with_job(self, job: str) -> None:
        """Shut down (agents included) and exit once the job that created this detached actor has
        ended: in an anonymous namespace nothing could reach it again."""
        await _wait_job_end(job)
        log.info("the Ray job %s that created Tangram %s/%s has ended: shutting down", job, self.namespace, self.name)
        try:
            await self.shutdown()
        finally:
            ray = require()
            ray.kill(ray.get_runtime_context().current_actor)

    def _new_conn(self) -> asyncio.Protocol:
        conn = _Conn(self, next(self._cids))
        self._unauthed[conn.id] = conn  # until its token: a silent one is dropped after ttl
        return conn.proto

    def _config(self) -> dict[str, Any]:
        return {"ttl": self.ttl, "heartbeat": self.heartbeat, "name": self.name,
                "nodes": {k: n.ray_node_id for k, n in self._nodes.items() if n.alive},
                "quotas": sorted(self._quotas)}

    async def endpoint(self) -> dict[str, Any]:
        """Where clients connect, with the secret they must present first (handed out over Ray)."""
        await self._ensure_started()
        return {"host": self._host, "port": self._port, "token": self._token,
                "fingerprint": self.fingerprint, "creator": self.creator, **self._config()}

    async def shutdown(self) -> None:
        """Fail every waiter, drop every client, stop every agent (their managers close)."""
        await self._ensure_started()
        for conn in list(self._conns.values()):
            if conn.proto.transport is not None:
                conn.proto.transport.abort()
        for node in list(self._nodes.values()):
            if node.alive:
                await self._remove(node, "the Tangram was shut down", close_agent=True)
        assert self._quota_rt is not None
        await self._quota_rt.aclose()
        if self._server is not None:
            self._server.close()

    def _spawn(self, coro: Any, name: str | None = None) -> asyncio.Task[Any]:
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ------------------------------------------------------------------------------ nodes
    async def add_node(
        self,
        label: str,
        ray_node_id: str,
        pool: Pool | Callable[[], Pool] | None = None,
        managers: Callable[[], Sequence[Manager]] | None = None,
        containers: Sequence[str] = (),
    ) -> NodeStatistics:
        """Start the agent for ``label`` on Ray node ``ray_node_id`` and add its pool (idempotent
        while the node is alive; a lost node may be added again)."""
        await self._ensure_started()
        # several workers of a job may get-or-create the pool at once: one agent per label
        lock = self._node_locks.setdefault(label, asyncio.Lock())
        async with lock:
            return await self._add_node(label, ray_node_id, pool, managers, containers)

    async def _add_node(self, label: str, ray_node_id: str, pool: Pool | Callable[[], Pool] | None,
                        managers: Callable[[], Sequence[Manager]] | None, containers: Sequence[str]) -> NodeStatistics:
        old = self._nodes.get(label)
        if old is not None and old.alive:
            return _node_stats(old)
        from .agent import NodeAgent

        ray = require()
        NodeAffinitySchedulingStrategy = require("ray.util.scheduling_strategies").NodeAffinitySchedulingStrategy

        agent_name = f"{self.name}.agent.{label}.{next(self._gen)}"
        me = ray.get_runtime_context().current_actor
        agent = ray.remote(NodeAgent).options(
            name=agent_name, namespace=self.namespace, num_cpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=ray_node_id, soft=False),
        ).remote(label, pool, managers, list(containers), me)
        try:
            # bounded like an agent's apply: an agent whose worker or managers never start held
            # this label's lock for good (every later add_node for it waited behind it)
            bound = None if self.agent_timeout is None else max(self.agent_timeout, _AGENT_START_MIN)
            info = await within(awaited(agent.start.remote()), bound,
                                lambda: f"node agent {agent_name} did not start within {bound:g} s "
                                        f"(agent_timeout, at least {_AGENT_START_MIN:g} s)")
        except TimeoutError as exc:
            ray.kill(agent)
            raise SchedulerBrokenError(str(exc)) from None
        except BaseException:
            ray.kill(agent)
            raise
        holder: dict[str, _Node] = {}
        rt = Tangram(info["pool"], managers=[_AgentManager(agent, label, self.agent_timeout)] if info["has_managers"] else [],
                     observers=[lambda ev, now, ds: self._observe_node(holder["n"], ds)], **self._options)
        await rt.start()
        node = _Node(label, info["ray_node_id"], agent, agent_name, rt, info)
        holder["n"] = node
        self._nodes[label] = node
        node.watch = self._spawn(self._watch(node))
        log.info("node %s added on %s: %s", label, ray_node_id, info["pool"].describe())
        return _node_stats(node)

    async def register_containers(self, label: str, names: Sequence[str]) -> None:
        await self._ensure_started()
        node = self._nodes.get(label)
        if node is None or not node.alive:
            raise SpecError(f"no live node {label!r}")
        for other in self._nodes.values():
            if other is not node:
                other.containers.difference_update(names)
        node.containers.update(names)

    async def remove_node(self, label: str, reason: str = "removed by the operator") -> None:
        await self._ensure_started()
        node = self._nodes.get(label)
        if node is not None and node.alive:
            await self._remove(node, reason, close_agent=True)

    async def _watch(self, node: _Node) -> None:
        try:
            await node.agent.watch.remote()
            reason = "its agent closed"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - ActorDiedError / node death, whatever Ray raises
            reason = f"its agent died ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        if node.alive:
            log.error("node %s lost: %s", node.label, reason)
            await self._remove(node, reason, close_agent=False)

    async def _remove(self, node: _Node, reason: str, *, close_agent: bool) -> None:
        """Take ``node`` out of the pool: running actions there are told ``lost`` (their quota units
        go back), queued ones fail with NodeLostError, the node runtime closes."""
        if not node.alive:
            return
        node.alive = False
        node.reason = reason
        # recorded before anyone is told: a client that sees NodeLostError then reads statistics
        # finds the node in lost_nodes
        self._lost_nodes.append({"node": node.label, "reason": reason, "at": time.time()})
        err = NodeLostError(f"node {node.label!r} left the pool: {reason}")
        for conn in list(self._conns.values()):
            for key, held in list(conn.held.items()):
                if held.node is node:
                    del conn.held[key]
                    held.nlease = None  # the node runtime goes away as a whole
                    held.granted = False  # counted as lost, not released
                    self.lost += 1
                    self._spawn(self._undo(held, failed=True), "undo")
                    conn.send(("lost", key, err))
        with anyio.CancelScope(shield=True):
            await node.rt.aclose()  # queued waiters: RuntimeClosedError -> NodeLostError in _phases
        if node.watch is not None and node.watch is not asyncio.current_task():
            node.watch.cancel()
        if close_agent:
            try:
                await within(node.agent.aclose.remote(), 10.0, lambda: f"node {node.label!r}: agent close took > 10 s")
            except Exception as exc:  # noqa: BLE001 - best effort: the agent is killed next anyway
                log.warning("node %s: agent did not close cleanly: %r", node.label, exc)
            require().kill(node.agent)

    def post_event(self, label: str, ev: Event) -> None:
        node = self._nodes.get(label)
        if node is not None and node.alive:
            node.rt.post(ev)

    # ------------------------------------------------------------------------------ observers
    def _observe_node(self, node: _Node, decisions: Sequence[Decision]) -> None:
        rt = node.rt
        node.peak_cpus = max(node.peak_cpus, len(node.pool.cpus) - rt.free_cpus)
        node.peak_gpus = max(node.peak_gpus, len(node.pool.gpus) - rt.free_gpus)
        free_memory = rt.free_memory
        if free_memory is not None and node.pool.memory is not None:
            node.peak_memory = max(node.peak_memory, node.pool.memory - free_memory)
        if self._check:
            try:
                rt.check_invariants()
            except AssertionError as exc:
                self._errors.append(f"node {node.label}: {exc}")

    def _observe_quota(self, events: Sequence[Event], now: float, decisions: Sequence[Decision]) -> None:
        assert self._quota_rt is not None
        rt = self._quota_rt
        for n, used in rt.quota_used.items():
            self._peak_quota[n] = max(self._peak_quota[n], used)
        if self._check:
            try:
                rt.check_invariants()
            except AssertionError as exc:
                self._errors.append(f"quotas: {exc}")

    # ------------------------------------------------------------------------------ data path
    def _on_message(self, conn: _Conn, msg: tuple[Any, ...]) -> None:
        op = msg[0]
        if op == "acq":
            _, key, kind, blob, timeout, hint, caller, *rest = msg
            within_s = rest[0] if rest else None  # seconds to the caller's deadline (newer clients)
            expected = rest[1] if len(rest) > 1 else None  # the caller's length hint (newer still)
            conn.pending[key] = self._spawn(self._acquire(conn, key, kind, blob, timeout, hint, caller, within_s,
                                                          expected))
        elif op == "rel":
            key = msg[1]
            held = conn.held.pop(key, None)
            if held is not None and len(msg) > 4 and held.nlease is not None:
                held.nlease.report_parallelism(msg[4])  # measured by the client's lease
            undo = None if held is None else self._release(held, failed=bool(msg[2]))
            if len(msg) > 3 and msg[3]:  # the client waits until the units are back (a failed action)
                self._ack(conn, key, undo)
        elif op == "cancel":
            key = msg[1]
            task = conn.pending.pop(key, None)
            if task is not None:
                task.cancel()
            held = conn.held.pop(key, None)
            undo = None if held is None else self._release(held, failed=True)
            if len(msg) > 2 and msg[2]:
                self._ack(conn, key, task if undo is None else undo)
        elif op == "tok":  # report_tokens for a held lease (by its id): correct the job's bucket
            _, gid, quota, used = msg
            held = next((h for h in conn.held.values() if h.gid == gid), None)
            if held is not None and held.qlease is not None and self._quota_rt is not None:
                try:
                    self._quota_rt.report_tokens(held.qlease, quota, used)
                except Exception as exc:  # noqa: BLE001 - a bad frame must not end the connection
                    log.warning("tokens report from client %s refused: %s", conn.id, exc)
        elif op == "hb":
            conn.send(("hb",))
        elif op == "stats":
            conn.send(("reply", msg[1], _cluster_statistics(self)))
        elif op == "hello":
            conn.info = dict(msg[1])
        else:
            log.warning("unknown message %r from client %s", op, conn.id)

    def _on_conn_lost(self, conn: _Conn, exc: Exception | None) -> None:
        self._conns.pop(conn.id, None)
        for task in conn.pending.values():
            task.cancel()
        conn.pending.clear()
        for held in conn.held.values():
            self._release(held, failed=True)
        if conn.held:
            log.warning("client %s (%s) went away holding %d lease(s); released", conn.id,
                        conn.info.get("pid"), len(conn.held))
        conn.held.clear()

    async def _reap(self) -> None:
        period = max(0.05, min(1.0, self.ttl / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn in list(self._conns.values()):
                if now - conn.last_seen > self.ttl and conn.proto.transport is not None:
                    self.expired += 1
                    log.warning("client %s (pid %s) silent for %.1f s > ttl %.1f s: releasing its leases",
                                conn.id, conn.info.get("pid"), now - conn.last_seen, self.ttl)
                    conn.proto.transport.abort()
            for conn in list(self._unauthed.values()):  # a probe, or a client frozen mid-handshake
                if now - conn.last_seen > self.ttl:
                    self._unauthed.pop(conn.id, None)
                    if conn.proto.transport is not None:
                        conn.proto.transport.abort()

    def _decode(self, kind: str, blob: bytes) -> ActionSpec:
        """The request's spec (see :func:`._specs._decode_spec`), kept in ``self._specs`` by its bytes."""
        return _decode_spec(self._specs, kind, blob)

    def _timed_out(self, spec: ActionSpec, timeout: float, held: _Held) -> str:
        """What the acquire waited for when its time ran out: quota units, or a node's resources."""
        qspec, nspec = _split(spec)
        head = f"{spec.kind}: not granted within {timeout:g} s by the scheduler actor {self.name!r}"
        if qspec is not None and held.qlease is None and self._quota_rt is not None:
            return f"{head}; {self._quota_rt.shortage(qspec)} in the job-wide quotas"
        node = held.route
        if nspec is not None and node is not None and node.alive:
            return f"{head}; {node.rt.shortage(nspec)} on node {node.label!r}"
        return head

    async def _acquire(self, conn: _Conn, key: int, kind: str, blob: bytes, timeout: float | None,
                       hint: str | None, caller: str | None, within_s: float | None = None,
                       expected: float | None = None) -> None:
        held = _Held(next(self._gids))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            spec = self._decode(kind, blob)
            if hint is not None and not isinstance(hint, str):
                raise SpecError(f"node must be None or a node label (str), got {hint!r}")
            limit = check_timeout(timeout)
            if within_s is not None and (isinstance(within_s, bool) or not isinstance(within_s, (int, float))
                                         or within_s != within_s):
                raise SpecError(f"deadline must travel as seconds from now (a number), got {within_s!r}")
            deadline = None if within_s is None else t0 + float(within_s)
            expected = check_expected(expected)
            # never asyncio.wait_for: it can return the phases' grant and drop the cancel that the
            # client's "cancel" delivered in the same iteration (3.10/3.11); `within` lets it win
            await within(self._phases(held, spec, hint, caller, deadline, expected), limit,
                         lambda: self._timed_out(spec, limit or 0.0, held))
        except asyncio.CancelledError:
            conn.pending.pop(key, None)
            await self._undo(held, failed=True)
            raise
        except BaseException as exc:
            conn.pending.pop(key, None)
            await self._undo(held, failed=True)
            self.failed_acquires += 1
            conn.send(("err", key, _wire.portable_error(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        conn.pending.pop(key, None)
        if conn.closed:
            await self._undo(held, failed=True)
            return
        conn.held[key] = held
        held.granted = True
        self.granted += 1
        nl, ql = held.nlease, held.qlease
        node = held.node
        if nl is not None and (nl.malleable or nl.restartable):  # resized or restarted by the node runtime: tell the client
            nl.on_resize(functools.partial(self._resized, conn, key, held))
        fields = {
            "id": held.gid,
            "node": None if node is None else node.label,
            "ray_node_id": None if node is None else node.ray_node_id,
            "agent": None if node is None or nl is None or "agent_keys" not in nl.attached() else node.agent_name,
            "agent_keys": [] if nl is None or "agent_keys" not in nl.attached() else nl.attachment("agent_keys"),
            "node_aid": None if nl is None else nl.action_id,
            "cpus": () if nl is None else nl.cpus,
            "gpus": () if nl is None else nl.gpus,
            "units": 0 if nl is None else nl.units,
            "workers": 0 if nl is None else nl.workers,
            "memory": 0 if nl is None else nl.memory,
            "counted": () if nl is None else tuple(sorted(nl.counted.items())),
            "quotas": tuple(sorted(ql.quotas.items())) if ql is not None else (),
            "queued_s": loop.time() - t0,
        }
        conn.send(("grant", key, fields))

    @staticmethod
    def _resized(conn: _Conn, key: int, held: _Held, lease: Lease) -> None:
        """A node runtime applied a Resize to the node part of a client's lease (the agent's
        managers have run it): send the client its new cores, unless that lease was released or
        lost meanwhile (the client ignores a late one too)."""
        if conn.closed or conn.held.get(key) is not held:
            return
        conn.send(("rsz", key, tuple(lease.cpus), lease.units))

    async def _phases(self, held: _Held, spec: ActionSpec, hint: str | None, caller: str | None,
                      deadline: float | None = None, expected: float | None = None) -> None:
        """Quota part, then node part; ``deadline`` (this loop's clock) bounds both grants;
        ``expected`` (a length hint) goes to the node part, where the cores are sized."""
        qspec, nspec = _split(spec)
        node = _route(self._nodes, nspec, hint, caller) if nspec is not None else None  # fail fast, before quotas
        held.route = node
        try:
            if qspec is not None:
                assert self._quota_rt is not None
                held.qlease = await self._quota_rt.acquire_lease(qspec, deadline=deadline)
            if node is not None and nspec is not None:
                if not node.alive:
                    raise NodeLostError(f"node {node.label!r} left the pool: {node.reason}")
                try:
                    lease = await node.rt.acquire_lease(nspec, deadline=deadline, expected_s=expected)
                except (RuntimeClosedError, TangramError, Exception) as exc:
                    if not node.alive:
                        raise NodeLostError(f"node {node.label!r} left the pool: {node.reason}") from exc
                    raise
                held.nlease, held.node = lease, node
                if not node.alive:
                    raise NodeLostError(f"node {node.label!r} left the pool: {node.reason}")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._undo(held, failed=True)
            raise

    def _release(self, held: _Held, *, failed: bool) -> asyncio.Task[Any] | None:
        """Release a lease now when no manager must run (no await: the units are back before the
        next frame is read), else in an ``undo`` task (returned)."""
        if not self._undo_now(held, failed=failed):
            return self._spawn(self._undo(held, failed=failed), "undo")
        return None

    @staticmethod
    def _ack(conn: _Conn, key: int, pending: asyncio.Task[Any] | None) -> None:
        """Tell the client its units are back: now, or once ``pending`` (the cancelled acquire, or
        the undo of a held lease) has given them back. The client's cancel or failure waits for
        this (bounded), so it propagates only after the pool has the units again."""
        if pending is None or pending.done():
            conn.send(("ack", key))
        else:
            pending.add_done_callback(lambda _t: conn.send(("ack", key)))

    def _undo_now(self, held: _Held, *, failed: bool) -> bool:
        nl, ql, node = held.nlease, held.qlease, held.node
        if nl is not None and node is not None and node.alive and not node.rt.release_nowait(nl, failed=failed):
            return False  # the node's agent must undo its managers' work first: _undo does both
        held.nlease = None
        if ql is not None:
            assert self._quota_rt is not None
            if not self._quota_rt.release_nowait(ql, failed=failed):
                return False  # _undo releases the quota part (the node part is done)
        held.qlease = None
        if held.granted and (nl is not None or ql is not None):
            self.released += 1
        return True

    async def _undo(self, held: _Held, *, failed: bool) -> None:
        """Release both parts of a lease, node part first (the reverse of acquisition)."""
        nl, ql, node = held.nlease, held.qlease, held.node
        held.nlease = held.qlease = None
        with anyio.CancelScope(shield=True):
            if nl is not None and node is not None and node.alive:
                try:
                    await node.rt.release(nl, failed=failed)
                except Exception:
                    log.exception("releasing lease %s on node %s failed", held.gid, node.label)
            if ql is not None and self._quota_rt is not None:
                try:
                    await self._quota_rt.release(ql, failed=failed)
                except Exception:
                    log.exception("releasing the quota part of lease %s failed", held.gid)
        if held.granted and (nl is not None or ql is not None):
            self.released += 1

    # ------------------------------------------------------------------------------ inspection
    async def statistics(self) -> ClusterStatistics:
        await self._ensure_started()
        return _cluster_statistics(self)

    async def check_invariants(self) -> list[str]:
        """Every runtime's ledger checks, plus: what the actor thinks clients hold is what the
        schedulers think is running (meaningful when no acquire is in flight)."""
        await self._ensure_started()
        undoing = [t for t in self._tasks if t.get_name().startswith("undo")]
        if undoing:  # releases in flight: let them land first
            await asyncio.wait(undoing, timeout=5)
        return _invariant_errors(self)
