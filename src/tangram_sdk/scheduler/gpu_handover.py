"""How a staged narrowing hands the old width's cells over to the new width, a few at a time.

Kept apart from the switch rules (:mod:`.gpu_regime`) because it carries a switch out rather than
decides one: once the regime narrows urgently, or while calls wait per cell (``staged``), the old
width's cells holding a copy are handed over ``_STAGE_CELLS`` at a time, the least busy first, a
stage lasting the restores of the copies its cells take. Until its stage comes a cell serves at
the old width and nowhere else (``legacy``, read by :class:`.GpuSizing`), so the pool never stops
for a restore (deepsearch's judge burst: 1.020-1.023x fifo2 with every cell handed over at once,
1.013-1.017x so).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..spec import ActionSpec
from .action import Action
from .gpu_model import Service, WidthModel
from .residency import Residency

__all__ = ["NO_STAGES", "Stages", "legacy_at", "plan_stages"]

_STAGE_CELLS = 1  # a staged narrowing hands this many of the old width's cells over at a time


class Stages(NamedTuple):
    """A hand-over: the old cells' masks in the order they are handed over, seconds a stage,
    cells a stage."""

    masks: tuple[int, ...]
    dt: float
    per: int

    @property
    def seconds(self) -> float:
        """How long the whole hand-over lasts: the switch's transition."""
        return self.dt * math.ceil(len(self.masks) / self.per)


NO_STAGES = Stages((), 0.0, 1)


def plan_stages(svcs: dict[str, Service], old: int, new: int, G: int, *, pref: dict[ActionSpec, int],
                resident: Residency, holder: list[Action | None], model: WidthModel,
                spilled: bool) -> Stages | None:
    """Hand the old width's cells over to the new width ``_STAGE_CELLS`` at a time, the least
    busy first: the cells not yet handed over (``legacy``) keep serving at the old width, and
    only there, while the new width's copies restore on the others, where a call restores
    rather than wait for a busy old copy (:meth:`.GpuSizing.choice`). Handing every cell over
    at once stopped the pool for a restore (deepsearch's judge: 4 s at ~12 calls/s, 1.020-1.023x
    fifo2; one cell a stage 1.013-1.017x, two 1.018-1.027x). A stage lasts the restores of
    the copies its cells take. ``pref`` is the size each spec takes at the old width, ``spilled``
    whether the old width spills.

    Not staged (None: every cell at once): cells with no old-width copy (just after a planned
    switch most have none: they are handed over at once); beside a spill (its own region); and
    where a stage would restore its copies in more rounds than the whole pool does (9 teachers
    on 8 GPUs, TP-4 -> TP-2: half the pool restoring 9 copies in 5 rounds kept the overload
    going twice as long, 1.030-1.040x fifo2 where at once is 1.006-1.032x)."""
    if _STAGE_CELLS <= 0:
        return None
    called = [n for n, info in svcs.items() if info.lam > 0]
    if not called or spilled or model.spill_plan.get(new) is not None or old >= G:
        return None
    # only cells holding an old-width copy of a service called now can serve at the old width
    # (just after a planned switch most have none yet): the rest are handed over at once
    warm: set[int] = set()
    for n in called:
        info = svcs[n]
        warm |= {pos[0] for pos in resident.warm_cells(n, pref.get(info.spec, info.pref)) if len(pos) == old}
    cells = sorted((o for o in range(0, G - old + 1, old) if o in warm),
                   key=lambda o: (sum(1 for p in range(o, o + old) if holder[p] is not None), o))
    if len(cells) <= 1:
        return None
    per = max(1, _STAGE_CELLS)
    dt = model.restore_rounds(called, new, per * (old // new))
    if dt > model.restore_rounds(called, new, G // new):
        return None  # a stage would restore its copies in more rounds than the whole pool does
    return Stages(tuple(((1 << old) - 1) << o for o in cells), dt, per)


def legacy_at(stages: Stages, now: float, since: float) -> int:
    """The old width's GPUs that still serve at ``now`` in a hand-over begun at ``since``: those
    of the cells whose stage has not come yet."""
    masks, dt, per = stages
    done = per * (1 + int((now - since) / dt)) if dt > 0 else len(masks)
    legacy = 0
    for m in masks[done:]:
        legacy |= m
    return legacy
