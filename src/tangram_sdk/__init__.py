"""tangram_sdk: action-level, elastic management of the external resources of agentic RL rollouts.

Wrap each external action (a test run in a sandbox, a reward-model call, a web search) in
``async with tangram.acquire(ActionSpec(...)) as lease:`` and the scheduler decides who runs now
and with how many cores/GPUs, so resources are held per action instead of per trajectory.
"""

from .errors import (
    ActionOOMError,
    CgroupError,
    DeadlineError,
    DeviceError,
    DockerError,
    InfeasibleSpecError,
    IntegrationUnavailable,
    ManagerError,
    QuarantineError,
    RuntimeClosedError,
    SchedulerBrokenError,
    SpecError,
    TangramError,
    UsageError,
)
from .lease import ExecResult, Lease
from .managers import BaseManager, Manager, ManagerContext, Offer
from .options import SchedulerOptions
from .pool import Pool, Quota
from .resources import Counted, ResourceKind
from .runtime import Tangram
from .scheduler import Scheduler
from .spec import ActionSpec, Amdahl, Elasticity, Table

__all__ = [  # noqa: F822 (the managers are lazy attributes)
    "ActionOOMError",
    "ActionSpec",
    "Amdahl",
    "BaseManager",
    "CgroupError",
    "Counted",
    "DeadlineError",
    "DeviceError",
    "DockerCpuManager",
    "DockerError",
    "Elasticity",
    "ExecResult",
    "InfeasibleSpecError",
    "IntegrationUnavailable",
    "Lease",
    "Manager",
    "ManagerContext",
    "ManagerError",
    "Offer",
    "Pool",
    "QuarantineError",
    "Quota",
    "ResourceKind",
    "RuntimeClosedError",
    "SandboxPool",
    "Scheduler",
    "SchedulerBrokenError",
    "SchedulerOptions",
    "SpecError",
    "Table",
    "Tangram",
    "TangramError",
    "TorchGpuManager",
    "UsageError",
]

__version__ = "0.1.0"

# Managers with optional dependencies load on first use (PEP 562), so `import tangram_sdk` never
# imports aiodocker or torch.
_LAZY = {
    "DockerCpuManager": ("tangram_sdk.managers.cpu", "docker", "aiodocker"),
    "SandboxPool": ("tangram_sdk.managers.cpu", "docker", "aiodocker"),
    "TorchGpuManager": ("tangram_sdk.managers.gpu", "torch", "torch"),
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'tangram_sdk' has no attribute {name!r}")
    import importlib

    module, extra, framework = _LAZY[name]
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise IntegrationUnavailable(
            f"{name} needs {framework}: pip install 'tangram-sdk[{extra}]' ({exc})",
            framework=framework, install=f"pip install 'tangram-sdk[{extra}]'",
        ) from exc


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
