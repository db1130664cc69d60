"""What every Tangram handle offers, whether the scheduler runs in this process or in a Ray actor.

Why a protocol: the adapters, ``Guard``, ``SyncTangram``, ``install()`` and the examples only ever
acquire, read statistics and close. An in-process :class:`~tangram_sdk.runtime.Tangram` and a
:class:`~tangram_sdk.ray.RemoteTangram` (the job-wide scheduler actor) both do exactly that, so
code written against :class:`AnyTangram` runs unchanged on one process or a whole Ray job. (Both
also offer an ``acquire_lease`` / ``release`` pair; the protocol leaves it out so any handle with
the three methods, a proxy or a test double, still fits. Code holding a lease across calls on such
a handle uses :class:`contextlib.AsyncExitStack`, as ``Guard`` does.)

``statistics`` is the one method whose shape differs (the local snapshot is a plain call, the
remote one a round trip), so the protocol names the awaitable form, ``astatistics()``, which both
provide.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

from .lease import Lease
from .spec import ActionSpec

__all__ = ["AnyTangram", "is_tangram"]


@runtime_checkable
class AnyTangram(Protocol):
    """A handle on a pool: ``Tangram`` (in process) or ``RemoteTangram`` (the job-wide Ray actor).

    ::

        async def step(tangram: AnyTangram) -> None:
            async with tangram.acquire(ActionSpec(kind="test", cpus=1), timeout=60) as lease:
                ...
    """

    def acquire(self, spec: ActionSpec, *, timeout: float | None = None) -> AbstractAsyncContextManager[Lease]:
        """Wait for ``spec``'s resources; the context's value is the :class:`Lease`."""
        ...

    async def astatistics(self) -> Mapping[str, Any]:
        """A snapshot of the pool (free/used per resource, running, queued...)."""
        ...

    async def aclose(self) -> None:
        """Stop using the pool (a local Tangram stops scheduling; a remote handle hangs up)."""
        ...


def is_tangram(obj: object) -> bool:
    """``obj`` is a Tangram handle (an instance, not a class or a factory that makes one)."""
    return not isinstance(obj, type) and isinstance(obj, AnyTangram)
