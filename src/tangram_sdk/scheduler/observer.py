"""What watches the core: one observer contract for the live runtime and the simulator, so a
decision log, a trace or a metrics collector written once attaches to either."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .decisions import Decision
from .events import Event

__all__ = ["Observer"]


class Observer(Protocol):
    """``observer(events, now, decisions)``, called after every round with the events it applied
    and the decisions it made (``Tangram(observers=...)``, ``simulate(observers=...)``). Any
    callable taking those three positionally fits; it must not raise or block (it runs inside the
    round, on the event loop in the runtime)."""

    def __call__(self, events: Sequence[Event], now: float, decisions: Sequence[Decision], /) -> None: ...
