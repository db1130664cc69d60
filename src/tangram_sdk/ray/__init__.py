"""One Tangram for a whole Ray job: a named, detached scheduler actor, one agent per node, and a
client with the same ``acquire(spec)`` API from any process on any node.

::

    # driver, once
    from tangram_sdk.ray import deploy
    cluster = deploy("tangram", quotas={"search": Quota(concurrency=64, rate=100)},
                     managers=lambda: [DockerCpuManager()])

    # any worker process
    from tangram_sdk.ray import RemoteTangram
    async with RemoteTangram("tangram") as tangram:
        async with tangram.acquire(ActionSpec(kind="test", cpus=2)) as lease:
            ...

Importing this package never imports Ray; using it without Ray raises
:class:`RayNotInstalledError`. See ``docs/ray.md`` for the design and failure semantics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors import LeaseLostError, NodeLostError, RayNotInstalledError

if TYPE_CHECKING:
    from .client import RemoteTangram, TangramCluster, deploy

__all__ = ["LeaseLostError", "NodeLostError", "RayNotInstalledError", "RemoteTangram", "TangramCluster", "deploy"]

_LAZY = {"RemoteTangram", "TangramCluster", "deploy"}


def __getattr__(name: str) -> Any:
    # client.py imports Ray only when used; loading it lazily keeps `import tangram_sdk.ray` cheap
    if name in _LAZY:
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
