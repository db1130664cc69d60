"""A Hypothesis state machine over the PUBLIC API with real asyncio tasks: acquire (with or without a
timeout), let the loop run, release, raise inside the action, cancel (queued, granted-not-woken,
applying, held, releasing) in any interleaving; after every step the core's invariants hold and the
pool accounting matches what the live leases hold. Each example gets a fresh event loop.

``TestApiMachine`` has no managers (grants are pure accounting). ``TestApiMachineWithManager``
adds a :class:`~tangram_sdk.testing.FakeManager` that awaits in apply and release, so cancels land
inside them too; every apply it began must have been released when the example ends (a cancel
during a manager's release once skipped ``Tangram._leave``: tests/test_chaos.py). On a failure
Hypothesis prints the shortest interleaving that leaks.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Quota, Tangram
from tangram_sdk.testing import FakeManager

POOL = Pool(cpus="0-3", numa=[[0, 1], [2, 3]], gpus=2, gpu_cells=(1, 2),
            quotas={"api": Quota(concurrency=2, rate=500.0, burst=2), "db": Quota(concurrency=1)})
SPECS = [
    ActionSpec(kind="a", cpus=1),
    ActionSpec(kind="b", cpus=2),
    ActionSpec(kind="e", cpus=1, elastic=Elasticity("cpu", max_units=4, efficiency=Amdahl(0.9)), duration=0.01),
    ActionSpec(kind="g", gpus=1),
    ActionSpec(kind="g2", cpus=1, gpus=2),
    ActionSpec(kind="q", quotas={"api": 1}),
    ActionSpec(kind="q2", quotas={"api": 2, "db": 1}),
    ActionSpec(kind="mix", cpus=1, quotas={"db": 1}, priority=1),
]


class Injected(Exception):
    pass


class _Action:
    def __init__(self, spec: ActionSpec) -> None:
        self.spec = spec
        self.lease: Any = None
        self.finish = asyncio.Event()
        self.fail = False
        self.task: asyncio.Task[str] | None = None


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """Loop time advanced only by the machine (``let_time_pass``), so every example replays exactly:
    timeouts and rate-limit tokens depend on steps, not on how loaded this machine is."""

    def __init__(self) -> None:
        super().__init__()
        self.vt = 0.0

    def time(self) -> float:
        return self.vt


class ApiMachine(RuleBasedStateMachine):
    managers: tuple[type[FakeManager], ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.loop = VirtualTimeLoop()
        self.mgrs = [m() for m in self.managers]
        self.t = Tangram(POOL, managers=self.mgrs)
        self.loop.run_until_complete(self.t.__aenter__())
        self.actions: list[_Action] = []

    # -- helpers -------------------------------------------------------------------------------
    def _run(self, steps: int = 1) -> None:
        """Exactly ``steps`` iterations of the loop, so a rule can land between any two awaits."""
        for _ in range(steps):
            self.loop.call_soon(self.loop.stop)
            self.loop.run_forever()

    async def _body(self, a: _Action, timeout: float | None) -> str:
        async with self.t.acquire(a.spec, timeout=timeout) as lease:
            a.lease = lease
            try:
                await a.finish.wait()
                if a.fail:
                    raise Injected()
            finally:
                a.lease = None
        return "ok"

    def _live(self) -> list[_Action]:
        return [a for a in self.actions if a.task is not None and not a.task.done()]

    def _held(self) -> list[_Action]:
        return [a for a in self.actions if a.lease is not None]

    # -- rules ---------------------------------------------------------------------------------
    @rule(spec=st.sampled_from(SPECS), timeout=st.sampled_from([None, None, 0.0, 0.001, 0.05]))
    def acquire(self, spec: ActionSpec, timeout: float | None) -> None:
        a = _Action(spec)
        a.task = self.loop.create_task(self._body(a, timeout))
        self.actions.append(a)

    @rule(steps=st.integers(1, 4))
    def run_loop(self, steps: int) -> None:
        self._run(steps)

    @rule(dt=st.sampled_from([0.001, 0.003, 0.02]))
    def let_time_pass(self, dt: float) -> None:
        self.loop.vt += dt  # timeouts fire, rate tokens refill
        self._run(3)

    @precondition(lambda self: self._held())
    @rule(data=st.data(), fail=st.booleans())
    def release(self, data: st.DataObject, fail: bool) -> None:
        a = data.draw(st.sampled_from(self._held()))
        a.fail = fail
        a.finish.set()

    @precondition(lambda self: self._live())
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        a = data.draw(st.sampled_from(self._live()))
        assert a.task is not None
        a.task.cancel()

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def accounting(self) -> None:
        t = self.t
        t.scheduler.check_invariants()
        st_ = t.statistics()
        held = self._held()
        live = self._live()
        assert st_["running"] >= len(held)
        assert st_["running"] + st_["queued"] <= len(live), (st_["running"], st_["queued"], len(live))
        assert st_["waiters"] <= len(live)
        used = {c for a in held for c in a.lease.cpus}
        assert len(used) == sum(len(a.lease.cpus) for a in held), "a core is held twice"
        assert st_["cpus_free"] <= 4 - len(used)
        for name, q in st_["quotas"].items():
            assert q["used"] >= sum(a.lease.quotas.get(name, 0) for a in held)

    def teardown(self) -> None:
        try:
            for _ in range(50):  # finish everyone still alive; queued ones get their turn
                for a in self.actions:
                    a.finish.set()
                self.loop.vt += 0.01
                self._run(4)
                if not self._live():
                    break
            assert not self._live(), f"{len(self._live())} actions never finished"
            for a in self.actions:
                assert a.task is not None and a.task.done()
                if not a.task.cancelled() and a.task.exception() is not None:
                    assert isinstance(a.task.exception(), (Injected, TimeoutError)), repr(a.task.exception())
            t = self.t
            t.scheduler.check_invariants()
            s = t.statistics()
            assert s["running"] == 0 and s["queued"] == 0 and s["waiters"] == 0, s
            assert s["cpus_free"] == 4 and s["gpus_free"] == 2, s
            assert all(q["used"] == 0 for q in s["quotas"].values()), s["quotas"]
            assert s["granted"] == s["released"]
            for m in self.mgrs:
                assert not m.holding, f"a manager apply was never released: {m.holding}"
            self.loop.run_until_complete(t.__aexit__(None, None, None))
            self._run(2)
            left = [x for x in asyncio.all_tasks(self.loop) if not x.done()]
            assert not left, left
        finally:
            for x in asyncio.all_tasks(self.loop):
                x.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()


class ApiMachineWithManager(ApiMachine):
    managers = (FakeManager,)  # awaits (yields) inside apply and release, like a Docker call


TestApiMachine = ApiMachine.TestCase
TestApiMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])
TestApiMachineWithManager = ApiMachineWithManager.TestCase
TestApiMachineWithManager.settings = settings(max_examples=100, stateful_step_count=40, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
