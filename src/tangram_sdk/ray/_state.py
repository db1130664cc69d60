"""The scheduler actor's records: a node in the pool (its agent and runtime) and what one client
acquire holds (a quota part and/or a node part).

Kept apart from :mod:`.actor` because the actor, a connection, routing and the statistics all
read them: plain slotted records, no behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..lease import Lease
from ..pool import Pool
from ..runtime import Tangram


class _Node:
    __slots__ = (
        "agent",
        "agent_name",
        "alive",
        "containers",
        "label",
        "peak_cpus",
        "peak_gpus",
        "peak_memory",
        "pool",
        "ray_node_id",
        "reason",
        "rt",
        "services",
        "watch",
    )

    def __init__(self, label: str, ray_node_id: str, agent: Any, agent_name: str, rt: Tangram,
                 info: Mapping[str, Any]) -> None:
        self.label = label
        self.ray_node_id = ray_node_id
        self.agent = agent
        self.agent_name = agent_name
        self.rt = rt
        self.pool: Pool = info["pool"]
        self.containers: set[str] = set(info.get("containers") or ())
        svc = info.get("services")
        self.services: set[str] | None = None if svc is None else set(svc)
        self.alive = True
        self.reason: str | None = None
        self.peak_cpus = self.peak_gpus = self.peak_memory = 0
        self.watch: asyncio.Task[None] | None = None


class _Held:
    """What one client acquire holds inside the actor: a quota part and/or a node part."""

    __slots__ = ("gid", "granted", "nlease", "node", "qlease", "route")

    def __init__(self, gid: int) -> None:
        self.gid = gid
        self.granted = False  # handed to the client (counts in granted/released)
        self.node: _Node | None = None  # the node whose runtime granted nlease (set once held)
        self.route: _Node | None = None  # the node chosen for the node part (before it is held)
        self.nlease: Lease | None = None  # the node part, held from node.rt
        self.qlease: Lease | None = None  # the quota part, held from the job-wide quota runtime
