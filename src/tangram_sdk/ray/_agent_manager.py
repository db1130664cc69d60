"""The node runtime's one manager inside the scheduler actor: it makes a node's grants real by
forwarding them to that node's agent (a Ray actor), so the actor itself never touches a machine.

Kept apart from :mod:`.actor` because it is the only piece of the actor that speaks to agents per
grant: its bounds, and how Ray's errors turn back into the agent managers' own typed errors, live
here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .._deadline import within
from ..errors import ManagerError, QuarantineError
from ..lease import Lease
from ..managers.base import BaseManager
from ..scheduler.decisions import Grant
from ._ray import awaited, require


class _AgentManager(BaseManager):
    """The node runtime's one manager: forwards apply/release (and a malleable action's resize) to
    the node agent (a Ray call), each bounded by ``timeout`` seconds (a frozen agent must not hold
    a grant forever)."""

    name = "ray-agent"

    def __init__(self, agent: Any, label: str = "?", timeout: float | None = 120.0) -> None:
        self.agent = agent
        self.label = label
        self.timeout = timeout

    def _late(self, what: str, action_id: int) -> str:
        return (f"the agent of node {self.label!r} did not answer {what} of action {action_id} "
                f"within {self.timeout:g} s")

    def _error(self, exc: Exception) -> Exception:
        """What the agent raised (a RayTaskError's cause: the agent's managers' own typed error),
        our own bound running out (ManagerError naming the agent), or Ray's error (the agent died)."""
        if isinstance(exc, require("ray.exceptions").RayTaskError):
            cause = getattr(exc, "cause", None)
            return cause if isinstance(cause, Exception) else exc
        if type(exc) is TimeoutError:  # `within`: the agent did not answer in time
            return ManagerError(str(exc), resource=f"agent:{self.label}")
        return exc

    async def apply(self, grant: Grant, lease: Lease) -> None:
        aid = lease.action_id
        try:
            keys = await within(self.agent.apply.remote(aid, grant, lease.spec), self.timeout,
                                lambda: self._late("apply", aid))
        except Exception as exc:
            raise self._error(exc) from None
        lease.attach("agent_keys", keys)

    async def resize(self, old: Grant, new: Grant, lease: Lease) -> None:
        """A malleable action's new cores (the node runtime's Resize): the agent applies them
        through the node's managers and to its own copy of the lease (``lease.exec`` there)."""
        aid = lease.action_id
        try:
            await within(self.agent.resize.remote(aid, old, new), self.timeout, lambda: self._late("resize", aid))
        except Exception as exc:
            raise self._error(exc) from None

    async def release(self, grant: Grant, lease: Lease) -> None:
        aid = lease.action_id
        try:
            out = await within(self.agent.release.remote(aid), self.timeout, lambda: self._late("release", aid))
        except Exception as exc:
            raise self._error(exc) from None
        if isinstance(out, dict) and out.get("quarantined"):
            # the agent's manager could not park a container: the node's runtime keeps these
            # units out of its pool until the agent says the container is restored
            until = asyncio.ensure_future(awaited(self.agent.restored.remote(aid)))
            raise QuarantineError(f"node {self.label!r}: {out['quarantined']}", resource=f"agent:{self.label}",
                                  until=until)


