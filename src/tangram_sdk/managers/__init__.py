"""Managers make the scheduler's grants real: what a manager is, and the ones that ship.

* :class:`Manager` — the protocol (``start``/``check``/``apply``/``release``/``aclose``/``describe``);
  :class:`BaseManager` gives no-op defaults, :class:`ManagerContext` is what ``start`` receives,
  :class:`Offer` what ``describe`` declares. :class:`Applied` is the one place that drives managers
  for a grant (the runtime and the Ray node agent both use it).
* :class:`DockerCpuManager` / :class:`SandboxPool` (``docker`` extra), :class:`TorchGpuManager`
  (``torch`` extra), :class:`HttpSleepWake` / :class:`OffloadableService` (GPU servers that sleep
  and wake over HTTP): loaded on first use, so importing this package never imports aiodocker or torch.

A fake for tests: :class:`tangram_sdk.testing.FakeManager`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ..errors import IntegrationUnavailable
from .base import Applied, BaseManager, Manager, ManagerContext, Offer, offer_of

if TYPE_CHECKING:
    from .cpu import DockerCpuManager, SandboxPool
    from .gpu import TorchGpuManager
    from .services import HttpSleepWake, OffloadableService

__all__ = [
    "Applied",
    "BaseManager",
    "DockerCpuManager",
    "HttpSleepWake",
    "Manager",
    "ManagerContext",
    "Offer",
    "OffloadableService",
    "SandboxPool",
    "TorchGpuManager",
    "offer_of",
]

# name -> (module, extra, the framework it needs)
_LAZY = {
    "DockerCpuManager": ("cpu", "docker", "aiodocker"),
    "SandboxPool": ("cpu", "docker", "aiodocker"),
    "TorchGpuManager": ("gpu", "torch", "torch"),
    "HttpSleepWake": ("services", None, None),
    "OffloadableService": ("services", None, None),
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, extra, framework = _LAZY[name]
    try:
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    except ImportError as exc:
        if extra is None:
            raise
        raise IntegrationUnavailable(
            f"{name} needs {framework}: pip install 'tangram-sdk[{extra}]' ({exc})",
            framework=str(framework), install=f"pip install 'tangram-sdk[{extra}]'",
        ) from exc


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
