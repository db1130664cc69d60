"""What an action holds while it runs: concrete cores and GPUs, elastic units, timings, and
whatever handles the managers attached (a container to exec in, a restored GPU service)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .errors import ManagerError
from .spec import ActionSpec

__all__ = ["ExecResult", "Lease"]


@attrs.frozen
class ExecResult:
    """The outcome of ``lease.run``/``lease.exec``: output is bounded; ``truncated`` says if cut."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    truncated: bool = False
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Lease:
    """The grant an action holds inside ``async with tangram.acquire(spec) as lease``.

    ``cpus``/``gpus`` are concrete ids (exclusive while held), ``units`` the elastic units granted
    (use it as ``-j N``/``-n N``), ``queued_s`` how long the action waited.
    """

    __slots__ = ("action_id", "spec", "cpus", "gpus", "units", "memory", "quotas", "queued_s",
                 "granted_at", "_attached")

    def __init__(
        self,
        action_id: int,
        spec: ActionSpec,
        *,
        cpus: tuple[int, ...],
        gpus: tuple[int, ...],
        units: int,
        memory: int,
        quotas: tuple[tuple[str, int], ...],
        queued_s: float,
        granted_at: float,
    ) -> None:
        self.action_id = action_id
        self.spec = spec
        self.cpus = cpus
        self.gpus = gpus
        self.units = units
        self.memory = memory
        self.quotas = dict(quotas)
        self.queued_s = queued_s
        self.granted_at = granted_at
        self._attached: dict[str, Any] = {}

    # -- for managers ---------------------------------------------------------------------------
    def attach(self, key: str, value: Any) -> None:
        """Managers hang handles here (``"exec"``, ``"service"``, ``"call"``, ``"container"``)."""
        self._attached[key] = value

    def attachment(self, key: str) -> Any:
        try:
            return self._attached[key]
        except KeyError:
            raise ManagerError(
                f"no manager attached {key!r} to this lease (spec kind={self.spec.kind!r}); "
                f"add the matching manager to Tangram(managers=[...])",
                resource=key,
            ) from None

    # -- what actions use -----------------------------------------------------------------------
    @property
    def service(self) -> Any:
        """The GPU service (e.g. a torch module) restored onto ``gpus`` for this action."""
        return self.attachment("service")

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        """Call the GPU service on the granted devices (runs off the event loop)."""
        fn = self.attachment("call")
        return await fn(*args, **kwargs)

    async def exec(
        self, cmd: Sequence[str], *, timeout: float | None = None, max_output: int = 1 << 20, **kw: Any
    ) -> ExecResult:
        """Run ``cmd`` (an argv list, never a shell string) inside the action's container."""
        fn = self.attachment("exec")
        result: ExecResult = await fn(cmd, timeout=timeout, max_output=max_output, **kw)
        return result

    async def run(
        self, cmd: Sequence[str], *, timeout: float | None = None, max_output: int = 1 << 20, **kw: Any
    ) -> ExecResult:
        """Run ``cmd`` as a local subprocess pinned to ``lease.cpus`` (no Docker needed)."""
        from .managers.process import run_pinned

        return await run_pinned(cmd, self.cpus, timeout=timeout, max_output=max_output, **kw)

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
