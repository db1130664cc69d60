"""The pure core never leaves work queued that fits idle resources without a wake-up, and one
odd but valid spec never breaks it (found by a fuzzer that, before every event, asks a copy of the
core what a Tick would decide: anything granted there was a missed wake-up)."""

from __future__ import annotations

import time

import pytest

from tangram_sdk import ActionSpec, Elasticity, Pool, Quota, Scheduler
from tangram_sdk.scheduler import Grant, Reject, Released, Submitted, Tick


def granted(decisions: list, aid: int) -> bool:  # type: ignore[type-arg]
    return any(isinstance(d, Grant) and d.action_id == aid for d in decisions)


def test_a_deadline_refusal_in_a_batch_lets_the_waiter_behind_it_start() -> None:
    s = Scheduler(Pool(cpus=8))
    s.submit(1, ActionSpec(kind="r", cpus=1, duration=100.0), 0.0)
    small = ActionSpec(kind="small", cpus=1, duration=1.0)
    wide = ActionSpec(kind="wide", cpus=8, duration=1.0, priority=1)  # ahead of small, cannot make it
    out = s.handle_many([Submitted(2, small), Submitted(3, wide, deadline=0.5)], 0.0)
    assert any(isinstance(d, Reject) and d.action_id == 3 and d.code == "deadline" for d in out)
    assert granted(out, 2) and s.queued == 0  # was: queued with 7 idle cores and no wake-up


def test_a_deadline_refusal_on_submit_reruns_the_round() -> None:
    s = Scheduler(Pool(cpus=2, quotas={"api": Quota(rate=1.0, burst=1)}))
    s.submit(1, ActionSpec(kind="r", cpus=1, duration=100.0), 0.0)
    s.submit(2, ActionSpec(kind="q", quotas={"api": 1}, duration=100.0), 0.0)  # takes the token
    s.submit(3, ActionSpec(kind="c", cpus=1, quotas={"api": 1}, duration=1.0), 0.1)  # waits for it
    out = s.submit(4, ActionSpec(kind="b", cpus=2, duration=1.0, priority=1), 1.5, deadline=1.6)
    assert out[0] == Reject(4, out[0].reason, "deadline")
    assert granted(out, 3)  # the token was back since 1.0; the refused one no longer blocks it


def test_the_deadline_estimate_is_optimistic_about_waiters_it_can_pass() -> None:
    def run(deadline: float | None) -> list:  # type: ignore[type-arg]
        s = Scheduler(Pool(cpus=8, gpus=1))
        out = s.submit(1, ActionSpec(kind="g", gpus=1, duration=100.0), 0.0)
        out += s.submit(2, ActionSpec(kind="r", cpus=4, duration=1.0), 0.0)
        out += s.submit(3, ActionSpec(kind="x", cpus=3, gpus=1, duration=1.0), 0.0)  # waits for the GPU
        out += s.submit(4, ActionSpec(kind="a", cpus=6, duration=1.0), 0.0, deadline=deadline)
        return out + s.release(2, 1.0)

    assert granted(run(None), 4)
    assert granted(run(2.0), 4)  # was refused at once: "estimated start never"


def test_a_rate_limited_bucket_refills_past_its_burst_for_the_queue_ahead() -> None:
    s = Scheduler(Pool(quotas={"api": Quota(rate=1.0)}))  # burst 1
    spec = ActionSpec(kind="call", quotas={"api": 1}, duration=0.1)
    out = s.submit(1, spec, 0.0) + s.submit(2, spec, 0.0) + s.submit(3, spec, 0.0, deadline=10.0)
    assert not any(isinstance(d, Reject) for d in out)  # was "never": 2 tokens needed > burst 1
    out = s.release(1, 0.1)
    t = 0.1
    while s.next_wakeup is not None and not granted(out, 3):
        t = s.next_wakeup
        out += s.handle(Tick(), t)
    assert granted(out, 3) and t == pytest.approx(2.0)
    assert not any(isinstance(d, Reject) and d.action_id == 3 for d in out)


def test_a_duplicate_id_is_refused_even_with_a_past_deadline() -> None:
    s = Scheduler(Pool(cpus=2))
    spec = ActionSpec(kind="x", cpus=1)
    s.submit(1, spec, 0.0)
    with pytest.raises(ValueError, match="submitted twice"):
        s.submit(1, spec, 1.0, deadline=0.5)
    with pytest.raises(ValueError, match="submitted twice"):
        s.handle_many([Submitted(1, spec, deadline=0.5)], 1.0)
    st = s.statistics()
    assert (st.running, st.submitted, st.rejected) == (1, 1, 0)


def test_an_elastic_range_beyond_the_pool_is_cut_to_it() -> None:
    def eff(m: int) -> float:  # profiled up to 1024 only, as a user's table might be
        if m > 1024:
            raise ValueError(f"not profiled at {m}")
        return 1.0

    s = Scheduler(Pool(cpus=8))
    out = s.submit(1, ActionSpec(kind="x", cpus=1, elastic=Elasticity("cpu", max_units=2048, efficiency=eff)), 0.0)
    assert granted(out, 1) and out[0].units == 8
    s.release(1, 1.0)
    t0 = time.perf_counter()
    out = s.submit(2, ActionSpec(kind="y", cpus=1, elastic=Elasticity("cpu", max_units=10**7)), 2.0)
    assert granted(out, 2) and out[0].units == 8
    assert time.perf_counter() - t0 < 0.5  # was 13.6 s: T(m) evaluated up to max_units
    s.handle(Released(2), 3.0)
    s.check_invariants()


@pytest.mark.parametrize("cores", [1100, 2048])  # the range cut to the pool, or the pool as large
def test_an_efficiency_failing_past_1024_is_refused_on_a_larger_pool(cores: int) -> None:
    def eff(m: int) -> float:
        if m > 1024:
            raise ValueError(f"not profiled at {m}")
        return 1.0

    s = Scheduler(Pool(cpus=cores))
    out = s.submit(1, ActionSpec(kind="x", cpus=1, elastic=Elasticity("cpu", max_units=2048, efficiency=eff)), 0.0)
    assert isinstance(out[0], Reject) and "efficiency model raised at m=1025" in out[0].reason
    # the core goes on: nothing of it is queued
    assert granted(s.submit(2, ActionSpec(kind="plain", cpus=1), 1.0), 2) and s.queued == 0
    s.check_invariants()


def test_a_direct_grant_keeps_a_malleable_actions_grow_look() -> None:
    s = Scheduler(Pool(cpus=8))
    mall = ActionSpec(kind="m", cpus=1, duration=1.0, elastic=Elasticity("cpu", 8, malleable=True))
    s.handle(Submitted(1, ActionSpec(kind="big", cpus=7, duration=10.0)), 0.0)
    s.handle(Submitted(2, mall), 0.0)  # the one free core; may grow once past its estimate (1.0)
    s.handle(Released(1), 0.5)
    assert s.next_wakeup == pytest.approx(1.0)
    assert granted(s.handle(Submitted(3, ActionSpec(kind="small", cpus=1, duration=100.0)), 0.6), 3)
    assert s.next_wakeup == pytest.approx(1.0)  # was cleared: it never grew into the 6 idle cores
    out = s.handle(Tick(), s.next_wakeup)
    assert out and out[0].action_id == 2 and out[0].units == 7


@pytest.mark.parametrize("mode", ["malleable", "restartable"])
def test_the_first_malleable_or_restartable_grant_arms_its_look(mode: str) -> None:
    el = Elasticity("cpu", 8, **{mode: True})
    s = Scheduler(Pool(cpus=8))
    out = s.handle_many([Submitted(1, ActionSpec(kind="m", cpus=1, duration=1.0, elastic=el)),
                         Submitted(2, ActionSpec(kind="f", cpus=1, duration=100.0))], 0.0)
    assert granted(out, 1) and granted(out, 2)
    assert s.next_wakeup is not None  # was None: an idle core and nobody to look at it


def test_a_call_waiting_for_a_busy_warm_copy_is_looked_at_again() -> None:
    # the wait pays while the copy's holder is expected to end soon; once it overruns (assumed
    # half done, so its remainder grows with its age), restoring on the idle GPU pays: the core
    # must look again by itself, not wait for the holder's release
    from tangram_sdk.scheduler import ServiceResidency

    s = Scheduler(Pool(gpus=2))
    spec = ActionSpec(kind="call", gpus=1, service="s", duration=1.0)
    s.handle(ServiceResidency("s", (0,), True, restore_s=5.0), 0.0)
    assert granted(s.handle(Submitted(1, spec), 0.0), 1)  # warm on GPU 0
    assert s.handle(Submitted(2, spec), 0.1) == []  # waits for the warm copy rather than restore
    out: list = []  # type: ignore[type-arg]
    looks = 0
    while not granted(out, 2):
        assert s.next_wakeup is not None and looks < 20  # was None: it waited for the release
        looks += 1
        out = s.handle(Tick(), s.next_wakeup)
    assert out[0].gpus == (1,) and out[0].restore and s.running == 2
