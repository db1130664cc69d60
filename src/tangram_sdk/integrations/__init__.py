"""Adapters that put RL frameworks' actions under tangram's action-level scheduling.

* :mod:`tangram_sdk.integrations.verl` -- veRL tools, agent-loop actions and reward functions.
* :mod:`tangram_sdk.integrations.openrlhf` -- OpenRLHF agent instances (each ``step``).
* :mod:`tangram_sdk.integrations.plain` -- ``Guard`` (for ``async with SEMAPHORE:`` code) and
  ``SyncTangram`` (for environments stepped in threads).

The framework modules import their framework lazily: importing them is cheap, and using a piece
that needs a missing framework raises :class:`IntegrationUnavailable` with the pip command.
What is exported here needs no framework. Every adapter takes a ``Tangram`` or a
``RemoteTangram`` (:class:`AnyTangram`), or names a job-wide pool in its config (see ``_host``
for the order in which they are tried, and ``_pools`` for pools by name).
"""

from __future__ import annotations

from .._protocol import AnyTangram
from ._config import SpecMappingError, pool_from_mapping, spec_from_mapping
from ._host import RuntimeSource, action, current_lease, install, installed, resolve_runtime, shutdown, using
from ._pools import PoolDef, pool_def
from ._lazy import IntegrationUnavailable
from .plain import Guard, SyncTangram

__all__ = [
    "AnyTangram",
    "Guard",
    "IntegrationUnavailable",
    "RuntimeSource",
    "SpecMappingError",
    "SyncTangram",
    "action",
    "current_lease",
    "install",
    "installed",
    "PoolDef",
    "pool_def",
    "pool_from_mapping",
    "resolve_runtime",
    "shutdown",
    "spec_from_mapping",
    "using",
]
