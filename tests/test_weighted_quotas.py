"""Weighted (token) quotas and deadlines: requests/min and tokens/min enforced together, token
corrections after the call, deadlines refused at admission or expired in the queue. The core
takes time as an argument, so these run on a virtual clock."""

import asyncio

import pytest

from tangram_sdk import ActionSpec, DeadlineError, InfeasibleSpecError, Pool, Quota, SpecError, Tangram
from tangram_sdk.scheduler.core import Scheduler
from tangram_sdk.scheduler.decisions import Grant, Reject
from tangram_sdk.scheduler.events import Submitted, Tick, TokensUsed


def judge(tokens, kind="judge"):
    return ActionSpec(kind=kind, quotas={"judge": 1}, tokens={"judge": tokens})


def drive(s, specs, until=600.0):
    """Submit every spec at t=0, release each at once when granted, follow the scheduler's timer;
    return the grant time of each."""
    granted = {}
    t = 0.0
    out = s.handle_many([Submitted(i, sp) for i, sp in enumerate(specs)], t)
    while True:
        for d in out:
            if isinstance(d, Grant):
                granted[d.action_id] = t
                s.release(d.action_id, t)
        if len(granted) == len(specs) or s.next_wakeup is None or t > until:
            return granted
        t = s.next_wakeup
        out = s.handle(Tick(), t)
        s.check_invariants()


def test_per_minute_builds_both_buckets():
    q = Quota.per_minute(requests=600, tokens=90_000, concurrency=8)
    assert q.rate == 10.0 and q.bucket == 600
    assert q.tokens_per_s == 1500.0 and q.token_bucket == 90_000
    assert Quota(tokens_per_s=10.0).token_bucket == 600  # default: one minute's worth
    for bad in (dict(tokens_per_s=0), dict(tokens_per_s=float("nan")), dict(token_burst=5),
                dict(tokens_per_s=1.0, token_burst=0)):
        with pytest.raises(SpecError):
            Quota(concurrency=1, **bad)


def test_tokens_per_minute_bind_when_calls_are_large():
    # 6,000 tokens/min (100/s, bucket 6,000) and 600 requests/min: ten 1,000-token calls -> six
    # go at once, then one every 10 s as the token bucket refills
    s = Scheduler(Pool(quotas={"judge": Quota.per_minute(requests=600, tokens=6000)}))
    g = drive(s, [judge(1000) for _ in range(10)])
    times = sorted(g.values())
    assert times[:6] == [0.0] * 6
    assert times[6:] == pytest.approx([10.0, 20.0, 30.0, 40.0])


def test_requests_per_minute_bind_when_calls_are_small():
    # 60 requests/min (1/s, bucket 60) and a roomy token limit: the 61st..63rd wait 1 s each
    s = Scheduler(Pool(quotas={"judge": Quota.per_minute(requests=60, tokens=1_000_000)}))
    g = drive(s, [judge(10) for _ in range(63)])
    times = sorted(g.values())
    assert times[:60] == [0.0] * 60
    assert times[60:] == pytest.approx([1.0, 2.0, 3.0])


def test_a_correction_after_the_call_moves_the_bucket():
    pool = Pool(quotas={"judge": Quota(tokens_per_s=100.0, token_burst=1000)})
    s = Scheduler(pool)
    assert isinstance(s.submit(1, judge(500), 0.0)[0], Grant)
    s.release(1, 0.0)
    s.tokens_used("judge", 400.0, 0.0)  # it really drew 900: 100 left
    assert s.statistics()["quotas"]["judge"]["token_level"] == pytest.approx(100.0)
    assert s.submit(2, judge(500), 0.0) == []  # needs 500: waits 4 s
    assert s.next_wakeup == pytest.approx(4.0)
    # an overestimate gives tokens back, capped at the bucket
    s2 = Scheduler(pool)
    s2.submit(1, judge(800), 0.0)
    s2.tokens_used("judge", -700.0, 0.0)
    assert s2.statistics()["quotas"]["judge"]["token_level"] == pytest.approx(900.0)
    with pytest.raises(KeyError):
        s2.handle(TokensUsed("nope", 1.0), 0.0)


def test_infeasible_token_demands_are_refused_at_once():
    s = Scheduler(Pool(quotas={"judge": Quota(tokens_per_s=10.0, token_burst=100),
                               "plain": Quota(concurrency=2)}))
    for spec, word in [(judge(101), "token burst"),
                       (ActionSpec(kind="x", tokens={"plain": 1}), "no token-rate limit"),
                       (ActionSpec(kind="x", tokens={"nope": 1}), "no token-rate limit")]:
        d = s.submit(s.submitted + 1, spec, 0.0)
        assert isinstance(d[0], Reject) and word in d[0].reason
    with pytest.raises(SpecError):
        ActionSpec(kind="x", tokens={"judge": 0})


def test_a_deadline_that_cannot_be_met_is_refused_at_admission():
    s = Scheduler(Pool(cpus=1))
    s.submit(1, ActionSpec(kind="long", cpus=1, duration=10.0), 0.0)
    d = s.submit(2, ActionSpec(kind="quick", cpus=1, duration=1.0), 0.0, deadline=5.0)
    assert isinstance(d[0], Reject) and d[0].code == "deadline" and "about 10.000 s" in d[0].reason
    assert s.queued == 0
    # a reachable deadline queues, and the action is granted when the core frees
    assert s.submit(3, ActionSpec(kind="quick", cpus=1, duration=1.0), 0.0, deadline=12.0) == []
    assert isinstance(s.release(1, 10.0)[0], Grant)
    s.check_invariants()


def test_a_queued_action_is_dropped_when_its_deadline_passes():
    s = Scheduler(Pool(cpus=1))
    s.submit(1, ActionSpec(kind="long", cpus=1, duration=2.0), 0.0)
    assert s.submit(2, ActionSpec(kind="q", cpus=1, duration=1.0), 0.0, deadline=3.0) == []
    assert s.next_wakeup == pytest.approx(3.0)
    d = s.handle(Tick(), 3.0)  # the long one overran its estimate: 2 is still queued at 3.0
    assert len(d) == 1 and isinstance(d[0], Reject) and d[0].code == "deadline"
    assert s.queued == 0 and s.next_wakeup is None
    s.release(1, 4.0)
    s.check_invariants()


def test_deadlines_on_tokens_and_past_deadlines():
    s = Scheduler(Pool(quotas={"judge": Quota(tokens_per_s=100.0, token_burst=1000)}))
    assert isinstance(s.submit(1, judge(1000), 0.0)[0], Grant)
    assert s.submit(2, judge(500), 0.0, deadline=4.0)[0].code == "deadline"  # needs 5 s of refill
    assert s.submit(3, judge(500), 0.0, deadline=6.0) == []
    assert s.submit(4, judge(1), 0.0, deadline=0.0)[0].code == "deadline"


async def test_runtime_deadline_refused_at_once_and_expired_in_the_queue():
    async with Tangram(Pool(cpus=1)) as t:
        loop = asyncio.get_running_loop()
        hold = ActionSpec(kind="hold", cpus=1, duration=30.0)
        async with t.acquire(hold):
            t0 = loop.time()
            with pytest.raises(DeadlineError, match="cannot start before its deadline"):
                async with t.acquire(ActionSpec(kind="quick", cpus=1), deadline=t0 + 0.5):
                    pytest.fail("ran")
            assert loop.time() - t0 < 0.1  # at once, not after waiting
        # a holder expected to end in 0.1 s that really holds 0.6 s: the waiter may make its
        # 0.3 s deadline as far as anyone can tell, so it queues, and is dropped at the deadline
        async with t.acquire(ActionSpec(kind="brief", cpus=1, duration=0.1)):
            t1 = loop.time()
            with pytest.raises(DeadlineError, match="not granted before its deadline"):
                async with t.acquire(ActionSpec(kind="next", cpus=1), deadline=t1 + 0.3):
                    pytest.fail("ran")
            assert 0.25 < loop.time() - t1 < 0.5
            await asyncio.sleep(0.3)
        assert isinstance(DeadlineError("x"), TimeoutError)
        st = t.statistics()
        assert st["queued"] == 0 and st["cpus_free"] == 1
        with pytest.raises(SpecError):
            t.acquire(ActionSpec(kind="q"), deadline="soon")
        with pytest.raises(InfeasibleSpecError):
            async with t.acquire(ActionSpec(kind="big", cpus=2), deadline=loop.time() + 10):
                pass


async def test_runtime_token_report_corrects_the_bucket():
    async with Tangram(Pool(quotas={"judge": Quota(tokens_per_s=1.0, token_burst=1000)})) as t:
        async with t.acquire(judge(100)) as lease:
            t.report_tokens(lease, "judge", 900)
        level = t.statistics()["quotas"]["judge"]["token_level"]
        assert level == pytest.approx(100.0, abs=1.0)
        with pytest.raises(SpecError):
            t.report_tokens(lease, "other", 1)
