"""tangram_sdk: action-level, elastic management of the external resources of agentic RL rollouts.

Wrap each external action (a test run in a sandbox, a reward-model call, a web search) in
``async with tangram.acquire(ActionSpec(...)) as lease:`` and the scheduler decides who runs now
and with how many cores/GPUs, so resources are held per action instead of per trajectory.
"""

from .errors import (
    CgroupError,
    DeviceError,
    DockerError,
    InfeasibleSpecError,
    ManagerError,
    RuntimeClosedError,
    SchedulerBrokenError,
    SpecError,
    TangramError,
)
from .integrations._lazy import IntegrationUnavailable
from .lease import ExecResult, Lease
from .managers.base import Manager, ManagerContext
from .pool import Pool, Quota
from .runtime import Tangram
from .scheduler.core import Scheduler
from .spec import ActionSpec, Amdahl, Elasticity, Table

__all__ = [
    "ActionSpec",
    "Amdahl",
    "CgroupError",
    "DeviceError",
    "DockerError",
    "Elasticity",
    "ExecResult",
    "InfeasibleSpecError",
    "IntegrationUnavailable",
    "Lease",
    "Manager",
    "ManagerContext",
    "ManagerError",
    "Pool",
    "Quota",
    "RuntimeClosedError",
    "Scheduler",
    "SchedulerBrokenError",
    "SpecError",
    "Table",
    "Tangram",
    "TangramError",
]

__version__ = "0.1.0"
