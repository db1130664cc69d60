"""Hypothesis properties of the core: never over-allocate, minimum honoured, no action lost, and
every action eventually runs once the running ones finish (FCFS progress), on the core's own
timer alone once nothing runs."""

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Quota, Scheduler
from tangram_sdk.scheduler.decisions import Grant, Reject, Resize
from tangram_sdk.scheduler.events import Cancelled, Released, ServiceResidency, Submitted, Tick

POOL = Pool(cpus="0-7", numa=[[0, 1, 2, 3], [4, 5, 6, 7]], gpus=4, memory=1000,
            quotas={"api": Quota(concurrency=3, rate=5.0, burst=2), "db": Quota(concurrency=2)})


@st.composite
def specs(draw):
    cpus = draw(st.integers(0, 6))
    gpus = draw(st.sampled_from([0, 0, 1, 2, 4]))
    el = None
    kind = draw(st.sampled_from(["a", "b", "c"]))
    r = draw(st.sampled_from([None, "cpu", "gpu"]))
    if r == "cpu" and cpus:
        mode = draw(st.sampled_from(["moldable", "moldable", "malleable", "restartable"]))
        el = Elasticity("cpu", max_units=cpus + draw(st.integers(0, 6)), efficiency=Amdahl(draw(st.floats(0, 1))),
                        malleable=mode == "malleable", restartable=mode == "restartable")
    elif r == "gpu" and gpus:
        el = Elasticity("gpu", max_units=draw(st.sampled_from([g for g in (1, 2, 4, 8) if g >= gpus])),
                        efficiency={1: 1.0, 2: 0.9, 4: 0.8, 8: 0.7})
    quotas = draw(st.dictionaries(st.sampled_from(["api", "db"]), st.integers(1, 2), max_size=2))
    service = draw(st.sampled_from([None, "rm", "tm"])) if gpus else None
    return ActionSpec(kind=kind, cpus=cpus, gpus=gpus, memory=draw(st.sampled_from([0, 0, 300, 700])),
                      quotas=quotas, elastic=el, duration=draw(st.one_of(st.none(), st.floats(0.01, 5))),
                      priority=draw(st.sampled_from([0, 0, 0, 1])), service=service)


def _submit(m, spec, dt) -> None:
    """Submit ``spec`` ``dt`` seconds on, as a waiter the machine tracks."""
    m.now += dt
    aid = m.next_id
    m.next_id += 1
    m.specs[aid] = spec
    m.queued.add(aid)
    m._take(m.s.handle(Submitted(aid, spec), m.now))


def _drain(m) -> None:
    """Finish what runs, one action a second: that must run every waiter. With nothing running,
    only the core's own timer (``next_wakeup``, what the runtime arms) moves time on: a quiet core
    with a waiter and no timer armed would leave it waiting for good (the runtime never ticks
    on its own)."""
    for _ in range(10_000):
        if not m.queued and not m.running:
            break
        if m.running:
            m.now += 1.0
            aid = min(m.running)
            del m.running[aid]
            m._take(m.s.handle(Released(aid), m.now))
        else:
            wake = m.s.next_wakeup
            assert wake is not None, f"waiters {sorted(m.queued)}, nothing running, no wake-up armed"
            m.now = max(m.now, wake)
            m._take(m.s.handle(Tick(), m.now))
    assert not m.queued, f"actions never ran: {sorted(m.queued)}"


class CoreMachine(RuleBasedStateMachine):
    node = 4  # cores per NUMA node of the pool

    def __init__(self):
        super().__init__()
        self.s = Scheduler(POOL, window=4, depth=8)
        self.now = 0.0
        self.next_id = 1
        self.queued: set[int] = set()
        self.running: dict[int, Grant] = {}
        self.specs: dict[int, ActionSpec] = {}
        self.admitted: dict[int, tuple[int, ...]] = {}  # cores each running action was granted
        self.restarted: set[int] = set()

    def _take(self, decisions):
        for d in decisions:
            if isinstance(d, Resize):
                # only a running malleable (grown / shrunk back) or restartable (grown, once) action
                assert d.action_id in self.running, "resize of an action that is not running"
                el = self.specs[d.action_id].elastic
                assert el is not None and (el.malleable or el.restartable)
                old, base = set(self.running[d.action_id].cpus), set(self.admitted[d.action_id])
                new = set(d.cpus)
                assert len(new) == d.units and el.max_units >= d.units >= self.specs[d.action_id].cpus
                # cores are added on a node the action already holds: one node for a grant that fit
                # in one, and no new node for one whose minimum needed two (a 5-core minimum on 4-core
                # nodes is granted across both, and may grow into a core freed on either)
                nodes = {c // self.node for c in new}
                assert nodes <= {c // self.node for c in old}, "a resize onto a NUMA node the action did not hold"
                if el.restartable:
                    assert new > old and d.action_id not in self.restarted, "a restart shrank or repeated"
                    self.restarted.add(d.action_id)
                else:
                    assert new > old or new == base, "a malleable resize that is neither a grow nor a shrink back"
                self.running[d.action_id] = self.running[d.action_id]._replace(cpus=d.cpus, units=d.units)
            elif isinstance(d, Grant):
                assert d.action_id in self.queued, "grant for an action that is not waiting"
                self.queued.discard(d.action_id)
                self.running[d.action_id] = d
                self.admitted[d.action_id] = d.cpus
                spec = self.specs[d.action_id]
                assert len(d.cpus) >= spec.cpus and len(d.gpus) >= spec.gpus
                if spec.elastic is not None:
                    assert spec.min_units <= d.units <= spec.max_units
                    n = len(d.cpus) if spec.elastic.resource == "cpu" else len(d.gpus)
                    assert n == d.units
                if d.gpus:
                    idx = [POOL.gpus.index(g) for g in d.gpus]
                    k = len(idx)
                    assert idx == list(range(idx[0], idx[0] + k)) and idx[0] % k == 0, "unaligned cell"
                if len(d.cpus) <= self.node:
                    nodes = {c // self.node for c in d.cpus}
                    assert len(nodes) <= 1, f"NUMA-spanning grant {d.cpus} that fits a node"
            elif isinstance(d, Reject):
                self.queued.discard(d.action_id)

    @rule(spec=specs(), dt=st.floats(0, 0.5))
    def submit(self, spec, dt):
        _submit(self, spec, dt)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), dt=st.floats(0, 0.5), failed=st.booleans())
    def release(self, data, dt, failed):
        self.now += dt
        aid = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[aid]
        self._take(self.s.handle(Released(aid, failed=failed), self.now))

    @precondition(lambda self: self.queued or self.running)
    @rule(data=st.data())
    def cancel(self, data):
        aid = data.draw(st.sampled_from(sorted(self.queued | set(self.running))))
        self.queued.discard(aid)
        self.running.pop(aid, None)
        self._take(self.s.handle(Cancelled(aid), self.now))

    @rule(dt=st.floats(0, 1))
    def tick(self, dt):
        self.now += dt
        self._take(self.s.handle(Tick(), self.now))

    @rule(dt=st.floats(2, 60))
    def wait_long(self, dt):
        """Time passes with nothing new: running actions outrun their estimates (malleable ones
        may grow into idle cores, restartable ones be restarted there)."""
        self.now += dt
        self._take(self.s.handle(Tick(), self.now))

    @rule(service=st.sampled_from(["rm", "tm"]), g=st.sampled_from([0, 1, 2, 3]), resident=st.booleans())
    def residency(self, service, g, resident):
        self._take(self.s.handle(ServiceResidency(service, (g,), resident, restore_s=0.2), self.now))

    @invariant()
    def ledger_consistent(self):
        self.s.check_invariants()
        assert self.s.queued == len(self.queued)
        assert self.s.running == len(self.running)

    def teardown(self):
        _drain(self)
        self.s.check_invariants()
        assert self.s.ledger.free_cpus == 8 and self.s.ledger.free_gpus == 4


TestCoreMachine = CoreMachine.TestCase
TestCoreMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["sub", "sub", "sub", "rel", "cancel", "tick"]), specs(),
                          st.floats(0, 0.3), st.integers(0, 10_000)), max_size=40))
def test_round_skipping_changes_no_decision(script):
    """Skipping provably-blocked rounds, and deciding an arrival at an empty queue without queueing
    it, are optimisations only: same decisions as queueing every event and always planning."""
    fast, slow = Scheduler(POOL, window=4, depth=8), Scheduler(POOL, window=4, depth=8, skip_rounds=False)
    ref = Scheduler(POOL, window=4, depth=8, skip_rounds=False)
    now, aid, running, queued = 0.0, 0, [], set()
    for op, spec, dt, pick in script:
        now += dt
        if op == "sub":
            aid += 1
            ev = Submitted(aid, spec)
            queued.add(aid)
        elif op == "rel" and running:
            ev = Released(running.pop(pick % len(running)))
        elif op == "cancel" and queued:
            victim = sorted(queued)[pick % len(queued)]
            queued.discard(victim)
            ev = Cancelled(victim)
        else:
            ev = Tick()
        a, b, c = fast.handle(ev, now), slow.handle(ev, now), ref.handle_many([ev], now)
        assert a == b == c
        for d in a:
            if isinstance(d, Grant):
                queued.discard(d.action_id)
                running.append(d.action_id)
            elif isinstance(d, Reject):
                queued.discard(d.action_id)


CPU8 = Pool(cpus=8)  # one node: a fixed action of 7 leaves a resizable one a single core
_RESIZABLE = [ActionSpec(kind=k, cpus=1, elastic=Elasticity("cpu", 8, Amdahl(p), malleable=k == "m",
                                                           restartable=k == "r"))
              for k, p in (("m", 0.9), ("r", 0.95), ("r", 1.0))] + [ActionSpec(kind="f", cpus=c) for c in (2, 7)]


class CpuResizeMachine(CoreMachine):
    """The CPU core where resizes happen: malleable and restartable actions of learned, spread-out
    lengths on one 8-core node, next to fixed ones; time jumps make them outrun their kinds while
    cores go idle. Every Resize is checked by ``_take`` (running, a grow or a shrink back, on one
    node, a restart never shrinking or repeating), the ledger by the invariant."""

    node = 8

    def __init__(self):
        super().__init__()
        self.s = Scheduler(CPU8)

    @initialize(seed=st.integers(0, 2**16))
    def teach(self, seed):
        """32 completions of each resizable kind, one at a time, lognormal lengths (sigma 1): the
        kinds know their spread before the machine starts (a restart needs it)."""
        import random

        rng = random.Random(seed)
        for spec in _RESIZABLE[:3]:
            for _ in range(32):
                _submit(self, spec, 0.0)
                (aid,) = self.running
                self.now += rng.lognormvariate(-0.5, 1.0)
                del self.running[aid]
                self._take(self.s.handle(Released(aid), self.now))

    @rule(i=st.integers(0, len(_RESIZABLE) - 1), dt=st.floats(0, 0.5))
    def submit_resizable(self, i, dt):
        _submit(self, _RESIZABLE[i], dt)

    def teardown(self):
        _drain(self)
        self.s.check_invariants()
        assert self.s.ledger.free_cpus == 8


TestCpuResizeMachine = CpuResizeMachine.TestCase
TestCpuResizeMachine.settings = settings(max_examples=100, stateful_step_count=60, deadline=None)


GPU6 = Pool(gpus=6)  # one TP-4 cell and two GPUs beside it: where a width may spill


@st.composite
def gpu_specs(draw):
    service = draw(st.sampled_from(["t0", "t1", "t2", "t3", "t4", "t5"]))
    gpus = draw(st.sampled_from([1, 1, 2, 4]))
    el = None
    if draw(st.booleans()):
        el = Elasticity("gpu", max_units=draw(st.sampled_from([g for g in (1, 2, 4) if g >= gpus])),
                        efficiency=Amdahl(0.8))
    return ActionSpec(kind=service + ("e" if el else ""), gpus=gpus, service=service, elastic=el,
                      duration=draw(st.one_of(st.none(), st.floats(0.05, 3))))


class GpuMachine(RuleBasedStateMachine):
    """GPU services on 6 GPUs at 0.5-2 models a GPU: never over-allocated, aligned cells, a
    service's copy always fits the GPUs it is granted (1/k of a model each, <= gpu_slots), every
    action runs once the others finish."""

    def __init__(self):
        super().__init__()
        self.s = None
        self.now = 0.0
        self.next_id = 1
        self.queued: set[int] = set()
        self.running: dict[int, Grant] = {}
        self.specs: dict[int, ActionSpec] = {}

    @initialize(slots=st.sampled_from([0.5, 1.0, 2.0]))
    def pool(self, slots):
        self.slots = slots
        self.s = Scheduler(GPU6, gpu_slots=slots)

    def _take(self, decisions):
        for d in decisions:
            if isinstance(d, Grant):
                assert d.action_id in self.queued
                self.queued.discard(d.action_id)
                self.running[d.action_id] = d
                k = len(d.gpus)
                assert k >= self.specs[d.action_id].gpus and d.gpus[0] % k == 0, d
                assert 1.0 / k <= self.slots + 1e-9, f"a copy of a model does not fit {k} GPU(s): {d}"
            elif isinstance(d, Reject):
                assert "gpu_slots" in d.reason and self.specs[d.action_id].gpus < 2, d
                self.queued.discard(d.action_id)

    @rule(spec=gpu_specs(), dt=st.floats(0, 5))
    def submit(self, spec, dt):
        _submit(self, spec, dt)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), dt=st.floats(0, 5))
    def release(self, data, dt):
        self.now += dt
        aid = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[aid]
        self._take(self.s.handle(Released(aid), self.now))

    @rule(dt=st.floats(0, 5))
    def tick(self, dt):
        self.now += dt
        self._take(self.s.handle(Tick(), self.now))

    @invariant()
    def ledger_consistent(self):
        if self.s is not None:
            self.s.check_invariants()
            assert self.s.queued == len(self.queued) and self.s.running == len(self.running)

    def teardown(self):
        if self.s is None:
            return
        _drain(self)
        assert self.s.ledger.free_gpus == 6


TestGpuMachine = GpuMachine.TestCase
TestGpuMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None, report_multiple_bugs=False)
