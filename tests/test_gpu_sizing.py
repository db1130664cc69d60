"""GPU sizing and placement (scheduler/gpu_regime.py, gpu_rates.py, gpu_handover.py, gpu_model.py,
gpu_spill.py, gpu_copies.py, gpu_sizing.py, queueing.py, residency.py): the queueing formulas,
restores priced as investments, one width per regime chosen by load, and the two memory models
(tensor-parallel instances vs the torch manager's per-GPU replicas)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from tangram_sdk import ActionSpec, Pool, Scheduler
from tangram_sdk.spec import Amdahl, Elasticity
from tangram_sdk.scheduler.decisions import Grant, Reject
from tangram_sdk.scheduler.events import Released, ServiceResidency, Submitted
from tangram_sdk.scheduler.queueing import erlang_c, lq_slope, mmc_lq, mmc_wq
from tangram_sdk.scheduler.residency import Residency
from tangram_sdk.sim.baselines import make_policy
from tangram_sdk.sim.engine import Act, Trajectory, simulate
from tangram_sdk.sim.metrics import summarise
from tangram_sdk.sim.workloads import deepsearch, mopd, run_policy


def test_erlang_c_matches_the_closed_forms() -> None:
    for rho in (0.1, 0.5, 0.9):
        assert erlang_c(1, rho) == pytest.approx(rho)  # M/M/1: an arrival waits w.p. rho
        assert mmc_wq(1, rho, 2.0) == pytest.approx(rho * 2.0 / (1 - rho))
        assert erlang_c(2, 2 * rho) == pytest.approx(2 * rho * rho / (1 + rho))  # M/M/2
    assert erlang_c(3, 3.0) == 1.0 and math.isinf(mmc_lq(3, 3.5)) and math.isinf(lq_slope(2, 2.0))
    slopes = [lq_slope(4, a) for a in (0.5, 1.5, 2.5, 3.5)]
    assert all(0 < x < y for x, y in zip(slopes, slopes[1:]))  # waiting grows convexly with load


def _hot_service(seed: int = 0) -> list[Trajectory]:
    """One service called ~4x a second (Poisson) for calls of 0.2 s on average: one warm copy is
    80 % busy, a second GPU sits empty, a restore takes 3 s."""
    x = ActionSpec(kind="x", gpus=1, service="x")
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(0.25, 800))
    w = rng.exponential(0.2, 800)
    return [Trajectory((Act(x, float(w[i])),), start=float(t[i])) for i in range(800)]


def test_a_restore_is_an_investment_for_a_hot_service() -> None:
    """Every single wait for the busy warm copy is shorter than a 3 s restore, so a rule that
    charges the restore to the action that triggers it waits, call after call; priced as a copy
    that serves the next calls, the second copy is restored once and the queue goes."""
    out = {}
    for planner in ("priced", "estimate"):  # estimate: the old warm-wait rule
        pol = make_policy("fifo1", Pool(gpus=2), gpu_slots=2, planner=planner)
        r = simulate(_hot_service(), pol, restore_s={"x": 3.0}, gpu_slots=2, prewarm=[(0, "x", (0,))])
        out[planner] = summarise(r)
    assert out["priced"]["restores"] == 1  # scales out once, and stays
    assert out["priced"]["queue_mean_s"] < 0.5 * out["estimate"]["queue_mean_s"]
    assert out["priced"]["act_mean_s"] < 0.9 * out["estimate"]["act_mean_s"]


@pytest.mark.parametrize("batch,gpus,decode", [(256, 8, 15.0), (512, 16, 120.0), (1024, 16, 60.0)])
def test_elastic_width_is_never_worse_than_a_fixed_width(batch: int, gpus: int, decode: float) -> None:
    """MOPD-like teachers on a shared pool: Tangram's width per load (TP up to 4) against every
    fixed width the same core runs (fifo1/2/4), same trajectories; within 2 %."""
    wl = mopd(batch, gpus=gpus, seed=0, calls_min=4, calls_max=8, decode_tok_s=decode)
    act = {p: summarise(run_policy(wl, p))["act_mean_s"] for p in ("tangram", "fifo1", "fifo2", "fifo4")}
    best = min(v for p, v in act.items() if p != "tangram")
    assert act["tangram"] <= 1.02 * best, act


def test_width_narrows_when_wide_cells_would_queue() -> None:
    """8 GPUs are two TP-4 cells: at ~7.5 calls a second TP-4 would keep both 75 % busy and queue
    (fifo4 waits several times fifo2's); the core leaves TP-4 for a narrower width."""
    wl = mopd(1024, gpus=8, seed=0, calls_min=4, calls_max=8, decode_tok_s=60.0)
    r = run_policy(wl, "tangram")
    units = np.array(r.units)
    late = np.array(r.submit) > 200.0  # after the opening ramp
    assert units[late].mean() < 3.0
    light = mopd(256, gpus=8, seed=0, calls_min=4, calls_max=8, decode_tok_s=15.0)
    assert np.mean(run_policy(light, "tangram").units) > 3.9  # and keeps TP-4 when that is best


def test_a_backlog_keeps_the_width_from_growing() -> None:
    """Stop 37's search: a 3 GPU-s judge on 8 GPUs (deepsearch, batch 1024). In a closed loop the
    call rate *falls* while calls wait (their trajectories are blocked), so the width model, fed
    rates, saw an idle pool behind a 290 s queue and grew the judge to TP-8 (~49 % efficient at
    Amdahl 0.85): mean ACT 12.69 s and step 568 s against fifo1's 11.19 s / 454 s on the same core.
    A width never grows while a call waits per cell now."""
    wl = deepsearch(1024, seed=0, gpus=8, judge_work_mean=3.0)
    r = run_policy(wl, "tangram")
    f = summarise(run_policy(wl, "fifo1"))
    t = summarise(r)
    assert t["act_mean_s"] <= 1.02 * f["act_mean_s"], (t["act_mean_s"], f["act_mean_s"])
    assert t["step_s"] <= 1.02 * f["step_s"], (t["step_s"], f["step_s"])
    judge = np.array(r.kind) == "judge"
    queued = (np.array(r.grant) - np.array(r.submit))[judge]
    assert np.array(r.units)[judge][queued > 30.0].max() == 1  # behind a long queue: TP-1 only


def test_calls_piling_up_at_the_first_width_narrow_it_before_the_rates_see_the_ramp() -> None:
    """Stop 37's search: teacher calls of 3 GPU-s on 10 GPUs. The first width (TP-4, two cells:
    a guess made before any load is measured) queued 15-20 s in the opening ramp before the 30 s
    rates called it an overload: mean ACT 1.23x fifo2's. Four calls queued per cell of the first
    width now read as one. (Applied to every width, the same rule narrowed on clumps in the heavy
    8- and 10-GPU cells: up to 1.28x; seed 1 of this cell still loses, 1.14x: docs/evaluation.md.)"""
    wl = mopd(1024, gpus=10, seed=0, teacher_max_gpus=4, work_mean=3.0)
    r = run_policy(wl, "tangram")
    f = run_policy(wl, "fifo2")
    assert summarise(r)["act_mean_s"] <= 1.02 * summarise(f)["act_mean_s"]
    opening = np.array(r.submit) < 420.0  # the ramp (first calls ~200 s, the peak from ~360 s)
    assert (np.array(r.grant) - np.array(r.submit))[opening].mean() < 4.0  # was 8.6 s


def test_an_overrun_first_width_hands_every_cell_over_at_once() -> None:
    """The saturated judge (3 GPU-s calls on 8 GPUs, seed 0): calls pile up at the first width
    (TP-4, a guess) and it narrows to TP-1. Handed over a cell at a time, the last TP-4 cell kept
    serving for 6 s at 69 % of TP-1's throughput while the queue grew from 14 to 22 calls
    (27 TP-4 calls, 1.049x isolated's mean ACT); every cell at once: 20, 1.042x."""
    wl = deepsearch(1024, seed=0, gpus=8, judge_work_mean=3.0)
    r = run_policy(wl, "tangram")
    judge = np.array(r.kind) == "judge"
    assert (np.array(r.units)[judge] == 4).sum() <= 20
    iso = summarise(run_policy(wl, "isolated", iso_gpus=None))["act_mean_s"]
    assert summarise(r)["act_mean_s"] <= 1.045 * iso


def test_tp_restore_reports_are_kept_per_full_model() -> None:
    """A TP-4 restore reported as 0.75 s loads a quarter of a 3 s model per GPU: a later cold
    TP-1 copy of the same service is expected to take 3 s, not 0.75 s."""
    s = Scheduler(Pool(gpus=8), gpu_slots=2)
    s.handle(ServiceResidency("m", (0, 1, 2, 3), True, 0.75), 0.0)
    spec = ActionSpec(kind="m", gpus=1, service="m", duration=1.0)
    s.handle(Submitted(1, ActionSpec(kind="o", gpus=4, service="o", duration=9.0)), 0.0)  # cell 0-3 busy
    (g,) = [d for d in s.handle(Submitted(2, spec), 0.0) if isinstance(d, Grant)]
    assert g.restore and g.gpus[0] >= 4
    assert s._running[2].est_end == pytest.approx(1.0 + 3.0)  # noqa: SLF001 - the core's own estimate


def test_replica_memory_counts_one_copy_per_gpu_shared_by_every_width() -> None:
    """The torch GPU manager runs a k-GPU grant data-parallel on one full copy per GPU and reports
    each copy and the grant. Counted as tensor-parallel instances that is 1.5 models per GPU and a
    TP-1 call next to a warm TP-2 grant looks cold; as replicas it is one copy each, warm."""
    r = Residency(4, replica=True)
    for key in (("m", (0,)), ("m", (1,)), ("m", (0, 1))):  # what the manager posts
        r.add(key, 1.0)
    assert r.use_at == [1.0, 1.0, 0.0, 0.0]
    assert ("m", (0, 1)) in r and ("m", (1,)) in r and ("m", (2, 3)) not in r
    assert r.warm_cells("m", 2) == {(0, 1)} and r.warm_cells("m", 1) == {(0,), (1,)}
    r.remove(("m", (0, 1)))  # a view: only the per-GPU reports remove copies
    assert ("m", (0, 1)) in r
    r.remove(("m", (1,)))
    assert ("m", (0, 1)) not in r and r.use_at == [1.0, 0.0, 0.0, 0.0]
    tp = Residency(4)
    for key in (("m", (0,)), ("m", (1,)), ("m", (0, 1))):
        tp.add(key, 1.0)
    assert tp.use_at == [1.5, 1.5, 0.0, 0.0]  # distinct instances under tensor parallelism

    for model, cold in (("replica", False), ("tp", True)):
        s = Scheduler(Pool(gpus=4), gpu_slots=2, gpu_instances=model)
        wide = ActionSpec(kind="w", gpus=2, service="m", duration=1.0)
        (g,) = s.handle(Submitted(1, wide), 0.0)
        assert isinstance(g, Grant) and g.restore and g.gpus == (0, 1)
        s.handle(Released(1), 1.0)
        (h,) = s.handle(Submitted(2, ActionSpec(kind="n", gpus=1, service="m", duration=1.0)), 2.0)
        assert isinstance(h, Grant) and h.restore is cold
        if not cold:
            assert h.gpus[0] in (0, 1)


def test_learned_call_duration_excludes_the_restore_the_grant_asked_for() -> None:
    s = Scheduler(Pool(gpus=1), default_restore_s=3.0)
    spec = ActionSpec(kind="m", gpus=1, service="m")
    (g,) = s.handle(Submitted(1, spec), 0.0)
    assert isinstance(g, Grant) and g.restore
    s.handle(Released(1), 3.5)  # 3 s restore + 0.5 s call
    assert s.estimated_duration(spec) == pytest.approx(0.5, rel=0.05)


def test_no_width_at_which_a_called_service_has_no_room() -> None:
    """9 teachers on 5 GPUs (2 models a GPU): at TP-1 all 9 stay resident, at TP-2 two cells hold
    8 copies and the ninth restores on every call, evicting another (fifo2: ~1400 restores, 2.2x
    fifo1's ACT). Tangram must not pick such a width: within 2 % of fifo1, and few restores."""
    wl = mopd(2048, gpus=5, seed=0)
    t = summarise(run_policy(wl, "tangram"))
    f1 = summarise(run_policy(wl, "fifo1"))
    assert t["act_mean_s"] <= 1.02 * f1["act_mean_s"], (t["act_mean_s"], f1["act_mean_s"])
    assert t["restores"] < 100


def test_when_no_width_holds_every_service_the_faster_restores_win() -> None:
    """6 GPUs holding one model each for 9 teachers: every width thrashes. TP-2 keeps as many
    copies as TP-1 (six) and restores in half the time; Tangram
    must not fall back to TP-1 (it did: 2.39 s vs fifo2's 1.73) but match or beat the best fixed."""
    wl = mopd(2048, gpus=6, seed=0, gpu_slots=1)
    t = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    best = min(summarise(run_policy(wl, p))["act_mean_s"] for p in ("fifo1", "fifo2"))
    assert t <= 1.02 * best, (t, best)


def test_arrivals_a_denormal_apart_are_a_burst_not_an_infinite_rate() -> None:
    """Two submissions of one kind 5e-324 s apart (Hypothesis found it): the 32-arrival rate was
    1/5e-324 = inf, the GPU market's spread factor NaN, and the submit raised ValueError. Arrivals
    within a microsecond are simultaneous: the GPU call is granted, the rate stays finite."""
    from tangram_sdk.scheduler.learn import KindStats

    s = Scheduler(Pool(cpus=4, gpus=4), window=4, depth=8)
    s.submit(1, ActionSpec(kind="a"), 0.0)
    (g,) = s.submit(2, ActionSpec(kind="a", cpus=0, gpus=1, service="rm"), 5e-324)
    assert isinstance(g, Grant) and len(g.gpus) == 1
    st = KindStats(1.0)
    st.observe_arrival(0.0, 0.1)
    st.observe_arrival(5e-324, 0.1)
    assert st.window_rate(5e-324) == 0.0


def test_heavy_pools_do_not_trade_widths_on_the_pooled_model() -> None:
    """MOPD at batch 4096 on 10 GPUs (~24 % busy; fifo2 the best fixed, fifo4 1.5-1.9x worse):
    the pooled M/G/c model scores TP-4 (two cells) 3-5 % better than TP-2, but its calls waited
    ~3x the model there; growing on the model alone went back and forth every minute and urgent
    narrowings came back 60 s later, each way restoring the teachers (1.079x fifo2). Growth now
    also uses each width's measured waits, a switch pays its restores' GPU-seconds at the pool's
    price, and undone urgent narrowings raise the bar for the next."""
    wl = mopd(4096, gpus=10, seed=1)
    t = summarise(run_policy(wl, "tangram"))
    f2 = summarise(run_policy(wl, "fifo2"))
    assert t["act_mean_s"] <= 1.02 * f2["act_mean_s"], (t["act_mean_s"], f2["act_mean_s"])


def test_an_urgent_narrowing_the_latest_rates_alone_call_for_waits_for_a_backlog(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Heavy MOPD on 8 GPUs (batch 4096): at the step's peak the 32-arrival rate reads clumps of
    arrivals, and the calls an outage held back coming back together, as overloads. Each urgent
    narrowing they caused restored every teacher at once and stopped the pool for seconds: 1.059x
    fifo2. An urgent narrowing that only the latest rates call for (the smoothed ones not, and not
    a ramp of 1.5x) now waits until the calls queued are as many as its restores would hold up.
    Measured with ``_ROBUST`` off: a narrowing that must also win at rates two standard errors
    lower is held back on most of those clumps too (ungated: 1.015x with it, 1.087x without)."""
    import tangram_sdk.scheduler.gpu_regime as gr

    monkeypatch.setattr(gr, "_ROBUST", 0.0)
    wl = mopd(4096, gpus=8, seed=0)
    f2 = summarise(run_policy(wl, "fifo2"))["act_mean_s"]
    gated = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    monkeypatch.setattr(gr, "_QUEUE_GATE", 0.0)  # every latest-rate alarm believed, as before
    ungated = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert gated <= 1.02 * f2, (gated, f2)
    assert ungated > 1.04 * f2, (ungated, f2)


def test_no_second_urgent_narrowing_while_the_first_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deepsearch seed 7: the judge burst narrowed TP-4 -> TP-2, and 2.2 s later, before any TP-2
    copy served, TP-2 -> TP-1 on the latest rates: two restore storms, 1.05x fifo2. Within 10 s of
    an urgent narrowing another one needs the smoothed rates too. (Since urgent narrowings are
    handed over cell by cell, the second storm costs less: 1.026x without the hold, 1.019x with.)

    Measured with the ramp rule off (``_AHEAD`` 1): under it the burst goes TP-4 -> TP-1 in one
    step and the hold has nothing left to hold here (1.024x fifo2 either way: the TP-2 stint the
    hold kept was worth more on this light judge than one restore storm less, the trade
    docs/evaluation.md records); the hold still guards echoes of narrowings that are no ramp."""
    import tangram_sdk.scheduler.gpu_regime as gr

    monkeypatch.setattr(gr, "_AHEAD", 1.0)
    monkeypatch.setattr(gr, "_PREP", 0.0)  # the opening-ramp rule narrows to TP-1 before the burst
    monkeypatch.setattr(gr, "_RAMP_OVER", 0.0)  # measured before stop 45: any ramp skips the gate
    wl = deepsearch(2048, seed=7)
    f2 = summarise(run_policy(wl, "fifo2"))["act_mean_s"]
    held = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    monkeypatch.setattr(gr, "_URGENT_HOLD", 0.0)
    unheld = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert held <= 1.02 * f2, (held, f2)
    assert unheld > 1.02 * f2, (unheld, f2)


def test_an_urgent_narrowing_hands_the_old_cells_over_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deepsearch's judge burst narrows TP-2 -> TP-1 urgently on 8 GPUs. Handing every cell over
    at once stopped the pool for the judge's 4 s restore at ~12 calls/s; now the old width's
    cells not yet handed over keep serving while the new width's copies restore on one cell
    (2 GPUs) at a time, and the new width never takes a GPU the old one still serves on.

    Seed 1 (seed 0 until the ramp rule: since it narrows straight to TP-1, seeds 0 and 7 do better
    handed over at once, 1.013 / 1.018x fifo2 vs 1.019 / 1.024x, and seeds 1, 2 and 5 worse,
    1.025 / 1.029 / 1.029x vs 1.008 / 1.020 / 1.019x; 3, 4 and 6 tie)."""
    import tangram_sdk.scheduler.gpu_handover as gh
    import tangram_sdk.scheduler.gpu_regime as gr
    import tangram_sdk.scheduler.gpu_sizing as gs

    monkeypatch.setattr(gr, "_PREP", 0.0)  # the opening-ramp rule hands every cell over at once
    monkeypatch.setattr(gr, "_RAMP_OVER", 0.0)  # measured before stop 45: any ramp skips the gate
    wl = deepsearch(2048, seed=1)
    f2 = summarise(run_policy(wl, "fifo2"))["act_mean_s"]
    choice = gs.GpuSizing.choice
    seen = {"old": 0, "new": 0, "crossed": 0}

    def watched(self: gs.GpuSizing, a: Any, gfree: int, now: float) -> Any:
        out = choice(self, a, gfree, now)
        reg = self.regime
        prev, pk = reg.prev_pref.get(a.spec), reg.pref.get(a.spec)
        if reg.legacy and out.units and prev != pk:
            mask = ((1 << out.units) - 1) << out.cell
            inside = mask & reg.legacy == mask
            if out.units == prev and inside:
                seen["old"] += 1
            elif out.units == pk and not mask & reg.legacy:
                seen["new"] += 1
            else:
                seen["crossed"] += 1
        return out

    monkeypatch.setattr(gs.GpuSizing, "choice", watched)
    staged = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert seen["old"] > 0 and seen["new"] > 0 and seen["crossed"] == 0, seen
    monkeypatch.setattr(gh, "_STAGE_CELLS", 0)  # every cell handed over at once, as before
    at_once = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert staged <= 1.02 * f2, (staged, f2)
    assert at_once > 1.005 * staged, (at_once, staged)


def test_after_an_urgent_narrowing_no_second_copy_restores_while_a_service_has_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Heavy MOPD on 8 GPUs, seed 2: the one urgent TP-4 -> TP-2 narrowing at the step's peak
    (~399 s) restores all 9 teachers on 4 TP-2 cells. Calls of the hot teachers restored second
    and third copies (their queues credit a copy) while others queued with none, so the last
    teachers got their first copy in the 5th round instead of the 3rd: 1.029x fifo2's mean ACT.
    Now, after an urgent narrowing, a service with a copy waits for it while another GPU service
    queues with none (1.023x). Measured with ``_CAL_NARROW`` off: scored on its measured waits,
    the guessed first width narrows here before the peak as a planned switch (test below), and
    this rule, which acts after staged narrowings only (urgent ones, or ones under a backlog), has
    nothing left to do."""
    import tangram_sdk.scheduler.gpu_regime as gr
    import tangram_sdk.scheduler.gpu_sizing as gs

    monkeypatch.setattr(gr, "_CAL_NARROW", False)

    wl = mopd(4096, gpus=8, seed=2)
    choice = gs.GpuSizing.choice
    seen = {"dup": 0}

    def watched(self: gs.GpuSizing, a: Any, gfree: int, now: float) -> Any:
        out = choice(self, a, gfree, now)
        svc = a.spec.service
        if out.units and self.regime.staged and svc is not None:
            res = self._resident
            pos = tuple(range(out.cell, out.cell + out.units))
            others = [o for o, q in self._svc_queued.items() if q and o != svc and o.startswith("teacher")]
            if (pos not in res.warm_cells(svc, out.units) and res.warm_cells(svc, out.units)
                    and any(not res.warm_cells(o, out.units) and not any(
                        len(p) == out.units for p in self._tent.get(o, ())) for o in others)):
                seen["dup"] += 1
        return out

    monkeypatch.setattr(gs.GpuSizing, "choice", watched)
    fixed = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert seen["dup"] == 0, seen
    monkeypatch.setattr(gs, "_UNSTARVE", False)  # as before
    before = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert seen["dup"] > 0, seen
    assert fixed < 0.997 * before, (fixed, before)


def _switches_and_act(monkeypatch: pytest.MonkeyPatch, wl: Any, frm: int, to: int) -> tuple[int, float]:
    """Tangram on ``wl``: how many times the width market switched from ``frm`` to ``to``, and the
    mean ACT (the width read after every market, under the module's constants as patched now)."""
    import tangram_sdk.scheduler.gpu_regime as gr

    market = gr.GpuRegime.market
    widths: list[int] = []

    def watched(self: gr.GpuRegime, now: float) -> Any:
        out = market(self, now)
        if not widths or widths[-1] != self.width:
            widths.append(self.width)
        return out

    monkeypatch.setattr(gr.GpuRegime, "market", watched)
    try:
        act = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    finally:
        monkeypatch.setattr(gr.GpuRegime, "market", market)
    return sum(1 for a, b in zip(widths, widths[1:]) if a == frm and b == to), act


def test_an_urgent_narrowing_the_smoothed_rates_undo_raises_the_bar_for_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """MOPD at batch 3072 on 10 GPUs: peaks of the 32-arrival rate make TP-4 (two cells) look
    overloaded, the core narrows to TP-2 at once, and the smoothed rates take it back to TP-4 a
    minute later, each way restoring the teachers. Counting each undone narrowing as a false alarm
    (the next needs a higher chance to wait) leaves fewer round trips and a lower mean ACT.

    Measured with the backlog gate off: those peaks are what the gate now holds back (one round
    trip with it, checked last), and the false-alarm rule still guards the alarms a backlog or a
    ramp confirms.

    Also measured with ``_UNSTARVE`` off (no second copy while a service has none after an
    urgent narrowing): it makes each narrowing's restores cheaper, and with the gate and the
    false-alarm rule both off this cell then makes only 2 round trips (0.271 s, 0.277 s without
    it), leaving the false-alarm rule nothing to cut here."""
    import tangram_sdk.scheduler.gpu_regime as gr
    import tangram_sdk.scheduler.gpu_sizing as gs

    monkeypatch.setattr(gs, "_UNSTARVE", False)
    wl = mopd(3072, gpus=10, seed=0)

    def run() -> tuple[int, float]:
        return _switches_and_act(monkeypatch, wl, 4, 2)

    n_gated, _ = run()
    monkeypatch.setattr(gr, "_QUEUE_GATE", 0.0)  # every latest-rate alarm acted on
    n_new, act_new = run()
    monkeypatch.setattr(gr, "_FALSE_ALARM", 1.0)  # every alarm believed alike
    n_old, act_old = run()
    assert n_old >= 3 and n_new < n_old, (n_old, n_new)
    assert act_new < act_old, (act_new, act_old)
    assert n_gated <= n_new, (n_gated, n_new)


def test_a_narrowing_whose_width_waited_worse_than_modelled_is_a_false_alarm_at_any_age(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """MOPD with calls of 3 GPU-s on 10 GPUs (seed 1): at the step's peak TP-2 waits often, the core
    narrows to TP-1 and comes back 162 s later, past the two regime windows in which a return
    counts as a false alarm. TP-1's calls waited ~4x the model's prediction there (a TP-1 copy
    restores in as long as a call takes, so each teacher queues on its own few copies), TP-2's
    ~1.6x: the narrowing did not buy the waits it was taken for. Counted as a false alarm, the
    next peak does not narrow again (one TP-2 -> TP-1 round trip, not two) and the mean ACT drops
    (1.050x fifo2 -> 1.032x).

    Measured with ``_SUNK_FIRST_COPY`` off: with it, the return to TP-2 restores its copies during
    its transition, and the next peak narrows again with 13 calls queued, above the raised bar
    (two round trips either way; the rule's gain on this cell shrinks to 0.2 %). And with
    ``_ROBUST`` off: a narrowing that must also win at rates two standard errors lower leaves one
    round trip whether or not the second peak counts the first as a false alarm (test below). And
    with ``_CALL_OFF`` off: without the first copies restored in the transition, the return to
    TP-2 is called off at the next peak, which then narrows again (with ``_SUNK_FIRST_COPY`` on,
    as in the matrix, the cell is the same either way). And with ``_CAL_NARROW`` off: in this
    setting (the three rules above off) the guessed first width narrows on its measured waits,
    and both peaks then narrow either way (2.299 s / 2.305 s)."""
    import tangram_sdk.scheduler.gpu_regime as gr
    import tangram_sdk.scheduler.gpu_sizing as gs

    monkeypatch.setattr(gs, "_SUNK_FIRST_COPY", False)
    monkeypatch.setattr(gr, "_ROBUST", 0.0)
    monkeypatch.setattr(gr, "_CALL_OFF", False)
    monkeypatch.setattr(gr, "_CAL_NARROW", False)
    monkeypatch.setattr(gr, "_P_GROW", gr._P_WAIT)  # the growing bar (stop 45) off: see the test below
    wl = mopd(1024, gpus=10, seed=1, teacher_max_gpus=4, work_mean=3.0)

    def run() -> tuple[int, float]:
        return _switches_and_act(monkeypatch, wl, 2, 1)

    n_new, act_new = run()
    monkeypatch.setattr(gr, "_FALSE_ALARM_MEASURED", False)
    n_old, act_old = run()
    assert n_new == 1 and n_old == 2, (n_new, n_old)
    assert act_new < 0.99 * act_old, (act_new, act_old)


def test_the_guessed_first_width_narrows_on_its_measured_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heavy MOPD on 8 GPUs (batch 4096, seed 2). The first width, TP-4, is a guess (two cells),
    and as the step's load rose its calls waited 2-4x the model's prediction. On the model alone
    TP-4 still scored as well as TP-2 until the peak, where it narrowed urgently under an 8-call
    queue and every teacher restored in the overload: calls then queued ~5 s, 1.021x fifo2. Scored
    with its measured waits (as a width already is before it is grown into), the guessed width
    narrows as a planned switch at 377 s with 2 calls queued, and beats fifo2."""
    import tangram_sdk.scheduler.gpu_regime as gr

    wl = mopd(4096, gpus=8, seed=2)
    f2 = summarise(run_policy(wl, "fifo2"))["act_mean_s"]
    measured = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    monkeypatch.setattr(gr, "_CAL_NARROW", False)
    modelled = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert measured <= 0.99 * f2, (measured, f2)
    assert modelled > 1.01 * f2, (modelled, f2)


def test_a_narrowing_must_win_beyond_the_noise_of_the_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    """MOPD with calls of 3 GPU-s on 10 GPUs (seed 1): at the step's peaks (~2.5 calls/s, a 30 s
    window of ~75 calls, off by ~12 %) TP-2's Erlang C is 0.79-0.89, where the model's wait is so
    steep that TP-1 scores far better on the rates as counted, though TP-2's calls waited less than
    that and TP-1's far more (each teacher queues on its own few copies). Narrowing only when TP-1
    also wins at rates two standard errors lower, the core narrows at the first peak only, when
    the rates really are past TP-2's capacity: one TP-2 -> TP-1 round trip instead of two, fewer
    restores, and a lower mean ACT (1.032x fifo2's -> 1.010x).

    Measured with the growing bar (``_P_GROW``, stop 45) at ``_P_WAIT``: at 0.35 the pool does not
    grow back into TP-2 at the rates it would have to leave it at, which removes the second round
    trip on its own (one either way)."""
    import tangram_sdk.scheduler.gpu_regime as gr

    monkeypatch.setattr(gr, "_P_GROW", gr._P_WAIT)
    wl = mopd(1024, gpus=10, seed=1, teacher_max_gpus=4, work_mean=3.0)
    n_new, act_new = _switches_and_act(monkeypatch, wl, 2, 1)
    monkeypatch.setattr(gr, "_ROBUST", 0.0)  # the rates as counted
    n_old, act_old = _switches_and_act(monkeypatch, wl, 2, 1)
    assert n_new == 1 and n_old == 2, (n_new, n_old)
    assert act_new < 0.985 * act_old, (act_new, act_old)


def test_an_urgent_narrowing_under_a_ramp_is_sized_for_where_the_rates_are_heading(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Deepsearch's judge at 3 GPU-s a call on 8 GPUs (seed 1): the calls go from ~1/s to ~5/s
    within 20 s of the first. Narrowed at the latest rates alone (2.2/s, where TP-2 still scores
    best), the judge went TP-4 -> TP-2 and, 10 s later in the overload, TP-2 -> TP-1: every copy
    restored twice. Sized at 1.5x the latest rates while they ramp, it goes to TP-1 once, and
    the mean ACT drops (1.073x isolated's -> 1.044x)."""
    import tangram_sdk.scheduler.gpu_regime as gr

    monkeypatch.setattr(gr, "_PREP", 0.0)  # the opening-ramp rule narrows before this narrowing
    wl = deepsearch(1024, seed=1, gpus=8, judge_work_mean=3.0)
    n_new, act_new = _switches_and_act(monkeypatch, wl, 2, 1)
    monkeypatch.setattr(gr, "_AHEAD", 1.0)  # the latest rates as they are
    n_old, act_old = _switches_and_act(monkeypatch, wl, 2, 1)
    assert n_new == 0 and n_old == 1, (n_new, n_old)
    assert act_new < 0.98 * act_old, (act_new, act_old)


def _run_watching_gpu_grants(wl: Any) -> tuple[dict[str, Any], list[tuple[str | None, tuple[int, ...], float]]]:
    """Tangram's summary on ``wl`` and every GPU grant it made: (service, GPUs, time)."""
    spec_of: dict[int, ActionSpec] = {}
    placed: list[tuple[str | None, tuple[int, ...], float]] = []

    def watch(events: Any, now: float, decisions: Any) -> None:
        for ev in events:
            if isinstance(ev, Submitted):
                spec_of[ev.action_id] = ev.spec
        for d in decisions:
            if isinstance(d, Grant) and d.gpus:
                placed.append((spec_of[d.action_id].service, d.gpus, now))

    return summarise(run_policy(wl, "tangram", observers=[watch])), placed


def test_one_cell_spills_the_coldest_service_beside_it() -> None:
    """6 GPUs at TP-4 are one 4-GPU cell (8 TP-4 copies at 2 models a GPU) and two GPUs no TP-4
    cell covers. With 9 teachers fifo4 thrashes the ninth through the cell (~340 restores), and
    TP-2, where all nine fit, runs every call slower: Tangram kept TP-2 and lost 6-8 % to fifo4.
    Now eight teachers run at TP-4 in the cell and the coldest at TP-2 on GPUs 4-5: no thrash,
    and clearly better than either fixed width."""
    wl = mopd(512, gpus=6, seed=0)
    t, placed = _run_watching_gpu_grants(wl)
    best = min(summarise(run_policy(wl, p))["act_mean_s"] for p in ("fifo2", "fifo4"))
    assert t["act_mean_s"] <= 0.9 * best, (t["act_mean_s"], best)
    assert t["restores"] < 40
    # once the plan holds (after the opening), the TP-2 grants are one service's, on GPUs 4-5,
    # and every TP-4 grant is in the cell
    late = [(svc, g) for svc, g, now in placed if now > 1000.0]
    two = {svc for svc, g in late if len(g) == 2}
    assert len(two) == 1 and all(set(g) == {4, 5} for svc, g in late if len(g) == 2)
    assert all(set(g) == {0, 1, 2, 3} for svc, g in late if len(g) == 4)
    assert sum(len(g) == 4 for _s, g in late) > 10 * sum(len(g) == 2 for _s, g in late)


def test_two_cells_spill_the_coldest_service_beside_them() -> None:
    """10 GPUs of one model each (``gpu_slots=1``): TP-4's two aligned cells hold 8 copies for 9
    teachers. fifo4 thrashes the ninth through them; Tangram kept TP-2 (all nine fit) and lost
    8-12 % to fifo4. Now eight teachers run at TP-4 in the two cells, each cell scored as a queue
    of its own, and the coldest at TP-2 on GPUs 8-9."""
    wl = mopd(1024, gpus=10, seed=0, teacher_max_gpus=4, gpu_slots=1)
    t, placed = _run_watching_gpu_grants(wl)
    f4 = summarise(run_policy(wl, "fifo4"))["act_mean_s"]
    assert t["act_mean_s"] <= 0.9 * f4, (t["act_mean_s"], f4)
    late = [(svc, g) for svc, g, now in placed if now > 1000.0]
    two = {svc for svc, g in late if len(g) == 2}
    assert len(two) == 1 and all(set(g) == {8, 9} for svc, g in late if len(g) == 2)
    assert all(set(g) in ({0, 1, 2, 3}, {4, 5, 6, 7}) for svc, g in late if len(g) == 4)
    assert sum(len(g) == 4 for _s, g in late) > 10 * sum(len(g) == 2 for _s, g in late)


def test_a_model_larger_than_a_gpu_is_never_granted_one_gpu() -> None:
    """``gpu_slots=0.5``: a GPU holds half a model, so a copy needs TP-2 or wider. A fixed 1-GPU
    service spec can never be served and is refused at once, naming gpu_slots; an elastic one
    starts at 2 GPUs, never at the 1 its spec allows (the simulator's memory loop crashed on such
    a grant, and a live manager would fail every restore)."""
    s = Scheduler(Pool(gpus=4), gpu_slots=0.5)
    out = s.handle(Submitted(1, ActionSpec(kind="big", gpus=1, service="big")), 0.0)
    assert len(out) == 1 and isinstance(out[0], Reject) and "gpu_slots" in out[0].reason, out
    el = ActionSpec(kind="bige", gpus=1, service="bige", elastic=Elasticity("gpu", 4, Amdahl(0.8)))
    sizes = set()
    for i in range(2, 40):
        for d in s.handle(Submitted(i, el), float(i)):
            assert isinstance(d, Grant), d
            sizes.add(len(d.gpus))
            s.handle(Released(d.action_id), float(i) + 0.5)
    assert sizes and min(sizes) >= 2, sizes
    # with a copy per GPU (replica) no width fits half a model's room: refused too
    r = Scheduler(Pool(gpus=4), gpu_slots=0.5, gpu_instances="replica")
    out = r.handle(Submitted(1, el), 0.0)
    assert len(out) == 1 and isinstance(out[0], Reject) and "gpu_slots" in out[0].reason, out


async def test_tangram_refuses_a_service_copy_larger_than_its_gpus_at_once() -> None:
    from tangram_sdk import Tangram
    from tangram_sdk.errors import InfeasibleSpecError

    async with Tangram(Pool(gpus=2), gpu_slots=0.5) as tangram:
        with pytest.raises(InfeasibleSpecError, match="gpu_slots"):
            async with tangram.acquire(ActionSpec(kind="big", gpus=1, service="big")):
                pass


def test_a_spilled_service_called_wider_than_the_spill_width_runs_in_the_cell(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The market sizes a kind by one spec. With the coldest teacher spilled to TP-2 beside the
    one TP-4 cell of 6 GPUs, a call of that teacher's kind that needs 4 GPUs cannot run beside
    the cell (2 GPUs): it was kept there, and ran only once the spill plan changed (never, in the
    property test's machine). It must run in the cell, at once when the cell is free. A 4-GPU call
    of every teacher is added once the plan holds, so whichever is spilled is covered."""
    import attrs
    import tangram_sdk.scheduler.gpu_sizing as gs

    wl = mopd(512, gpus=6, seed=0)
    wide = {n: ActionSpec(kind=n, gpus=4, service=n, elastic=Elasticity("gpu", 4, Amdahl(0.8)))
            for n in wl.services}
    extra = tuple(Trajectory((Act(spec, 0.5),), start=1500.0 + 20.0 * i)
                  for i, spec in enumerate(wide.values()))
    wl = attrs.evolve(wl, trajectories=wl.trajectories + extra)
    choice = gs.GpuSizing.choice
    granted: dict[str, tuple[int, int]] = {}
    kept_waiting: list[tuple[str, float]] = []  # a wide call told to wait while the cell was free
    spilled: set[str] = set()

    def watched(self: gs.GpuSizing, a: Any, gfree: int, now: float) -> Any:
        out = choice(self, a, gfree, now)
        svc = a.spec.service
        if a.spec is wide.get(svc):
            if self.regime.spill is not None and svc in self.regime.spill[1]:
                spilled.add(svc)
            if out.units:
                granted[svc] = (out.units, out.cell)
            elif gfree & 0b1111 == 0b1111:
                kept_waiting.append((svc, now))
        return out

    monkeypatch.setattr(gs.GpuSizing, "choice", watched)
    r = run_policy(wl, "tangram")
    assert spilled, "no wide call met a spill plan: the test lost its point"
    assert np.all(np.isfinite(np.asarray(r.end))) and len(granted) == len(wide), granted
    assert set(granted.values()) == {(4, 0)}, granted
    assert not kept_waiting, kept_waiting


def test_a_planned_widening_restores_the_first_copies_at_the_new_width_before_its_transition_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In a planned widening's transition the old width's copies still serve. A service's first
    copy at the new width is restored anyway (by the first call after the transition, if not
    before), so it is not charged to the call that restores it: charged, every call took a free
    old-width copy, and with 9 teachers on 5 TP-2 cells every teacher restored at once when the
    transition ended. MOPD with 3 GPU-s calls on 10 GPUs (seed 2): Tangram's mean ACT drops by over
    0.5 % (0.999 -> 0.989x fifo2) and stays within the best fixed policy's (fifo2). (Seed 0, where
    it was measured first, 0.994 -> 0.986x, gains 0.4 % since narrowings must win beyond the
    rates' noise: 0.989 -> 0.985x.)"""
    import tangram_sdk.scheduler.gpu_sizing as gs

    wl = mopd(1024, gpus=10, seed=2, teacher_max_gpus=4, work_mean=3.0)
    f2 = summarise(run_policy(wl, "fifo2"))["act_mean_s"]
    sunk = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    monkeypatch.setattr(gs, "_SUNK_FIRST_COPY", False)
    charged = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert sunk < 0.995 * charged, (sunk, charged)
    assert sunk <= f2, (sunk, f2)


def test_the_opening_ramp_of_a_new_load_restores_the_narrowest_copies_before_the_overload(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Deepsearch's judge at 3 GPU-s a call on 8 GPUs (seed 1): its first calls come at ~45 s,
    ~1/s, and ~5/s from ~55 s on, an overload that lasts minutes. Narrowed TP-4 -> TP-1 in it,
    the eight TP-1 copies restored at its start (4 s each, the queue growing behind them) and
    every later call waited for that: 1.044x isolated's mean ACT (eight copies from the start).
    While the latest rates are 2.5x the smoothed ones and would keep TP-1 15 % busy, the pool
    goes TP-1 at once and every call restores a copy on an idle GPU until each GPU holds one,
    before the overload: 1.013x."""
    import tangram_sdk.scheduler.gpu_regime as gr

    wl = deepsearch(1024, seed=1, gpus=8, judge_work_mean=3.0)
    iso = summarise(run_policy(wl, "isolated"))["act_mean_s"]
    r = run_policy(wl, "tangram")
    judge = np.array(r.kind) == "judge"
    one = judge & (np.array(r.units) == 1) & (np.array(r.overhead) > 0)
    restored = np.array(r.grant)[one]
    assert len(restored) == 8 and restored.max() < 55.0, restored  # all eight before the overload
    assert summarise(r)["act_mean_s"] <= 1.02 * iso, (summarise(r)["act_mean_s"], iso)
    monkeypatch.setattr(gr, "_PREP", 0.0)
    assert summarise(run_policy(wl, "tangram"))["act_mean_s"] > 1.04 * iso


def test_a_slower_opening_ramp_is_prepared_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same judge at batch 512 (seed 0): its calls ramp over ~20 s, not ~10, so the latest
    rates read 2.2-3x the smoothed ones. At a 3x gate the ramp was missed, the guessed TP-4 queued
    and narrowed urgently with the eight TP-1 copies restored in the overload: 1.135x isolated's
    mean ACT. At 2.5x it is prepared, as at batch 1024: within 1 %."""
    import tangram_sdk.scheduler.gpu_regime as gr

    wl = deepsearch(512, seed=0, gpus=8, judge_work_mean=3.0)
    iso = summarise(run_policy(wl, "isolated"))["act_mean_s"]
    r = run_policy(wl, "tangram")
    assert summarise(r)["act_mean_s"] <= 1.01 * iso, (summarise(r)["act_mean_s"], iso)
    judge = np.array(r.kind) == "judge"
    sub = np.array(r.submit)
    assert np.array(r.units)[judge & (sub > 80.0) & (sub < 250.0)].max() == 1  # TP-1 once it ramped
    # (and wider in the step's thinning tail: TP-2 from ~259 s)
    monkeypatch.setattr(gr, "_PREP_RAMP", 3.0)
    assert summarise(run_policy(wl, "tangram"))["act_mean_s"] > 1.10 * iso


def test_a_widening_the_latest_rates_no_longer_support_is_called_off_before_its_copies_restore(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Deepsearch's default judge (seed 0) widens TP-1 -> TP-2 at its burst's peak. The TP-1
    copies serve every call for the transition's 60 s; when it ended the four TP-2 copies
    restored (evicting all eight TP-1 ones) and 5 s later the latest rates narrowed it back
    urgently, restoring eight TP-1 copies a cell at a time in the burst: 1.028x fifo2. Called
    off once TP-2 would wait too often at the latest rates, before any TP-2 copy is restored,
    it stays at TP-1: 1.010x.

    Measured as before stop 45: with the growing bar (``_P_GROW``) at ``_P_WAIT`` and no sunk first
    copy for one service (``_SUNK_ONE_SERVICE``, whose TP-2 copies restore inside the transition,
    before any call-off). As shipped, the peak's rates do not grow into TP-2 in the first place
    (1.010x, 14 restores; asserted at the end)."""
    import tangram_sdk.scheduler.gpu_regime as gr
    import tangram_sdk.scheduler.gpu_sizing as gs

    monkeypatch.setattr(gr, "_P_GROW", gr._P_WAIT)
    monkeypatch.setattr(gs, "_SUNK_ONE_SERVICE", False)
    wl = deepsearch(2048, seed=0)
    f2 = summarise(run_policy(wl, "fifo2"))["act_mean_s"]
    r = run_policy(wl, "tangram")
    assert summarise(r)["act_mean_s"] <= 1.02 * f2, (summarise(r)["act_mean_s"], f2)
    assert r.restores <= 12
    monkeypatch.setattr(gr, "_CALL_OFF", False)
    r0 = run_policy(wl, "tangram")
    assert summarise(r0)["act_mean_s"] > 1.02 * f2 and r0.restores > 16
    monkeypatch.undo()  # as shipped: the growing bar keeps it narrow at the peak
    r1 = run_policy(wl, "tangram")
    assert summarise(r1)["act_mean_s"] <= 1.02 * f2 and r1.restores < r0.restores


def test_a_load_returning_after_a_lull_is_met_at_the_width_its_last_peak_saturated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two RL steps of the saturated judge (batch 512, 3 GPU-s calls on 8 GPUs, seed 10). Step
    0's tail thins and the pool widens (TP-2..TP-8); the trainer's update is a lull. Without a
    memory of step 0, step 1's burst narrowed urgently with every TP-1 copy restored in the
    overload: 1.36x isolated's step-1 mean ACT (whose eight servers stay loaded). Recalled (TP-1,
    which step 0 ran saturated at, restored on the idle pool as the load returns): isolated's."""
    import tangram_sdk.scheduler.gpu_regime as gr
    from tangram_sdk.sim.workloads import rl_steps

    wl = rl_steps(deepsearch, 512, steps=2, seed=10, gpus=8, judge_work_mean=3.0)
    iso = summarise(run_policy(wl, "isolated"), step=1)["act_mean_s"]
    r = run_policy(wl, "tangram")
    assert summarise(r, step=1)["act_mean_s"] <= 1.01 * iso, (summarise(r, step=1)["act_mean_s"], iso)
    judge1 = (np.array(r.kind) == "judge") & (np.array(r.submit) > r.step_start[1])
    assert (np.array(r.units)[judge1] == 1).mean() >= 0.95  # TP-1, but for the first calls and the tail
    monkeypatch.setattr(gr, "_LULL", math.inf)  # no memory across the lull
    assert summarise(run_policy(wl, "tangram"), step=1)["act_mean_s"] > 1.2 * iso


def test_a_width_is_grown_into_only_with_headroom_for_rate_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deepsearch's 3 GPU-s judge at batch 256 on 8 GPUs (seed 1), where fixed TP-2 is the best
    policy: the opening ramp narrows to TP-1, and at the mean rate the model then scores TP-4 best.
    Grown into at Erlang C 0.40, the next rate peak put TP-4 past capacity and it narrowed back to
    TP-1 urgently, calls queueing 2.3-2.6 s across the switch; and each widening's transition served
    every call on the free TP-1 copies for 60 s, so TP-2 and TP-4 copies hardly served: 1.065x
    fifo2's mean ACT. With the growing bar (``_P_GROW`` 0.35: TP-2, Erlang C 0.12) and the first
    copy at the new width sunk for a one-service pool (``_SUNK_ONE_SERVICE``): within 3 %."""
    import tangram_sdk.scheduler.gpu_regime as gr
    import tangram_sdk.scheduler.gpu_sizing as gs

    wl = deepsearch(256, seed=1, gpus=8, judge_work_mean=3.0)
    f2 = summarise(run_policy(wl, "fifo2"))["act_mean_s"]
    r = run_policy(wl, "tangram")
    assert summarise(r)["act_mean_s"] <= 1.03 * f2, (summarise(r)["act_mean_s"], f2)
    units, judge = np.array(r.units), np.array(r.kind) == "judge"
    assert (units[judge] == 4).sum() < (units[judge] == 2).sum()  # TP-2 rather than TP-4
    monkeypatch.setattr(gr, "_P_GROW", gr._P_WAIT)
    monkeypatch.setattr(gs, "_SUNK_ONE_SERVICE", False)
    old = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert old > 1.05 * f2, (old, f2)


def test_a_clump_mid_step_is_not_read_as_a_ramp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deepsearch's judge at 1.5 GPU-s a call, batch 512 on 8 GPUs (seed 0), at TP-2 mid-step: a
    clump of arrivals 1.6x the smoothed rate puts the latest rates 6 % past TP-2's capacity. Read
    as a ramp, it narrowed to TP-1 at once, restoring eight copies, and stayed narrow for a regime
    window (1.042x fifo2's mean ACT); a ramp that skips the backlog gate must overload the width
    1.3 times over, and fifo2-like, the pool queues through the clump."""
    import tangram_sdk.scheduler.gpu_regime as gr

    wl = deepsearch(512, seed=0, gpus=8, judge_work_mean=1.5)
    f2 = summarise(run_policy(wl, "fifo2"))["act_mean_s"]
    act = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert act <= 1.03 * f2, (act, f2)
    monkeypatch.setattr(gr, "_RAMP_OVER", 0.0)
    old = summarise(run_policy(wl, "tangram"))["act_mean_s"]
    assert old > 1.035 * f2 and act < 0.99 * old, (old, act, f2)
