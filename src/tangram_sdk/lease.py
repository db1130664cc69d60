"""What an action holds while it runs: concrete cores and GPUs, elastic units, timings, and
whatever handles the managers attached (a container to exec in, a restored GPU service)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from .errors import ManagerError
from .process import ExecResult, MemoryScope, PinnedGroups, check_env, run_pinned
from .spec import ActionSpec, malleable_workers

if TYPE_CHECKING:
    from .pool import Pool

__all__ = ["THREAD_ENV_VARS", "Command", "ExecResult", "Lease", "thread_env"]

Command = Union[Sequence[str], Callable[["Lease"], Sequence[str]]]
"""What ``lease.run``/``lease.exec`` take: an argv list, or a function of the lease returning one,
called at each start (a restartable lease runs it again with ``lease.units`` of the new grant:
``lambda lease: ["pytest", "-n", str(lease.units)]``)."""

log = logging.getLogger("tangram_sdk")

# Libraries that size their thread pools from the host's core count unless told otherwise; inside a
# cpuset-limited sandbox that oversubscribes the granted cores (NeMo-Gym cut sandbox-fatal failures
# by ~94 % by capping these).
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",         # OpenMP: numpy/scipy builds, torch CPU ops, scikit-learn, many C/C++ tools
    "MKL_NUM_THREADS",         # Intel MKL
    "OPENBLAS_NUM_THREADS",    # OpenBLAS (numpy's default wheel BLAS)
    "BLIS_NUM_THREADS",        # BLIS / AOCL
    "VECLIB_MAXIMUM_THREADS",  # Apple Accelerate
    "NUMEXPR_NUM_THREADS",     # numexpr (pandas eval)
    "NUMEXPR_MAX_THREADS",
    "RAYON_NUM_THREADS",       # Rust rayon (polars, tokenizers, ruff, ...)
    "POLARS_MAX_THREADS",
    "TOKIO_WORKER_THREADS",    # Rust tokio runtimes
    "GOMAXPROCS",              # Go
    "JULIA_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",  # TensorFlow
    "CARGO_BUILD_JOBS",        # cargo builds
)


def thread_env(cores: int) -> dict[str, str]:
    """Every :data:`THREAD_ENV_VARS` set to ``cores`` (empty when ``cores`` < 1)."""
    return {} if cores < 1 else dict.fromkeys(THREAD_ENV_VARS, str(cores))


def grow_ceiling(spec: ActionSpec, cpus: tuple[int, ...], pool: Pool | None) -> int | None:
    """The most cores a malleable lease on ``cpus`` can be grown to (its NUMA node's size), for
    :attr:`Lease.workers`; None for any other lease or an unknown pool (nothing to compute)."""
    e = spec.elastic
    if pool is None or not cpus or e is None or not e.malleable:
        return None
    return pool.node_cores(cpus[0])


class Lease:
    """The grant an action holds inside ``async with tangram.acquire(spec) as lease``.

    ``cpus``/``gpus`` are concrete ids (exclusive while held), ``units`` the elastic units granted
    (use it as ``-j N``/``-n N``; on a malleable lease use :attr:`workers`), ``queued_s`` how long
    the action waited. ``counted``: the units taken from the pool's counted kinds, by name
    (``lease.counted["sandbox_slots"]``; the spec's ``needs``, plus ``memory`` where the pool counts
    it), returned with the lease.

    A *malleable* lease (``Elasticity(..., malleable=True)``) may be resized while it runs:
    ``cpus``/``units`` always say what it holds now, ``resizes`` counts the resizes applied,
    :meth:`on_resize` callbacks run after each, and :meth:`run` commands follow the new cores.
    A *restartable* lease (``Elasticity(..., restartable=True)``) may be restarted once on more
    cores: the :meth:`run`/:meth:`exec` command in progress is killed and run again on the new
    ``cpus`` (a command given as a function of the lease is rebuilt for the new ``units``);
    ``restarts`` counts them, and :meth:`on_resize` callbacks run after each.
    """

    __slots__ = ("action_id", "spec", "cpus", "gpus", "units", "memory", "quotas", "counted", "queued_s",
                 "granted_at", "resizes", "restarts", "_attached", "_memscope", "_cpu_s", "_run_s", "_groups",
                 "_on_resize", "_runs", "_ceiling", "_granter")

    def __init__(
        self,
        action_id: int,
        spec: ActionSpec,
        cpus: tuple[int, ...],
        gpus: tuple[int, ...],
        units: int,
        memory: int,
        quotas: tuple[tuple[str, int], ...],
        queued_s: float,
        granted_at: float,
        counted: tuple[tuple[str, int], ...] = (),
        ceiling: int | None = None,
    ) -> None:
        self.action_id = action_id
        self.spec = spec
        self.cpus = cpus
        self.gpus = gpus
        self.units = units
        self.memory = memory
        self.quotas = dict(quotas) if quotas else {}  # a literal: most grants hold no quota
        self.counted: dict[str, int] = dict(counted) if counted else {}
        self.queued_s = queued_s
        self.granted_at = granted_at
        self._attached: dict[str, Any] | None = None  # made on first attach (most leases have none)
        self._memscope: MemoryScope | None = None  # shared by this lease's runs
        self._cpu_s = 0.0  # CPU and wall seconds of this lease's measured runs (parallelism)
        self._run_s = 0.0
        self.resizes = 0  # resizes applied (malleable and restartable leases only)
        self.restarts = 0  # restarts applied (restartable leases only)
        self._runs: set[asyncio.Future[ExecResult]] | None = None  # commands in progress (restartable leases)
        self._groups: PinnedGroups | None = None  # live lease.run commands, re-pinned on resize
        self._on_resize: list[Callable[[Lease], None]] | None = None
        self._ceiling = ceiling  # the most cores a grow can give it (its NUMA node), None: unknown
        self._granter: object = None  # the Tangram that granted it (set by the runtime): release checks it

    # -- malleability ---------------------------------------------------------------------------
    @property
    def malleable(self) -> bool:
        """The scheduler may resize this lease while it runs (its spec says ``malleable=True``)."""
        e = self.spec.elastic
        return e is not None and e.malleable

    @property
    def restartable(self) -> bool:
        """The scheduler may restart this lease's command on more cores (its spec says
        ``restartable=True``)."""
        e = self.spec.elastic
        return e is not None and e.restartable

    def on_resize(self, fn: Callable[[Lease], None]) -> Callable[[Lease], None]:
        """Call ``fn(lease)`` (sync, on the event loop) after each resize of this lease is applied,
        e.g. to resize a thread pool to ``len(lease.cpus)``. An ``fn`` that raises is logged and
        the others still run. Returns ``fn`` (usable as a decorator)."""
        if not callable(fn):
            raise TypeError(f"on_resize needs a callable, got {fn!r}")
        if self._on_resize is None:
            self._on_resize = []
        self._on_resize.append(fn)
        return fn

    def _resize(self, cpus: tuple[int, ...], units: int) -> None:
        """The runtime's half of a Resize: the lease says what it holds now, at once."""
        self.cpus = cpus
        self.units = units
        if self._groups is not None:
            self._groups.target = cpus  # a command spawning from now on starts on these

    def _resized(self) -> None:
        """After the managers applied a resize: move running commands (kill them, on a
        restartable lease: :meth:`_attempts` runs them again), then tell the callbacks."""
        self.resizes += 1
        if self.restartable:
            self.restarts += 1
            for task in list(self._runs or ()):
                task.cancel()
        if self._groups is not None:
            try:
                self._groups.repin(self.cpus)
            except Exception:  # noqa: BLE001 - /proc vanished under us: the commands run on what they have
                log.exception("lease %s: re-pinning its commands after a resize failed", self.action_id)
        for fn in list(self._on_resize or ()):
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - a user callback must not break the resize or the action
                log.exception("lease %s: on_resize callback %r raised", self.action_id, fn)

    # -- for managers ---------------------------------------------------------------------------
    def attach(self, key: str, value: Any) -> None:
        """Managers hang handles here (``"exec"``, ``"service"``, ``"call"``, ``"container"``)."""
        if self._attached is None:
            self._attached = {}
        self._attached[key] = value

    def attached(self) -> tuple[str, ...]:
        """The keys managers attached (sorted), e.g. ``("container", "exec")``."""
        return tuple(sorted(self._attached or ()))

    def attachment(self, key: str) -> Any:
        attached = self._attached
        if attached is not None and key in attached:
            return attached[key]
        raise ManagerError(
            f"no manager attached {key!r} to this lease (spec kind={self.spec.kind!r}); "
            f"add the matching manager to Tangram(managers=[...])",
            resource=key,
        )

    # -- what actions use -----------------------------------------------------------------------
    @property
    def service(self) -> Any:
        """The GPU service (e.g. a torch module) restored onto ``gpus`` for this action."""
        return self.attachment("service")

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        """Call the GPU service on the granted devices (runs off the event loop)."""
        fn = self.attachment("call")
        return await fn(*args, **kwargs)

    @property
    def workers(self) -> int:
        """How many workers or threads a command should start (``make -j``, ``pytest -n``, a pool).

        The cores held, except on a malleable lease: there the most cores a grow can give it (its
        spec's ``max_units``, within its NUMA node). Workers sized to the grant cannot use cores
        added mid-run; until a grow the others share the cores held, and each pays its start-up
        then. Free for threads and ``make``; a runner whose workers import for a while may start
        fewer, e.g. ``malleable_workers(len(lease.cpus), lease.workers, 2)``
        (:func:`~tangram_sdk.spec.malleable_workers`)."""
        held = len(self.cpus)
        e = self.spec.elastic
        if not held or e is None or not e.malleable:  # malleable is CPU only (Elasticity checks)
            return held
        most = e.max_units if self._ceiling is None else min(e.max_units, self._ceiling)
        return malleable_workers(held, most)

    def thread_env(self) -> dict[str, str]:
        """The thread-cap variables ``exec``/``run`` add: each of :data:`THREAD_ENV_VARS` set to
        :attr:`workers` (the granted cores; on a malleable lease the most it may be grown to, so
        its thread pools can use the cores a grow adds); none when the lease holds no cores."""
        return thread_env(self.workers)

    async def exec(
        self, cmd: Command, *, timeout: float | None = None, max_output: int = 1 << 20,
        env: Mapping[str, str] | None = None, thread_caps: bool = True, **kw: Any
    ) -> ExecResult:
        """Run ``cmd`` (an argv list, never a shell string, or a function of the lease returning
        one) inside the action's container.

        The command sees :meth:`thread_env` (OMP_NUM_THREADS=<granted cores> and the like) on top
        of the container's environment, and ``env`` on top of that (your values win);
        ``thread_caps=False`` adds none. ``stdin=`` (bytes or str) is fed to it, then end of file;
        ``workdir=``/``user=`` as for ``docker exec``. A command killed for memory raises
        ActionOOMError. On a restartable lease a restart kills it and runs it again (``timeout``
        counts per run)."""
        env = check_env(env)  # before the merge below: a SpecError, not Docker's reading of it
        fn = self.attachment("exec")
        if not thread_caps:
            kw["thread_caps"] = False  # a remote lease's agent must not add them back

        async def once() -> ExecResult:
            merged = {**(self.thread_env() if thread_caps else {}), **(env or {})}
            out: ExecResult = await fn(self._argv(cmd), timeout=timeout, max_output=max_output,
                                       env=merged or None, **kw)
            return out

        result = await self._attempts(once)
        self._measured(result)
        return result

    async def run(
        self, cmd: Command, *, timeout: float | None = None, max_output: int = 1 << 20,
        env: Mapping[str, str] | None = None, thread_caps: bool = True, **kw: Any
    ) -> ExecResult:
        """Run ``cmd`` (an argv list, or a function of the lease returning one) as a local
        subprocess pinned to ``lease.cpus`` (no Docker needed); on a malleable lease it follows
        resizes (every process of its group and their threads), on a restartable one a restart
        kills it and runs it again on the new cores (``timeout`` counts per run).

        Its environment is ``env`` when given, else this process's; :meth:`thread_env` is added
        under it (a variable ``env`` sets wins; one merely inherited is overridden), unless
        ``thread_caps=False``. ``lease.memory`` > 0 holds the command to that many bytes where
        the platform allows (``tangram_sdk.process.memory_enforcement()``); a command
        killed for memory raises ActionOOMError."""
        env = check_env(env)
        memory = None
        if self.memory > 0:
            if self._memscope is None:
                self._memscope = MemoryScope(self.memory)
            memory = self._memscope
        groups = None
        if self.malleable:  # its commands follow resizes (re-pinned, threads included)
            if self._groups is None:
                self._groups = PinnedGroups(self.cpus)
            groups = self._groups

        async def once() -> ExecResult:
            caps = self.thread_env() if thread_caps else {}
            if env is None:
                full: Mapping[str, str] | None = {**os.environ, **caps} if caps else None
            else:
                full = {**caps, **env}
            return await run_pinned(self._argv(cmd), self.cpus, timeout=timeout, max_output=max_output,
                                    env=full, memory=memory, groups=groups, **kw)

        result = await self._attempts(once)
        self._measured(result)
        return result

    def _argv(self, cmd: Command) -> Sequence[str]:
        """``cmd`` as an argv for the lease as it is now (a function of the lease is called)."""
        return cmd(self) if callable(cmd) else cmd

    async def _attempts(self, once: Callable[[], Awaitable[ExecResult]]) -> ExecResult:
        """``await once()``; on a restartable lease, again each time a restart killed it (the
        command's task is cancelled by :meth:`_resized`: ``run_pinned`` and the Docker exec kill
        the command's processes on cancel). A cancel of the caller always wins: the command is
        killed and the CancelledError goes on."""
        if not self.restartable:
            return await once()
        while True:
            before = self.restarts
            task = asyncio.ensure_future(once())
            if self._runs is None:
                self._runs = set()
            self._runs.add(task)
            try:
                await asyncio.wait([task])  # unlike awaiting the task, our own cancel stays ours
            except BaseException:
                task.cancel()  # the caller is cancelled: the command dies with it
                await asyncio.wait([task])
                raise
            finally:
                self._runs.discard(task)
            if task.cancelled() and self.restarts != before:
                continue  # killed by a restart: run it again on the new cores
            return task.result()

    def _measured(self, result: ExecResult) -> None:
        # a manager's exec may return its own result type: only an ExecResult's numbers count
        cpu = getattr(result, "cpu_s", None)
        wall = getattr(result, "duration_s", None)
        if isinstance(cpu, float) and isinstance(wall, (int, float)) and wall > 0:
            self._cpu_s += cpu
            self._run_s += wall

    @property
    def parallelism(self) -> float | None:
        """Cores' worth of work this lease's :meth:`run` and :meth:`exec` commands got (their CPU seconds over
        their wall seconds), None before one finished. Released with the lease, it tells the
        scheduler what a grant of this size really delivered (a busy machine, a tool that uses
        one core of four), so the next grants of the kind are sized by that."""
        return self._cpu_s / self._run_s if self._run_s > 0 else None

    def report_parallelism(self, parallelism: float | None) -> None:
        """Say what the action's work really got, in cores' worth, when it ran outside
        :meth:`run`/:meth:`exec` (your own executor, a remote worker): it replaces what they
        measured. Anything but a finite number > 0 is ignored (the declared model stands)."""
        if (isinstance(parallelism, (int, float)) and not isinstance(parallelism, bool)
                and math.isfinite(parallelism) and parallelism > 0):
            self._cpu_s, self._run_s = float(parallelism), 1.0

    def __repr__(self) -> str:
        from ._cpuset import format_cpuset

        parts = [f"#{self.action_id} {self.spec.kind}"]
        if self.cpus:
            parts.append(f"cpus={format_cpuset(self.cpus)}")
        if self.gpus:
            parts.append(f"gpus={list(self.gpus)}")
        if self.spec.elastic is not None:
            parts.append(f"units={self.units}")
        parts.append(f"queued={self.queued_s * 1e3:.1f}ms")
        return f"<Lease {' '.join(parts)}>"
