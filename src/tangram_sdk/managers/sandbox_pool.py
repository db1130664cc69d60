"""A pool of warm sandbox containers, one per trajectory, created already parked.

Why a module of its own: :class:`~tangram_sdk.managers.cpu.DockerCpuManager` grants and parks
containers it is handed; making and removing them (names, create tokens, creates a frozen daemon
may still carry out, the ``max_sandboxes`` / ``create_rate`` quotas it waits on) is a separate
job with its own failure cases. It reaches into the manager it is given for those quotas and its
container records, and is re-exported from ``managers.cpu``, where it used to live.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._cpuset import format_cpuset
from .._deadline import check_timeout
from ..errors import DockerError, SpecError
from ._docker import MIN_MEMORY, is_not_found, never_sent, validate_ref

if TYPE_CHECKING:
    from .cpu import DockerCpuManager

__all__ = ["Sandbox", "SandboxPool"]

log = logging.getLogger("tangram_sdk.managers.cpu")  # the name it logged under before the split

_CREATE_LABEL = "tangram_sdk.create"  # a token per create call (SandboxPool._make)


class Sandbox:
    """One warm container of a SandboxPool: pass ``sandbox.id`` as ``ActionSpec(container=...)``."""

    __slots__ = ("created", "id", "name")

    def __init__(self, id: str, name: str, created: bool) -> None:
        self.id = id
        self.name = name
        self.created = created

    def __repr__(self) -> str:
        return f"<Sandbox {self.name or self.id[:12]}{'' if self.created else ' adopted'}>"


_UNSET: Any = object()


class SandboxPool:
    """A set of parked containers, one per trajectory.

    ``await SandboxPool.create(manager, image=..., count=N)`` creates and starts N containers
    running ``cmd`` (a long sleep), already parked, with no network and the ``tangram_sdk=1``
    label; ``await pool.add()`` creates one more on demand and ``await pool.remove(sandbox)``
    removes one (both under the manager's ``max_sandboxes`` / ``create_rate``);
    ``SandboxPool.adopt(manager, ids)`` takes existing ones (parked on first use, outside the cap).
    ``aclose()`` (or ``async with``) removes what it created — never adopted containers.
    """

    def __init__(self, manager: DockerCpuManager, sandboxes: Sequence[Sandbox]) -> None:
        self.manager = manager
        self.sandboxes = list(sandboxes)
        self._recipe: dict[str, Any] | None = None  # how create() made its containers, for add()
        self._next = len(self.sandboxes)
        # names whose create failed but may still be carried out (a daemon that did not answer in
        # time): removed by name once it answers, and again at aclose
        self._maybe_made: dict[str, str] = {}  # name -> the create's token (_CREATE_LABEL)
        self._late: set[asyncio.Task[None]] = set()

    @classmethod
    async def create(
        cls,
        manager: DockerCpuManager,
        *,
        image: str,
        count: int,
        cmd: Sequence[str] = ("sleep", "infinity"),
        name_prefix: str | None = None,
        memory: int | None = None,
        env: dict[str, str] | None = None,
        init: bool = True,
        concurrency: int = 8,
        timeout: float | None = _UNSET,
    ) -> SandboxPool:
        """Create ``count`` containers concurrently; on any failure remove those made and raise.

        Each creation first waits for the manager's sandbox quotas; ``timeout`` (default: the
        manager's ``create_timeout``) bounds those waits for the whole batch (TimeoutError). A
        ``count`` above ``max_sandboxes`` is refused at once (SpecError)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SpecError(f"count must be an int >= 0, got {count!r}")
        if name_prefix is not None:
            validate_ref(name_prefix)
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or memory < MIN_MEMORY):
            raise SpecError(f"memory must be None or an int of bytes >= 6 MiB (Docker's minimum), got {memory!r}")
        limit = manager.create_timeout if timeout is _UNSET else check_timeout(timeout)
        manager._gate.check_fits(count)
        pool = cls(manager, [])
        pool._recipe = {"image": image, "cmd": tuple(cmd), "name_prefix": name_prefix, "memory": memory,
                        "env": None if env is None else dict(env), "init": init}
        pool._next = count
        gate = asyncio.Semaphore(max(1, concurrency))
        slots: list[Sandbox | None] = [None] * count
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit

        async def one(i: int) -> None:
            async with gate:
                slots[i] = await pool._make(i, None if deadline is None else max(0.0, deadline - loop.time()))

        try:
            results = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        except BaseException:
            await asyncio.shield(pool.aclose())
            raise
        pool.sandboxes = [s for s in slots if s is not None]  # index order, whatever finished first
        return pool

    async def _make(self, i: int, timeout: float | None) -> Sandbox:
        """Admit (quotas), create, start and register container number ``i`` of this pool."""
        assert self._recipe is not None
        manager, r = self.manager, self._recipe
        # always a name of ours: a create the daemon carries out after we gave up on it (frozen, or
        # dying between doing it and answering) can then be found and removed; an unnamed one leaked
        name = f"{r['name_prefix']}-{i}" if r["name_prefix"] else f"tangram-{uuid.uuid4().hex[:16]}"
        token = uuid.uuid4().hex  # this create's own mark: a name can be another pool's container
        await manager._gate.admit(timeout)
        try:
            cid = await manager.client.create(
                r["image"], r["cmd"], name=name, cpuset=format_cpuset(manager.park_cpus),
                cpu_quota=manager.park_quota_us, cpu_period=manager.period_us,
                memory=r["memory"], env=r["env"], init=r["init"], labels={_CREATE_LABEL: token},
            )
        except BaseException as exc:
            manager._gate.release()  # nothing was made (yet)
            answered = isinstance(exc, DockerError) and (never_sent(exc) or exc.status is not None)
            if not answered:  # no answer (or cancelled mid-call): the daemon may still make it
                self._maybe_made[name] = token
                task = asyncio.ensure_future(self._remove_late(name))
                self._late.add(task)
                task.add_done_callback(self._late.discard)
            raise
        sandbox = Sandbox(cid, name, True)
        self.sandboxes.append(sandbox)  # so aclose() removes it (and frees its slot) even if start fails
        await manager.client.start(cid)
        manager.register(cid, name)
        return sandbox

    async def _remove_late(self, name: str) -> None:
        """Remove the container ``name`` if a create we gave up on made it after all: try for a
        minute (a daemon that was frozen answers again; the create it still had runs first), then
        leave the rest to :meth:`aclose`."""
        for wait in (1.0, 2.0, 4.0, 8.0, 15.0, 30.0):
            await asyncio.sleep(wait)
            token = self._maybe_made.get(name)
            if token is None:
                return
            try:
                if await self._remove_if_ours(name, token):
                    self._maybe_made.pop(name, None)
                    return
            except DockerError:
                continue  # still not answering
            if wait >= 4.0:  # answering, and not made after a few seconds of answers
                self._maybe_made.pop(name, None)
                return

    async def _remove_if_ours(self, name: str, token: str) -> bool:
        """Remove container ``name`` if the create that carried ``token`` made it (True); False
        when there is none by that name, or it is another's."""
        try:
            info = await self.manager.client.inspect(name)
        except DockerError as exc:
            if is_not_found(exc):
                return False
            raise
        if info.labels.get(_CREATE_LABEL) != token:
            return False
        await self.manager.client.remove(info.id)
        return True

    async def add(self, *, timeout: float | None = _UNSET) -> Sandbox:
        """Create one more container like the others, on demand, under the manager's
        ``max_sandboxes`` and ``create_rate`` (waiting at most ``timeout`` s, default the manager's
        ``create_timeout``, then TimeoutError). Only for pools made by :meth:`create`."""
        if self._recipe is None:
            raise SpecError("add() needs a pool made by SandboxPool.create (an adopted pool has no image)")
        limit = self.manager.create_timeout if timeout is _UNSET else check_timeout(timeout)
        i = self._next
        self._next += 1
        known = {id(s) for s in self.sandboxes}
        try:
            return await self._make(i, limit)
        except BaseException:
            for s in [s for s in self.sandboxes if id(s) not in known]:  # created, but start failed
                try:
                    await asyncio.shield(self.remove(s))
                except Exception:  # noqa: BLE001 - the original error matters more; aclose retries
                    log.warning("could not remove half-made sandbox %s", s.id[:12], exc_info=True)
            raise

    async def remove(self, sandbox: Sandbox) -> None:
        """Remove one container this pool created (its slot under ``max_sandboxes`` frees once
        it is gone); adopted ones are only dropped from the pool."""
        if sandbox not in self.sandboxes:
            raise SpecError(f"{sandbox!r} is not in this pool")
        if sandbox.created:
            await self.manager.client.remove(sandbox.id)
            self.manager.unregister(sandbox.id)
            self.manager._gate.release()
        self.sandboxes.remove(sandbox)

    @classmethod
    async def adopt(cls, manager: DockerCpuManager, ids: Sequence[str]) -> SandboxPool:
        """Take existing running containers (DockerError naming any that is unknown or stopped)."""
        out = []
        for ref in ids:
            box = await manager._box(validate_ref(ref))
            out.append(Sandbox(box.id, ref if ref != box.id else "", False))
        return cls(manager, out)

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.sandboxes]

    def __len__(self) -> int:
        return len(self.sandboxes)

    def __getitem__(self, i: int) -> Sandbox:
        return self.sandboxes[i]

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(self.sandboxes)

    def __repr__(self) -> str:
        made = sum(s.created for s in self.sandboxes)
        return f"<SandboxPool {len(self.sandboxes)} containers ({made} created, {len(self) - made} adopted)>"

    async def aclose(self) -> None:
        """Remove every container this pool created (all attempted; the first failure re-raised;
        those not removed stay in the pool, still counted under ``max_sandboxes``, so a second
        ``aclose`` retries them)."""
        created = [s for s in self.sandboxes if s.created]
        late = sorted(self._maybe_made.items())  # creates that failed but may have been carried out
        self._maybe_made.clear()
        for t in list(self._late):
            t.cancel()
        results = await asyncio.gather(*(self.manager.client.remove(s.id) for s in created), return_exceptions=True)
        for (name, _token), r in zip(late, await asyncio.gather(*(self._remove_if_ours(n, k) for n, k in late),
                                                                  return_exceptions=True)):
            if isinstance(r, BaseException):
                log.warning("could not remove container %s whose create timed out: %s", name, r)
        failed = {s.id for s, r in zip(created, results) if isinstance(r, BaseException)}
        for s in created:
            if s.id not in failed:
                self.manager.unregister(s.id)
                self.manager._gate.release()
        self.sandboxes = [s for s in self.sandboxes if not s.created or s.id in failed]
        if self.manager._closed:
            await self.manager.client.close()  # the manager closed first; do not leak our session
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def __aenter__(self) -> SandboxPool:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await asyncio.shield(self.aclose())
        except Exception:
            if et is None:
                raise
            log.warning("could not remove every sandbox while handling %s", et.__name__, exc_info=True)
