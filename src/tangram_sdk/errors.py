"""The whole exception tree of tangram_sdk, in one place (each class is also re-exported where
it is raised: ``tangram_sdk``, ``tangram_sdk.ray``, ``tangram_sdk.sim``, ``tangram_sdk.integrations``).

::

    TangramError
    ├── SpecError (also ValueError)        a spec or pool that is invalid on its face
    │   └── SpecMappingError               a tool call's arguments do not map to an ActionSpec (adapters)
    ├── InfeasibleSpecError                valid, but can never fit this pool: raised by acquire at once
    ├── DeadlineError (also TimeoutError)  cannot start, or did not start, before acquire's deadline
    ├── RuntimeClosedError                 acquire on a Tangram that is not running
    ├── SchedulerBrokenError               the scheduling task died; every waiter gets this with the cause
    ├── UsageError (also RuntimeError)     the API used in a way it cannot serve: an acquire() context
    │                                      entered twice, a Tangram's acquire on another event loop
    ├── IntegrationUnavailable             an adapter's framework (veRL, OpenRLHF, torch...) is not
    │   (also ImportError)                 installed; names the pip command
    ├── RayNotInstalledError               ``tangram_sdk.ray`` used without the ``ray`` extra
    │   (also ImportError)
    ├── LeaseLostError                     the Ray scheduler took a held lease back (link lost, TTL, death)
    │   └── NodeLostError                  ...because the lease's node (its agent) died
    ├── TraceError (also ValueError)       a simulator trace line that cannot be replayed (names the line)
    └── ManagerError                       a resource manager failed to apply or release a grant
        ├── DockerError                    the Docker daemon / a container failed (names the container)
        ├── CgroupError                    a cgroup file could not be read or written (names the path)
        │   └── MemoryBusyError            a memory limit below what the cgroup holds and cannot free
        ├── DeviceError                    a GPU restore/evict failed (names service and device)
        ├── ActionOOMError                 an action's command was killed for memory (names the
        │                                  container or cgroup, the limit and the peak)
        └── QuarantineError                a release could not be undone yet: the units stay out of
                                           the pool until the resource is verifiably restored

Timeouts stay the builtin :class:`TimeoutError`; cancellation is never swallowed.
Foreign errors (aiodocker, OSError, torch) are translated into ManagerError subclasses at the
manager boundary, with the original chained as ``__cause__``. This module imports nothing of the
package, so any module may import it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ActionOOMError",
    "CgroupError",
    "DeadlineError",
    "DeviceError",
    "DockerError",
    "InfeasibleSpecError",
    "IntegrationUnavailable",
    "LeaseLostError",
    "ManagerError",
    "MemoryBusyError",
    "NodeLostError",
    "QuarantineError",
    "RayNotInstalledError",
    "RuntimeClosedError",
    "SchedulerBrokenError",
    "SpecError",
    "SpecMappingError",
    "TangramError",
    "TraceError",
    "UsageError",
]


class TangramError(Exception):
    """Root of every error this SDK raises on purpose."""


class SpecError(TangramError, ValueError):
    """An ActionSpec, Pool or Quota is invalid (negative, NaN, unknown name, bad range)."""


class SpecMappingError(SpecError):
    """A tool call's arguments could not be mapped to an ActionSpec (reported to the agent)."""


class InfeasibleSpecError(TangramError):
    """The spec is valid but can never be granted by this pool (e.g. 9 GPUs on an 8-GPU pool)."""


class DeadlineError(TangramError, TimeoutError):
    """``acquire(spec, deadline=t)``: the scheduler estimates the action cannot start by ``t``
    (raised at once), or it was still queued at ``t`` (raised then). A TimeoutError too, so code
    that already handles timeouts handles this."""


class RuntimeClosedError(TangramError):
    """acquire() was called on a Tangram that has not started or has already exited."""


class SchedulerBrokenError(TangramError):
    """The scheduler task died; waiters get this instead of hanging. ``__cause__`` holds why."""


class UsageError(TangramError, RuntimeError):
    """The API was used in a way it cannot serve, caught before anything is held: one
    ``tangram.acquire(spec)`` object entered twice (each ``async with`` needs its own call, or the
    second would share the first's units), or a Tangram's acquire awaited on an event loop other
    than the one it runs on (its core is not thread-safe; use ``SyncTangram`` from other threads)."""


class IntegrationUnavailable(TangramError, ImportError):
    """A framework adapter was used but the framework (or one of the modules it imports) is missing.

    It is also an :class:`ImportError`, so the common ``try: ... except ImportError:`` fallback
    keeps working. ``framework`` names the framework, ``install`` the pip command that fixes it.
    """

    def __init__(self, message: str, *, framework: str, install: str) -> None:
        super().__init__(message)
        self.framework = framework
        self.install = install


class RayNotInstalledError(TangramError, ImportError):
    """``tangram_sdk.ray`` was used without Ray: ``pip install 'tangram-sdk[ray]'``."""


class LeaseLostError(TangramError):
    """A lease was revoked while its action held it: the connection to the scheduler actor broke,
    the client missed heartbeats for longer than the TTL, or the scheduler actor died. The action's
    task is cancelled (like ``asyncio.timeout``) and leaving ``acquire`` raises this instead."""


class NodeLostError(LeaseLostError):
    """The node agent owning the lease's cores/GPUs died: its resources left the pool, its queued
    actions fail with this at ``acquire`` and its running actions are cancelled with it."""


class TraceError(TangramError, ValueError):
    """A simulator trace line that cannot be replayed; the message names the line number and field."""


class ManagerError(TangramError):
    """A resource manager could not apply or release a grant.

    ``resource`` names what failed (a container id, a cgroup path, ``service@cuda:0``) so a log line
    alone says where to look.
    """

    def __init__(self, message: str, *, resource: str | None = None) -> None:
        super().__init__(message)
        self.resource = resource


class DockerError(ManagerError):
    """The Docker daemon is unreachable or too slow, or a container is unknown/stopped/removed.

    ``status`` is the daemon's HTTP status when it answered (404: no such container), ``connection``
    True when it could not be reached or did not answer in time."""

    def __init__(self, message: str, *, resource: str | None = None, status: int | None = None,
                 connection: bool = False) -> None:
        super().__init__(message, resource=resource)
        self.status = status
        self.connection = connection


class CgroupError(ManagerError):
    """A cgroup file could not be written (not writable, vanished container, bad path)."""


class MemoryBusyError(CgroupError):
    """A memory limit below what the cgroup holds and cannot free (resident processes, tmpfs):
    v1 refuses the write (EBUSY); on v2 we refuse it ourselves, because the kernel would OOM-kill
    whatever lives in the cgroup to get under it."""

    def __init__(self, message: str, *, resource: str | None = None, limit: int, usage: int) -> None:
        super().__init__(message, resource=resource)
        self.limit = limit
        self.usage = usage


class DeviceError(ManagerError):
    """Restoring or evicting a service on a device failed (e.g. out of memory after one retry)."""


class ActionOOMError(ManagerError):
    """An action went over its memory limit: its command was killed by the kernel's OOM killer
    inside the action's container (or cgroup), or the limit could not be set because the sandbox
    already holds more memory than it (``killed`` False: nothing ran).

    ``limit`` is the limit in bytes that applied (None: the container had none of ours), ``peak``
    the highest usage observed (None when the platform cannot say), ``result`` the command's
    :class:`~tangram_sdk.lease.ExecResult` (its output up to the kill) when a command was killed.
    The container itself survives; the next action in it runs normally."""

    def __init__(self, message: str, *, resource: str | None = None, limit: int | None = None,
                 peak: int | None = None, killed: bool = True, result: object = None) -> None:
        super().__init__(message, resource=resource)
        self.limit = limit
        self.peak = peak
        self.killed = killed
        self.result: Any = result  # an ExecResult (errors.py imports nothing of the package)

    def __reduce__(self) -> tuple[object, ...]:  # keep the fields across pickling (Ray)
        return (_rebuild_oom, (str(self), self.resource, self.limit, self.peak, self.killed, self.result))


def _rebuild_oom(message: str, resource: str | None, limit: int | None, peak: int | None, killed: bool,
                 result: object) -> ActionOOMError:
    return ActionOOMError(message, resource=resource, limit=limit, peak=peak, killed=killed, result=result)


class QuarantineError(ManagerError):
    """A manager could not undo a grant (a container could not be parked): the runtime keeps the
    action's units out of the pool until ``until`` resolves (the manager keeps retrying and
    resolves it once the resource is verifiably restored, or when it closes). The action itself
    is not failed by it; ``Tangram.statistics()["quarantined"]`` counts such actions."""

    def __init__(self, message: str, *, resource: str | None = None, until: object = None) -> None:
        super().__init__(message, resource=resource)
        self.until = until
