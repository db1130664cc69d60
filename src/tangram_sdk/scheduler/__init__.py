"""The pure scheduling core, one face: ``Scheduler.handle(event, now) -> list[Decision]``.

Events in (:mod:`.events`), decisions out (:mod:`.decisions`), observers watching both
(:mod:`.observer`); the live runtime and the simulator drive the same :class:`Scheduler`. No I/O,
no clocks, no event loop anywhere in this package (``tests/test_purity.py``).
"""

from .core import Scheduler, SchedulerStats
from .decisions import Decision, Grant, Reject, Resize
from .events import Cancelled, Event, Released, ServiceResidency, Submitted, Tick, TokensUsed
from .observer import Observer

__all__ = ["Cancelled", "Decision", "Event", "Grant", "Observer", "Reject", "Released", "Resize", "Scheduler",
           "SchedulerStats", "ServiceResidency", "Submitted", "Tick", "TokensUsed"]
