"""The spill plan: which services a width too narrow in memory serves beside its cells.

A width is a candidate only if every service called now keeps a resident copy at it (the queueing
model sees no residency), or if the GPUs beside its aligned cells hold the coldest services at a
narrower width: 9 teachers on 6 GPUs run 8 at TP-4 in the one cell and the ninth at TP-2 on GPUs
4-5; on 10 GPUs of one model each, 8 at TP-4 in two cells and the ninth at TP-2 on GPUs 8-9. Each
service then keeps its one width and region, and with two cells or more each cell is scored as a
queue of its own (:meth:`.WidthModel.cells_predict`). Kept apart from the switch rules
(:mod:`.gpu_regime`) because it is a plan per candidate width, recomputed each market, that the
model and the placement only read.
"""

from __future__ import annotations

from typing import Any

from .gpu_model import Service, WidthModel

__all__ = ["spill_plans"]

_SPILL_P_WAIT = 0.3  # a spilling width's (busiest) cell must wait less often than this (latest rates)
_SPILL_P_KEEP = 0.45  # ... once in force, until it waits this often
_SPILL_SWAP = 1.5  # a service spilled swaps with one kept only when this many times busier


def spill_plans(model: WidthModel, widths: list[int], fit: list[int], svcs: dict[str, Service],
                active: int, G: int, kinds: list[Any], fast: list[Any],
                spilling: int) -> dict[int, tuple[int, frozenset[str]]]:
    """Width -> (narrower width, the services spilled to it) for each width whose aligned cells
    cannot hold a copy of every service called now, where the GPUs beside those cells can
    hold the rest at the narrower width (``model.spill_plan`` holds the last market's plans;
    ``spilling`` is the width in force if it spills now, else 0). 9 teachers on 6 GPUs: the one
    TP-4 cell holds 8 copies; fifo4 thrashes the ninth through it (a restore every ~18 calls)
    and TP-2, where all 9 fit, runs every call slower. Spilling the coldest to TP-2 on GPUs 4-5
    keeps TP-4's speed for the rest with no thrash. Likewise 9 teachers on 10 GPUs of one model
    each: two TP-4 cells hold 8 copies, fifo4 thrashed the ninth (0.041 s a call) and Tangram's
    TP-2 lost 8-12 % to it; the ninth at TP-2 on GPUs 8-9 runs 0.79-0.81x fifo4.

    * With two cells or more the cells are scored as a queue each (:meth:`.WidthModel.cells_predict`):
      every service kept has room for one copy and waits for its own cell. Two TP-2 cells of
      5 GPUs, one copy a teacher, scored as one M/G/2, spilled and lost 4-8 % to TP-1.
    * Only while the busiest cell waits less than ``_SPILL_P_WAIT`` of the time at the latest rates
      (``_SPILL_P_KEEP`` once in force). A single cell under a rising load is the first to
      queue, and without the plan the width is not a candidate any more, which narrows it
      with the old copies serving. Seed 2 of 6 GPUs at batch 2048 otherwise rode TP-4 into
      the peak and narrowed urgently: 1.034x fifo2.
    * The coldest by calls ever (a rank that noise does not flip) are spilled, and the set is
      sticky. A 30 s rate reshuffled the four coldest teachers and restored them ~30 times
      each.
    * Only services whose every kind is elastic down to the narrower width: a kind whose
      smallest size exceeds the GPUs beside the cell would wait there for ever (the
      property test ``tests/test_scheduler_props.py::GpuMachine`` found one)."""
    out: dict[int, tuple[int, frozenset[str]]] = {}
    low: dict[str, int] = {}  # service -> the smallest size all its kinds can run at
    for _lam, spec, ts, _info in kinds:
        if spec.service is not None:
            lo = min(ts) if spec.elastic_resource == "gpu" else 1 << 30
            low[spec.service] = max(low.get(spec.service, 0), lo)
    ranked = sorted((info.calls, name) for name, info in svcs.items() if info.lam > 0)
    for m in widths:
        left = G - G // m * m
        if m in fit or G // m < 1 or left <= 0:
            continue
        n_spill = active - int(model.copies_fit(m, G) + 1e-9)
        if n_spill <= 0:
            continue
        m2 = max((x for x in widths if x < m and x <= left and model.copies_fit(x, left) >= n_spill),
                 default=0)
        if not m2:
            continue
        able = [(c, name) for c, name in ranked if low.get(name, 1 << 30) <= m2]
        if n_spill > len(able):
            continue
        cold = [name for _c, name in able[:n_spill]]
        prev = model.spill_plan.get(m)
        if prev is not None and len(prev[1]) == n_spill and all(
                n in svcs and svcs[n].lam > 0 for n in prev[1]):
            kept = [svcs[name].calls for _c, name in able if name not in prev[1]]
            if all(n in low and low[n] <= m2 for n in prev[1]) and (
                    not kept or max(svcs[n].calls for n in prev[1]) <= _SPILL_SWAP * min(kept)):
                cold = sorted(prev[1])
        gate = _SPILL_P_KEEP if m == spilling else _SPILL_P_WAIT
        if model.cells_predict([k for k in fast if k[1].service not in cold], m, G // m, 1.0)[2] > gate:
            continue
        out[m] = (m2, frozenset(cold))
    return out
