"""Errors of the Ray layer (all under :class:`~tangram_sdk.errors.TangramError`).

::

    TangramError
    ├── RayNotInstalledError (also ImportError)   the ``ray`` extra is missing
    └── LeaseLostError                            the scheduler took a held lease back
        └── NodeLostError                         ...because the lease's node (its agent) died
"""

from __future__ import annotations

from ..errors import TangramError

__all__ = ["LeaseLostError", "NodeLostError", "RayNotInstalledError"]


class RayNotInstalledError(TangramError, ImportError):
    """``tangram_sdk.ray`` was used without Ray: ``pip install 'tangram-sdk[ray]'``."""


class LeaseLostError(TangramError):
    """A lease was revoked while its action held it: the connection to the scheduler actor broke,
    the client missed heartbeats for longer than the TTL, or the scheduler actor died. The action's
    task is cancelled (like ``asyncio.timeout``) and leaving ``acquire`` raises this instead."""


class NodeLostError(LeaseLostError):
    """The node agent owning the lease's cores/GPUs died: its resources left the pool, its queued
    actions fail with this at ``acquire`` and its running actions are cancelled with it."""
