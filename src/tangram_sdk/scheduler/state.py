"""The scheduler's state, declared once for the modules that share it.

``Scheduler`` (core: events), ``Admission`` (the round), ``Deadlines``, ``Planning`` (how many
elastic units, judged by the completion-time estimate), ``GpuSizing`` / ``Moldable`` (sizes chosen
at admission) are one object split by job, each module's class a base of the one before, down to ``SchedulerState``. The
attributes are set by ``Scheduler.__init__``; this class only names their types and holds the
small helpers they all use. The state with a life of its own is owned, not mixed in: the :class:`.Ledger`
(free units), the :class:`.Residency` (warm GPU copies), the :class:`.WaitQueue` (who waits, with
its counts), the :class:`.RoundMemo` (what one round computes once), the :class:`.Placement` (which cores
and GPU cells, and what a restore costs) and the :class:`.Malleables` (running malleable actions
and the cores they borrowed).
"""

from __future__ import annotations


from ..pool import Pool
from ..spec import ActionSpec
from .action import Action, Shape, dur_min
from .learn import KindStats
from .ledger import Ledger
from .malleable import Malleables
from .memo import RoundMemo
from .deadlines import Deadlines
from .gpu_sizing import GpuSizing
from .moldable import CpuSizing
from .planning import Planner
from .placement import Placement
from .queue import WaitQueue
from .residency import Residency

__all__ = ["SchedulerState"]


class SchedulerState:
    pool: Pool
    _mall: Malleables
    _place: Placement
    window: int
    depth: int
    scan_limit: int
    elastic: bool
    lookahead: bool
    default_duration: float
    default_restore_s: float
    alpha: float
    mu_grid: tuple[float, ...]
    max_evictions: int
    lookahead_cap: int
    skip_rounds: bool
    gpu_slots: float | None
    ledger: Ledger
    next_wakeup: float | None
    evictions: int
    _queue: WaitQueue
    _running: dict[int, Action]
    _kinds: dict[str, KindStats]
    _cells: tuple[int, ...]
    _gpu_holder: list[Action | None]
    _resident: Residency
    _restore_s: dict[str, float]
    _shape: dict[ActionSpec, Shape]
    _max_node: int
    _cell_memo: dict[tuple[int, int], int]
    _memo: RoundMemo
    _svc_queued: dict[str, int]
    _live: dict[int, Action]
    _need_round: bool
    rejected: int
    planner: str
    load_target: float
    price_horizon: float
    price_smoothing: float
    max_price: float
    objective: str
    start_or_wait: bool
    rounds: int
    _spec_queued: dict[ActionSpec, int]  # _queue.spec_queued (and _svc_queued), as the sizing modules read them
    learn_efficiency: bool
    _cpu: CpuSizing
    _gpu: GpuSizing
    _planner: Planner
    _deadlines: Deadlines
    gpu_instances: str

    _dur_min = staticmethod(dur_min)  # no extra frame on the hot path

    def _restore_cost(self, service: str | None) -> float:
        return self._place.restore_cost(service)
