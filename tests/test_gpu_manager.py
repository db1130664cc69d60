"""TorchGpuManager on the CPU path: explicit "devices", memory budgets, hand-made grants and leases."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import anyio
import pytest

torch = pytest.importorskip("torch")

from tangram_sdk.errors import DeviceError, InfeasibleSpecError, ManagerError, SpecError
from tangram_sdk.lease import Lease
from tangram_sdk.managers.base import ManagerContext
from tangram_sdk.managers.gpu import HttpSleepWake, OffloadableService, TorchGpuManager
from tangram_sdk.pool import Pool
from tangram_sdk.runtime import Tangram
from tangram_sdk.scheduler.decisions import Grant
from tangram_sdk.scheduler.events import ServiceResidency
from tangram_sdk.spec import ActionSpec, Elasticity
from torch_models import Scorer  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


PACKED = 8960  # Scorer(d=32) packed: 8192 + 3 * 256 (each tensor aligned to 256 bytes)
FP = 9216  # what one copy is charged: the 8960-byte device buffer in the allocator's 512-byte blocks
X = torch.randn(6, 32, generator=torch.Generator().manual_seed(7))


def manager(budget: Any = None, n: int = 2, **kw: Any) -> TorchGpuManager:
    mgr = TorchGpuManager(devices={i: "cpu" for i in range(n)}, memory_budget=budget, **kw)
    for name, seed in (("a", 1), ("b", 2), ("c", 3)):
        mgr.register(name, module=Scorer(seed))
    return mgr


@pytest.fixture
def events() -> list[Any]:
    return []


async def started(mgr: TorchGpuManager, events: list[Any], n: int = 2) -> TorchGpuManager:
    await mgr.start(ManagerContext(Pool(gpus=n), events.append))
    return mgr


_ids = iter(range(1, 1_000_000))


def lease_for(service: str, gpus: tuple[int, ...], restore: bool = True) -> tuple[Grant, Lease]:
    aid = next(_ids)
    spec = ActionSpec(kind="score", gpus=len(gpus), service=service)
    grant = Grant(aid, gpus=gpus, units=0, restore=restore)
    lease = Lease(aid, spec, cpus=(), gpus=gpus, units=0, memory=0, quotas=(), queued_s=0.0, granted_at=0.0)
    return grant, lease


async def use(mgr: TorchGpuManager, service: str, gpus: tuple[int, ...] = (0,)) -> Any:
    """apply, call, release: one whole action."""
    grant, lease = lease_for(service, gpus)
    await mgr.apply(grant, lease)
    try:
        return await lease.call(X)
    finally:
        await mgr.release(grant, lease)


def resident(mgr: TorchGpuManager, g: int = 0) -> list[str]:
    return mgr.statistics()["devices"][g]["resident"]


def used(mgr: TorchGpuManager, g: int = 0) -> int:
    return mgr.statistics()["devices"][g]["used"]


# -- registration and check --------------------------------------------------------------------
def test_footprint_is_the_allocator_charge_of_the_packed_buffer() -> None:
    mgr = manager()
    assert mgr.footprint("a") == FP
    assert mgr.statistics()["host_bytes"] == 3 * PACKED  # host copies are the exact packed size


def test_factory_called_once_and_factory_error_registers_nothing() -> None:
    calls = []

    def factory() -> torch.nn.Module:
        calls.append(1)
        return Scorer(0)

    mgr = TorchGpuManager(devices={0: "cpu"})
    mgr.register("rm", factory=factory)
    assert calls == [1]

    def broken() -> torch.nn.Module:
        raise RuntimeError("weights not found")

    with pytest.raises(ManagerError, match="'bad'.*weights not found") as ei:
        mgr.register("bad", factory=broken)
    assert isinstance(ei.value.__cause__, RuntimeError)
    assert mgr.statistics()["services"] == ["rm"]
    with pytest.raises(SpecError, match="unknown GPU service 'bad'"):
        mgr.check(ActionSpec(kind="s", gpus=1, service="bad"))
    mgr.register("bad", factory=lambda: Scorer(1))  # the name is free again


def test_register_validation() -> None:
    mgr = TorchGpuManager(devices={0: "cpu"})
    mgr.register("rm", module=Scorer(0))
    with pytest.raises(SpecError, match="already registered"):
        mgr.register("rm", module=Scorer(0))
    with pytest.raises(SpecError, match="exactly one"):
        mgr.register("x", module=Scorer(0), factory=lambda: Scorer(0))
    with pytest.raises(SpecError, match="exactly one"):
        mgr.register("x")
    with pytest.raises(SpecError, match="identifier"):
        mgr.register("bad name!", module=Scorer(0))
    with pytest.raises(SpecError, match="nn.Module"):
        mgr.register("x", factory=lambda: "not a module")
    with pytest.raises(SpecError):
        TorchGpuManager(memory_budget=-1)
    with pytest.raises(SpecError):
        TorchGpuManager(devices={0: ""})


async def test_check_unknown_and_infeasible(events: list[Any]) -> None:
    mgr = await started(manager(budget={0: FP - 1, 1: FP // 2}), events)
    mgr.check(ActionSpec(kind="plain", cpus=1))  # not ours: ignored
    with pytest.raises(SpecError, match="unknown GPU service 'zzz'.*registered: a, b, c"):
        mgr.check(ActionSpec(kind="s", gpus=1, service="zzz"))
    with pytest.raises(InfeasibleSpecError, match=f"'a' needs {FP} bytes.*largest device budget is {FP - 1}"):
        mgr.check(ActionSpec(kind="s", gpus=1, service="a"))
    ok = await started(manager(budget={0: FP, 1: 1}), events)
    ok.check(ActionSpec(kind="s", gpus=1, service="a"))


async def test_start_validates_device_mapping(events: list[Any]) -> None:
    mgr = TorchGpuManager(devices={0: "cpu"})
    with pytest.raises(SpecError, match=r"no entry for pool GPUs \[1\]"):
        await mgr.start(ManagerContext(Pool(gpus=2), events.append))
    default = TorchGpuManager()
    await default.start(ManagerContext(Pool(gpus=1), events.append))
    expect = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert default.statistics()["devices"][0]["device"] == expect
    assert default.statistics()["devices"][0]["budget"] is None or torch.cuda.is_available()


# -- accounting, cache, LRU --------------------------------------------------------------------
async def test_restore_accounts_and_posts_residency(events: list[Any]) -> None:
    mgr = await started(manager(budget=10 * FP), events)
    out = await use(mgr, "a", (1,))
    assert out.shape == (6,)
    assert used(mgr, 1) == FP and used(mgr, 0) == 0
    assert resident(mgr, 1) == ["a"]
    (ev,) = events
    assert isinstance(ev, ServiceResidency)
    assert (ev.service, ev.gpus, ev.resident) == ("a", (1,), True)
    assert ev.restore_s is not None and ev.restore_s > 0
    assert "gpu1 cpu 0.0/0.1MB a" in repr(mgr)


async def test_release_keeps_instance_as_cache(events: list[Any]) -> None:
    mgr = await started(manager(budget=10 * FP), events)
    hook_calls: list[str] = []
    mgr._hook = lambda s, d: hook_calls.append(s)
    await use(mgr, "a")
    await use(mgr, "a")
    grant, lease = lease_for("a", (0,), restore=False)
    await mgr.apply(grant, lease)
    await mgr.release(grant, lease)
    st = mgr.statistics()
    assert hook_calls == ["a"] and st["restores"] == 1 and st["hits"] == 2
    # the second use had grant.restore=True although warm: the scheduler is told it is resident
    assert [e.resident for e in events] == [True, True]
    assert events[1].restore_s is None


async def test_lru_evicts_least_recently_used_idle_first(events: list[Any]) -> None:
    mgr = await started(manager(budget=2 * FP), events)
    await use(mgr, "a")
    await use(mgr, "b")
    await use(mgr, "a")  # a is now more recent than b
    assert resident(mgr) == ["a", "b"]
    await use(mgr, "c")
    assert resident(mgr) == ["a", "c"]
    assert used(mgr) == 2 * FP
    evicted = [e for e in events if not e.resident]
    assert [(e.service, e.gpus) for e in evicted] == [("b", (0,))]
    await use(mgr, "b")  # now a is the LRU one
    assert resident(mgr) == ["b", "c"]
    assert mgr.statistics()["evictions"] == 2


async def test_devices_are_accounted_separately(events: list[Any]) -> None:
    mgr = await started(manager(budget=FP), events)
    await use(mgr, "a", (0,))
    await use(mgr, "b", (1,))
    assert resident(mgr, 0) == ["a"] and resident(mgr, 1) == ["b"]
    assert mgr.statistics()["evictions"] == 0


async def test_in_use_instance_is_never_evicted(events: list[Any]) -> None:
    mgr = await started(manager(budget=FP), events)
    ga, la = lease_for("a", (0,))
    await mgr.apply(ga, la)
    done = anyio.Event()
    gb, lb = lease_for("b", (0,))

    async def apply_b() -> None:
        await mgr.apply(gb, lb)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(apply_b)
        await anyio.sleep(0.2)
        assert not done.is_set()
        assert resident(mgr) == ["a"]
        assert torch.equal(await la.call(X), Scorer(1).eval()(X).detach())  # still usable
        await mgr.release(ga, la)
        with anyio.fail_after(5):
            await done.wait()
    assert resident(mgr) == ["b"] and used(mgr) == FP
    await mgr.release(gb, lb)


async def test_cancelled_while_waiting_for_memory_leaks_nothing(events: list[Any]) -> None:
    mgr = await started(manager(budget=FP), events)
    ga, la = lease_for("a", (0,))
    await mgr.apply(ga, la)
    gb, lb = lease_for("b", (0,))
    with anyio.move_on_after(0.1):
        await mgr.apply(gb, lb)
    inst = next(i for i in mgr.statistics()["instances"] if i["service"] == "b")
    assert inst["refs"] == 0 and inst["state"] == "cold" and inst["bytes"] == {}
    await mgr.release(gb, lb)  # release after a failed apply is a no-op
    await mgr.release(ga, la)
    await use(mgr, "b")
    assert resident(mgr) == ["b"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a device that is not there")
async def test_a_cuda_device_that_is_not_there_is_a_device_error_at_start(events: list[Any]) -> None:
    mgr = TorchGpuManager(devices={0: "cpu", 1: "cuda:0"})
    # no memory_budget: the budget is read from the device at start (a label-only device, as an
    # offloadable server's, is fine with a budget given)
    with pytest.raises(DeviceError, match=r"reading the free memory of cuda:0 \(pool GPU 1\) failed") as ei:
        await mgr.start(ManagerContext(Pool(gpus=2), events.append))
    assert ei.value.resource == "gpu1@cuda:0"


# -- correctness ---------------------------------------------------------------------------------
async def test_outputs_bit_identical_across_evict_restore_cycles(events: list[Any]) -> None:
    refs = {n: Scorer(s).eval()(X).detach() for n, s in (("a", 1), ("b", 2), ("c", 3))}
    mgr = await started(manager(budget=FP), events)
    for _ in range(4):
        for name in ("a", "b", "c"):
            assert torch.equal(await use(mgr, name), refs[name])
    assert mgr.statistics()["evictions"] == 11
    grant, lease = lease_for("c", (0,))
    await mgr.apply(grant, lease)
    assert isinstance(lease.service, torch.nn.Module)
    with torch.inference_mode():
        assert torch.equal(lease.service(X), refs["c"])
    await mgr.release(grant, lease)


async def test_concurrent_restore_of_one_instance_is_done_once(events: list[Any]) -> None:
    calls: list[str] = []

    def slow(service: str, devices: tuple[str, ...]) -> None:
        calls.append(service)
        time.sleep(0.2)

    mgr = await started(manager(budget=FP, restore_hook=slow), events)
    pairs = [lease_for("a", (0,)) for _ in range(4)]
    async with anyio.create_task_group() as tg:
        for g, lease in pairs:
            tg.start_soon(mgr.apply, g, lease)
    assert calls == ["a"]
    st = mgr.statistics()
    assert st["restores"] == 1 and st["hits"] == 3
    assert st["instances"][0]["refs"] == 4 and used(mgr) == FP
    outs = [await lease.call(X) for _, lease in pairs]
    assert all(torch.equal(o, outs[0]) for o in outs)
    for g, lease in pairs:
        await mgr.release(g, lease)
    assert mgr.statistics()["instances"][0]["refs"] == 0


async def test_restores_run_off_the_event_loop(events: list[Any]) -> None:
    mgr = await started(manager(budget=FP, restore_hook=lambda s, d: time.sleep(0.3)), events)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await use(mgr, "a")
        tg.cancel_scope.cancel()
    assert ticks >= 10


async def test_multi_gpu_grant_is_data_parallel_over_shared_copies(events: list[Any]) -> None:
    mgr = await started(manager(budget=4 * FP, n=4), events, n=4)
    one = await use(mgr, "a", (0,))
    two_grant, two = lease_for("a", (0, 1))
    await mgr.apply(two_grant, two)
    assert len(two.attachment("replicas")) == 2 and two.attachment("devices") == ("cpu", "cpu")
    out = await two.call(X)
    assert torch.allclose(out, one, atol=1e-6)
    await mgr.release(two_grant, two)
    assert used(mgr, 0) == FP and used(mgr, 1) == FP  # the 1-GPU copy on GPU 0 serves the 2-GPU grant too
    assert mgr.statistics()["restores"] == 2
    # four GPUs, a batch of 6 rows: 4 chunks
    assert torch.allclose(await use(mgr, "a", (0, 1, 2, 3)), one, atol=1e-6)


# -- failures ------------------------------------------------------------------------------------
async def test_oom_evicts_idle_retries_once_then_device_error(events: list[Any]) -> None:
    attempts: list[str] = []

    def oom(service: str, devices: tuple[str, ...]) -> None:
        if service == "c":
            attempts.append(service)
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    mgr = await started(manager(budget=3 * FP, restore_hook=oom), events)
    await use(mgr, "a", (0,))
    await use(mgr, "b", (0,))
    await use(mgr, "b", (1,))
    grant, lease = lease_for("c", (0,))
    with pytest.raises(DeviceError, match="'c' on cpu failed after evicting idle services and retrying once") as ei:
        await mgr.apply(grant, lease)
    assert ei.value.resource == "c@cpu"
    assert isinstance(ei.value.__cause__, torch.OutOfMemoryError)
    assert attempts == ["c", "c"]
    assert resident(mgr, 0) == [] and used(mgr, 0) == 0  # "evict more" ran before the retry
    assert resident(mgr, 1) == ["b"]  # other devices untouched
    assert mgr.statistics()["failures"] == 1
    await mgr.release(grant, lease)  # the runtime's shielded release after a failed apply: no-op
    assert torch.equal(await use(mgr, "b", (1,)), Scorer(2).eval()(X).detach())  # others unaffected
    assert torch.equal(await use(mgr, "a", (0,)), Scorer(1).eval()(X).detach())


async def test_oom_once_succeeds_on_retry(events: list[Any]) -> None:
    failed = []

    def once(service: str, devices: tuple[str, ...]) -> None:
        if service == "b" and not failed:
            failed.append(1)
            raise torch.OutOfMemoryError("injected")

    mgr = await started(manager(budget=3 * FP, restore_hook=once), events)
    await use(mgr, "a")
    await use(mgr, "b")
    assert resident(mgr) == ["b"] and mgr.statistics()["retries"] == 1


async def test_measured_overflow_counts_as_oom_and_is_learned(events: list[Any]) -> None:
    """A restore whose measured footprint (on CUDA: the memory_allocated delta) overflows the
    budget is undone and retried once after evicting idle instances, reserving the measured size."""
    mgr = await started(manager(budget=2 * FP), events)
    await use(mgr, "b")
    svc = mgr._services["a"]
    real = svc.restore

    async def inflated(inst: Any, hook: Any) -> dict[int, int]:
        measured = await real(inst, hook)
        return {g: 2 * n for g, n in measured.items()}

    svc.restore = inflated  # type: ignore[method-assign]
    assert torch.equal(await use(mgr, "a"), Scorer(1).eval()(X).detach())
    assert resident(mgr) == ["a"] and used(mgr) == 2 * FP
    assert mgr.footprint("a") == 2 * FP
    assert mgr.statistics()["retries"] == 1


async def test_budget_that_cannot_fit_raises_device_error(events: list[Any]) -> None:
    mgr = await started(manager(budget={0: 10 * FP, 1: FP // 2}), events)
    mgr.check(ActionSpec(kind="s", gpus=1, service="a"))  # feasible somewhere
    grant, lease = lease_for("a", (1,))
    with pytest.raises(DeviceError, match=f"'a' needs {FP} bytes but cpu \\(pool GPU 1\\)") as ei:
        await mgr.apply(grant, lease)
    assert ei.value.resource == "a@cpu"
    assert used(mgr, 1) == 0
    await use(mgr, "a", (0,))


async def test_non_oom_failure_is_not_retried(events: list[Any]) -> None:
    calls = []

    def broken(service: str, devices: tuple[str, ...]) -> None:
        calls.append(service)
        raise ValueError("driver exploded")

    mgr = await started(manager(budget=FP, restore_hook=broken), events)
    with pytest.raises(DeviceError, match="driver exploded"):
        await use(mgr, "a")
    assert calls == ["a"]
    assert mgr.statistics()["instances"][0]["state"] == "cold"


async def test_aclose_evicts_everything(events: list[Any]) -> None:
    mgr = await started(manager(budget=10 * FP), events)
    grant, lease = lease_for("a", (0,))
    await mgr.apply(grant, lease)
    service = lease.service
    await mgr.release(grant, lease)
    await use(mgr, "b", (1,))
    await mgr.aclose()
    assert used(mgr, 0) == used(mgr, 1) == 0
    assert all(p.device.type == "meta" for p in service.parameters())
    with pytest.raises(ManagerError, match="no longer held"):
        await lease.call(X)


# -- offloadable services ----------------------------------------------------------------------
class FakeServer:
    def __init__(self, footprint: int) -> None:
        self.footprint = footprint
        self.log: list[tuple[str, tuple[str, ...]]] = []

    async def wake(self, devices: tuple[str, ...]) -> None:
        await anyio.sleep(0.01)
        self.log.append(("wake", devices))

    async def sleep(self) -> None:
        self.log.append(("sleep", ()))

    async def call(self, prompt: str) -> str:
        return prompt.upper()


async def test_offloadable_is_managed_like_a_module(events: list[Any]) -> None:
    srv = FakeServer(FP)
    assert isinstance(srv, OffloadableService)
    mgr = TorchGpuManager(devices={0: "cuda:0", 1: "cuda:1"}, memory_budget=2 * FP)
    mgr.register("llm", offloadable=srv)
    mgr.register("a", module=Scorer(1))
    await started(mgr, events)
    grant, lease = lease_for("llm", (0,))
    await mgr.apply(grant, lease)
    assert lease.service is srv and await lease.call("hi") == "HI"
    await mgr.release(grant, lease)
    # another placement: one server, so the idle awake copy sleeps first
    grant, lease = lease_for("llm", (1,))
    await mgr.apply(grant, lease)
    await mgr.release(grant, lease)
    assert srv.log == [("wake", ("cuda:0",)), ("sleep", ()), ("wake", ("cuda:1",))]
    assert used(mgr, 0) == 0 and used(mgr, 1) == FP
    with pytest.raises(SpecError, match="offloadable"):
        mgr.register("x", offloadable=object())  # type: ignore[arg-type]


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        self.seen.append(self.path)
        reply = b'{"ok": true}' if body else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_server_adapters_live_in_services_and_stay_importable_from_gpu() -> None:
    from tangram_sdk.managers import gpu, services

    assert gpu.HttpSleepWake is services.HttpSleepWake
    assert gpu.OffloadableService is services.OffloadableService


async def test_http_sleep_wake_adapter(http_server: str) -> None:
    _Handler.seen.clear()
    adapter = HttpSleepWake(http_server, footprint=FP, level=2)
    await adapter.wake(("cuda:0",))
    await adapter.sleep()
    assert await adapter.call("/v1/completions", {"prompt": "x"}) == {"ok": True}
    assert _Handler.seen == ["/wake_up", "/sleep?level=2", "/v1/completions"]
    with pytest.raises(SpecError):
        HttpSleepWake("file:///etc/passwd", footprint=1)
    dead = HttpSleepWake("http://127.0.0.1:9", footprint=1, timeout=2)
    with pytest.raises(DeviceError, match="wake_up"):
        await dead.wake(("cuda:0",))


@pytest.fixture
def trickling_server() -> Iterator[str]:
    """Answers every request one byte each 0.2 s (~3 s for the reply): no single read waits long."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = sock.accept()
            except OSError:
                return

            def reply(c: socket.socket = c) -> None:
                with c:
                    c.recv(65536)
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n")
                    for _ in range(14):
                        if stop.wait(0.2):
                            return
                        c.sendall(b" ")
                    c.sendall(b"{}")

            threading.Thread(target=reply, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    sock.close()


async def test_http_sleep_wake_bounds_the_whole_request(trickling_server: str) -> None:
    """Stop 37's audit: urllib's timeout bounds each socket read, so a server trickling its reply
    kept wake() going far past timeout=1 (13.5 s measured), and the action's cancel with it."""
    adapter = HttpSleepWake(trickling_server, footprint=1, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(DeviceError, match="did not answer within 0.5 s") as ei:
        await adapter.wake(("cuda:0",))
    assert time.monotonic() - t0 < 1.5
    assert ei.value.resource == trickling_server


@pytest.mark.parametrize("bad", [{"timeout": "5"}, {"timeout": -1}, {"timeout": float("nan")},
                                 {"level": "1"}, {"level": -1}, {"footprint": -1}, {"footprint": 1.5}])
def test_http_sleep_wake_checks_its_arguments_where_they_are_written(bad: dict[str, Any]) -> None:
    kw: dict[str, Any] = {"footprint": 1, **bad}
    with pytest.raises(SpecError, match=next(iter(bad))):
        HttpSleepWake("http://127.0.0.1:9", **kw)


# -- end to end ----------------------------------------------------------------------------------
async def test_end_to_end_through_tangram() -> None:
    tangram_mod = pytest.importorskip("tangram_sdk")
    Tangram = getattr(tangram_mod, "Tangram", None)
    if Tangram is None:
        pytest.skip("tangram_sdk.Tangram (runtime.py) is not available yet")
    gpu = TorchGpuManager(devices={i: "cpu" for i in range(4)}, memory_budget=2 * FP)
    for name, seed in (("a", 1), ("b", 2), ("c", 3)):
        gpu.register(name, module=Scorer(seed))
    refs = {n: Scorer(s).eval()(X).detach() for n, s in (("a", 1), ("b", 2), ("c", 3))}
    el = Elasticity("gpu", max_units=2, efficiency={1: 1.0, 2: 0.9})
    results: dict[str, list[Any]] = {n: [] for n in refs}

    async def action(name: str) -> None:
        spec = ActionSpec(kind="score", gpus=1, service=name, elastic=el, duration=0.01)
        async with tangram.acquire(spec) as lease:
            results[name].append(await lease.call(X))

    with anyio.fail_after(60):
        async with Tangram(Pool(gpus=4), managers=[gpu]) as tangram:
            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(action, "abc"[i % 3])
            with pytest.raises(SpecError):
                async with tangram.acquire(ActionSpec(kind="s", gpus=1, service="nope")):
                    pass
    for name, outs in results.items():
        assert len(outs) == 4
        assert all(torch.allclose(o, refs[name], atol=1e-6) for o in outs)


async def test_end_to_end_device_error_returns_the_gpus() -> None:
    tangram_mod = pytest.importorskip("tangram_sdk")
    Tangram = getattr(tangram_mod, "Tangram", None)
    if Tangram is None:
        pytest.skip("tangram_sdk.Tangram (runtime.py) is not available yet")

    def oom(service: str, devices: tuple[str, ...]) -> None:
        if service == "c":
            raise torch.OutOfMemoryError("injected")

    gpu = TorchGpuManager(devices={0: "cpu"}, memory_budget=2 * FP, restore_hook=oom)
    for name, seed in (("a", 1), ("c", 3)):
        gpu.register(name, module=Scorer(seed))
    with anyio.fail_after(30):
        async with Tangram(Pool(gpus=1), managers=[gpu]) as tangram:
            for _ in range(2):  # the single GPU comes back after each failure
                with pytest.raises(DeviceError, match="'c'"):
                    async with tangram.acquire(ActionSpec(kind="score", gpus=1, service="c")):
                        pass
                async with tangram.acquire(ActionSpec(kind="score", gpus=1, service="a")) as lease:
                    assert torch.equal(await lease.call(X), Scorer(1).eval()(X).detach())
            with pytest.raises(InfeasibleSpecError):
                gpu.register("huge", module=torch.nn.Linear(100, 100))
                async with tangram.acquire(ActionSpec(kind="score", gpus=1, service="huge")):
                    pass


@pytest.mark.cuda
@cuda
async def test_cuda_restore_evict_cycle(events: list[Any]) -> None:
    mgr = TorchGpuManager(memory_budget={0: 2 * 1024 * FP})
    mgr.register("a", module=Scorer(1))
    mgr.register("b", module=Scorer(2))
    await mgr.start(ManagerContext(Pool(gpus=1), events.append))
    outs = [await use(mgr, n) for n in ("a", "b", "a", "b")]
    assert outs[0].device.type == "cuda"
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
    st = mgr.statistics()
    assert st["devices"][0]["device"] == "cuda:0" and st["devices"][0]["used"] == 2 * FP
    assert [i["bytes"] for i in st["instances"]] == [{0: FP}, {0: FP}]  # charged from the restored storage
    await mgr.aclose()
    assert mgr.statistics()["devices"][0]["used"] == 0


@pytest.mark.cuda
@cuda
async def test_cuda_oom_evicts_idle_copies_of_every_pool_gpu_on_that_device(events: list[Any]) -> None:
    # two pool GPUs on one card (the documented way to run two services side by side): an OOM on
    # pool GPU 0 frees the idle copy that sits on the same card through pool GPU 1 before retrying
    def oom(service: str, devices: tuple[str, ...]) -> None:
        if service == "c" and oom.armed:
            oom.armed = False
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    oom.armed = True  # type: ignore[attr-defined]
    mgr = TorchGpuManager(devices={0: "cuda:0", 1: "cuda:0"}, memory_budget=4 * FP, restore_hook=oom)
    for name, seed in (("a", 1), ("b", 2), ("c", 3)):
        mgr.register(name, module=Scorer(seed))
    await mgr.start(ManagerContext(Pool(gpus=2), events.append))
    await use(mgr, "b", (1,))
    assert resident(mgr, 1) == ["b"]
    await use(mgr, "c", (0,))  # the first try OOMs, the retry follows the eviction of b
    assert resident(mgr, 1) == [] and resident(mgr, 0) == ["c"]
    await mgr.aclose()


async def test_statistics_is_a_typed_snapshot(events: list[Any]) -> None:
    import json

    mgr = await started(manager(), events)
    await use(mgr, "a")
    st = mgr.statistics()
    assert st.devices[0].resident == st["devices"][0]["resident"] == ["a"] and st.restores == 1
    assert st.instances[0].service == "a" and st.services == st["services"]
    assert json.loads(json.dumps(st.asdict()))["devices"]["0"]["used"] == st.devices[0].used > 0
    await mgr.aclose()


class StuckServer:
    """A server whose wake (or sleep) does not answer until ``go`` is set: a driver or a server
    that hangs mid-transfer."""

    footprint = FP

    def __init__(self, hang_wake: bool = True, hang_sleep: bool = False) -> None:
        self.go = asyncio.Event()
        self.hang_wake, self.hang_sleep = hang_wake, hang_sleep
        self.log: list[str] = []

    async def wake(self, devices: tuple[str, ...]) -> None:
        self.log.append("wake")
        if self.hang_wake:
            await self.go.wait()

    async def sleep(self) -> None:
        self.log.append("sleep")
        if self.hang_sleep:
            await self.go.wait()


async def test_a_restore_that_hangs_fails_at_its_bound_and_its_gpu_waits_out_of_the_pool() -> None:
    """Stop 37's audit: a restore had no deadline (a wake that never answered held the action, its
    GPU and its cancel for good; acquire(timeout=) bounds only the queue). Now it fails with a
    DeviceError naming the service after transfer_timeout; the GPU stays quarantined (a copy
    landing later would sit beside the next one) until the work ends and is undone, then comes back."""
    srv = StuckServer()
    mgr = TorchGpuManager(devices={0: "cpu"}, transfer_timeout=0.5)
    mgr.register("llm", offloadable=srv)
    spec = ActionSpec(kind="judge", gpus=1, service="llm")
    async with Tangram(Pool(gpus=1), managers=[mgr]) as t:
        t0 = time.monotonic()
        with pytest.raises(DeviceError, match="transfer_timeout") as ei:
            async with t.acquire(spec):
                pytest.fail("ran on a copy that never woke")
        assert time.monotonic() - t0 < 3.0
        assert ei.value.resource == "llm@cpu"
        st = t.statistics()
        assert st["quarantined"] == 1 and st["gpus_free"] == 0, st
        assert mgr.statistics().stuck == 1
        with pytest.raises(TimeoutError):  # not granted to anyone while the wake may still land
            async with t.acquire(spec, timeout=0.3):
                pass
        srv.go.set()  # the wake ends at last: undone (slept), the GPU comes back
        srv.hang_wake = False
        async with t.acquire(spec, timeout=5.0) as lease:
            assert lease.service is srv
        assert srv.log == ["wake", "sleep", "wake"]
        assert t.statistics()["quarantined"] == 0


async def test_a_cancel_during_a_hung_restore_propagates_within_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    from tangram_sdk.managers import gpu as gpu_mod

    monkeypatch.setattr(gpu_mod, "_CANCEL_GRACE_S", 0.5)  # the bound (10 s) is far longer
    srv = StuckServer()
    mgr = TorchGpuManager(devices={0: "cpu"}, transfer_timeout=10.0)
    mgr.register("llm", offloadable=srv)
    spec = ActionSpec(kind="judge", gpus=1, service="llm")
    async with Tangram(Pool(gpus=1), managers=[mgr]) as t:
        async def act() -> None:
            async with t.acquire(spec):
                pytest.fail("ran on a copy that never woke")

        task = asyncio.create_task(act())
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - t0 < 3.0, "the cancel waited for the hung wake, not the grace"
        assert t.statistics()["quarantined"] == 1
        srv.go.set()
        srv.hang_wake = False
        async with t.acquire(spec, timeout=5.0):
            pass


async def test_an_evict_that_hangs_fails_the_action_that_needed_the_room() -> None:
    srv = StuckServer(hang_wake=False, hang_sleep=True)
    mgr = TorchGpuManager(devices={0: "cpu"}, memory_budget=FP, transfer_timeout=0.5)
    mgr.register("llm", offloadable=srv)
    mgr.register("a", module=Scorer(1))
    async with Tangram(Pool(gpus=1), managers=[mgr]) as t:
        async with t.acquire(ActionSpec(kind="judge", gpus=1, service="llm")):
            pass  # llm stays resident (idle) and fills the budget
        with pytest.raises(DeviceError, match="evicting service 'llm'"):
            async with t.acquire(ActionSpec(kind="score", gpus=1, service="a")):
                pytest.fail("ran beside a copy that was never evicted")
        assert t.statistics()["quarantined"] == 1
        srv.go.set()
        async with t.acquire(ActionSpec(kind="score", gpus=1, service="a"), timeout=5.0):
            pass
        assert t.statistics()["quarantined"] == 0


class OomOnce(Scorer):
    """A scorer whose first forward runs out of device memory (the retry after eviction works)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.ooms = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ooms:
            self.ooms -= 1
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return super().forward(x)


async def test_an_evict_that_hangs_in_a_calls_oom_retry_keeps_the_gpu_out_of_the_pool() -> None:
    """Stop 38: lease.call's out-of-memory retry evicts the idle copies on its GPU; an evict there
    that outran transfer_timeout failed the call, but the action's release gave the GPU back while
    the evict still ran (the next grant would have restored beside a half-evicted copy). Now the
    release quarantines it until the evict ends, as apply's own evictions do."""
    srv = StuckServer(hang_wake=False, hang_sleep=True)
    mgr = TorchGpuManager(devices={0: "cpu"}, memory_budget=2 * FP, transfer_timeout=0.5)
    mgr.register("llm", offloadable=srv)
    mgr.register("a", module=OomOnce(1))
    async with Tangram(Pool(gpus=1), managers=[mgr]) as t:
        async with t.acquire(ActionSpec(kind="judge", gpus=1, service="llm")):
            pass  # llm stays resident (idle) beside a
        with pytest.raises(DeviceError, match="evicting service 'llm'"):
            async with t.acquire(ActionSpec(kind="score", gpus=1, service="a")) as lease:
                await lease.call(X)
        assert t.statistics()["quarantined"] == 1
        with pytest.raises(TimeoutError):  # not granted while the evict may still land
            async with t.acquire(ActionSpec(kind="score", gpus=1, service="a"), timeout=0.3):
                pass
        srv.go.set()  # the sleep ends: llm is cold, the GPU comes back
        async with t.acquire(ActionSpec(kind="score", gpus=1, service="a"), timeout=5.0) as lease:
            assert torch.equal(await lease.call(X), Scorer(1).eval()(X).detach())
        assert t.statistics()["quarantined"] == 0
        assert [i["state"] for i in mgr.statistics()["instances"] if i["service"] == "llm"] == ["cold"]


def test_transfer_timeout_is_checked() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), "5", True):
        with pytest.raises(SpecError, match="transfer_timeout"):
            TorchGpuManager(devices={0: "cpu"}, transfer_timeout=bad)  # type: ignore[arg-type]


async def test_aclose_with_an_evict_that_hangs_ends_at_the_bound() -> None:
    """The review of stop 37: aclose() evicted every resident copy without a bound, so a server
    whose sleep hung kept Tangram.aclose() waiting for good. Now it ends at transfer_timeout and
    the copy stays stuck (a later start() refuses) until the evict ends."""
    srv = StuckServer(hang_wake=False, hang_sleep=True)
    mgr = TorchGpuManager(devices={0: "cpu"}, transfer_timeout=0.5)
    mgr.register("llm", offloadable=srv)
    t = Tangram(Pool(gpus=1), managers=[mgr])
    async with t:
        async with t.acquire(ActionSpec(kind="judge", gpus=1, service="llm")):
            pass
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 3.0
    assert [i["state"] for i in mgr.statistics()["instances"]] == ["stuck"]
    with pytest.raises(ManagerError, match="still resident"):
        await mgr.start(ManagerContext(Pool(gpus=1), lambda e: None))
    srv.go.set()  # the sleep ends: undone, cold again
    for _ in range(100):
        if [i["state"] for i in mgr.statistics()["instances"]] == ["cold"]:
            break
        await asyncio.sleep(0.02)
    assert [i["state"] for i in mgr.statistics()["instances"]] == ["cold"]
