"""tangram_sdk.ray without a cluster: lazy import, the clear error when Ray is missing, spec checks."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tangram_sdk import ActionSpec, SpecError, TangramError


def test_importing_the_package_does_not_import_ray() -> None:
    code = "import sys, tangram_sdk, tangram_sdk.ray as r; r.LeaseLostError; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_error_tree() -> None:
    from tangram_sdk.ray import LeaseLostError, NodeLostError, RayNotInstalledError

    assert issubclass(RayNotInstalledError, TangramError) and issubclass(RayNotInstalledError, ImportError)
    assert issubclass(NodeLostError, LeaseLostError) and issubclass(LeaseLostError, TangramError)


async def test_missing_ray_raises_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tangram_sdk.ray import RayNotInstalledError, RemoteTangram, deploy

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(RayNotInstalledError, match=r"pip install 'tangram-sdk\[ray\]'"):
        await RemoteTangram.connect("t")
    with pytest.raises(RayNotInstalledError):
        deploy("t")


def test_acquire_checks_its_arguments_before_any_io() -> None:
    from tangram_sdk.ray import RemoteTangram

    rt = RemoteTangram("t")
    with pytest.raises(SpecError):
        rt.acquire("not a spec")  # type: ignore[arg-type]
    with pytest.raises(SpecError):
        rt.acquire(ActionSpec(kind="x", cpus=1), timeout=-1)
    # built-in exceptions used to escape here (TypeError, OverflowError, unhashable list)
    for bad in ("5", 10**400, float("nan"), True):
        with pytest.raises(SpecError, match="timeout"):
            rt.acquire(ActionSpec(kind="x", cpus=1), timeout=bad)  # type: ignore[arg-type]
    for node in (["a"], 5, ""):
        with pytest.raises(SpecError, match="node"):
            rt.acquire(ActionSpec(kind="x", cpus=1), node=node)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="connect_timeout"):
        RemoteTangram("t", connect_timeout="10")  # type: ignore[arg-type]
    assert "idle" in repr(rt)


def test_wire_frames_split_and_join() -> None:
    from tangram_sdk.ray import _wire

    got: list[object] = []
    proto = _wire.FrameProtocol(lambda p: got.append(__import__("pickle").loads(p)), lambda e: None)
    data = b"".join(_wire.frame(_wire.dumps(("m", i, "x" * i))) for i in range(50))
    for i in range(0, len(data), 7):  # arbitrary TCP segmentation
        proto.data_received(data[i:i + 7])
    assert got == [("m", i, "x" * i) for i in range(50)]
    # a spec with a lambda efficiency model still crosses the wire (cloudpickle fallback)
    pytest.importorskip("ray")
    from tangram_sdk import Elasticity

    spec = ActionSpec(kind="e", cpus=1, elastic=Elasticity("cpu", 4, lambda m: 1.0))
    back = __import__("pickle").loads(_wire.dumps(spec))
    assert back.elastic.efficiency.efficiency(3) == 1.0


async def _granted_remote(spec: ActionSpec, cpus: tuple[int, ...],
                          early: tuple[tuple[int, ...], int] | None = None) -> tuple[Any, Any, int, Any]:
    """A RemoteTangram acquire of ``spec`` granted ``cpus`` (one unit each) by frames fed to its
    link (no socket: what the client sends goes nowhere); ``early``: a resize ``(cpus, units)``
    fed in the same read as the grant, before the acquire resumes. Returns the link, the
    acquire's context manager, the key and the lease."""
    import asyncio
    import pickle

    from tangram_sdk.ray import RemoteTangram
    from tangram_sdk.ray.client import _Link

    rt = RemoteTangram("t")
    link = rt._link = _Link(rt)
    acm = rt.acquire(spec)
    entering = asyncio.create_task(acm.enter())
    while not link.waiters:
        await asyncio.sleep(0)
    (key,) = link.waiters
    fields = {"id": 7, "node": "A", "ray_node_id": "n", "agent": None, "agent_keys": [], "node_aid": 3,
              "cpus": cpus, "gpus": (), "units": len(cpus), "memory": 0, "counted": (), "quotas": (),
              "queued_s": 0.0}
    link._on_frame(pickle.dumps(("grant", key, fields)))
    if early is not None:
        link._on_frame(pickle.dumps(("rsz", key, *early)))
    return link, acm, key, await entering


async def test_client_applies_resize_frames_to_its_lease_even_before_it_is_built_and_never_after() -> None:
    """``("rsz", key, cpus, units)`` from the actor: a resize that lands in the same read as its
    grant (before ``acquire`` has built the lease) is applied once the lease exists; one for a
    held lease updates it as the in-process runtime does (cores, units, resizes, callbacks); one
    after the release, or for a key never granted, changes nothing."""
    import pickle

    from tangram_sdk import Elasticity

    spec = ActionSpec(kind="m", cpus=1, elastic=Elasticity("cpu", 4, malleable=True))
    link, acm, key, lease = await _granted_remote(spec, (2,), early=((0, 1, 2), 3))  # resized before it resumed
    assert lease.cpus == (0, 1, 2) and lease.units == 3 and lease.resizes == 1 and link.early == {}
    seen: list[tuple[tuple[int, ...], int]] = []
    lease.on_resize(lambda ls: seen.append((ls.cpus, ls.units)))
    link._on_frame(pickle.dumps(("rsz", key, (2,), 1, "a field from a newer actor")))
    assert seen == [((2,), 1)] and lease.cpus == (2,) and lease.units == 1 and lease.resizes == 2
    # threads for what it may be grown to: its max_units, as this actor's frame does not say its node
    assert lease.workers == 4 and lease.thread_env()["OMP_NUM_THREADS"] == "4"
    await acm.exit(failed=False)
    link._on_frame(pickle.dumps(("rsz", key, (0, 1, 2, 3), 4)))  # after the release: ignored
    link._on_frame(pickle.dumps(("rsz", 999, (0, 1), 2)))  # never granted: ignored
    assert lease.cpus == (2,) and lease.resizes == 2 and seen == [((2,), 1)] and link.early == {}


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity")
                    or len(__import__("os").sched_getaffinity(0)) < 2, reason="needs Linux affinity and 2 cores")
async def test_a_restart_frame_kills_and_reruns_the_clients_lease_run_command() -> None:
    """A restartable remote lease hears of its restart as an ``rsz`` frame (the actor sends one
    for restartable leases as for malleable ones): the client's ``lease.run`` command in progress
    is killed and run again on the new cores, its argv rebuilt for the new units."""
    import asyncio
    import os
    import pickle
    import tempfile

    from tangram_sdk import Elasticity

    cores = tuple(sorted(os.sched_getaffinity(0)))[:2]
    spec = ActionSpec(kind="pytest", cpus=1, elastic=Elasticity("cpu", 2, restartable=True))
    link, acm, key, lease = await _granted_remote(spec, cores[:1])
    assert lease.restartable and lease.units == 1
    probe = ("import os,sys,time\nu=int(sys.argv[1])\nopen(sys.argv[2]+str(u),'w').close()\n"
             "print(u, sorted(os.sched_getaffinity(0)))\ntime.sleep(60 if u == 1 else 0)")
    with tempfile.TemporaryDirectory() as d:
        marker = os.path.join(d, "run")
        run = asyncio.create_task(lease.run(lambda ls: [sys.executable, "-c", probe, str(ls.units), marker],
                                            timeout=60))
        for _ in range(3000):
            if os.path.exists(marker + "1") or run.done():
                break
            await asyncio.sleep(0.01)
        assert not run.done() and os.path.exists(marker + "1")
        link._on_frame(pickle.dumps(("rsz", key, cores, 2)))
        result = await asyncio.wait_for(asyncio.shield(run), 30)  # the first run would sleep 60 s
    assert result.ok and result.stdout.decode().split(None, 1) == ["2", f"{list(cores)}\n"], result
    assert lease.restarts == 1 and lease.resizes == 1
    await acm.exit(failed=False)


_UNREACHABLE = r'''
import asyncio, os, time
from tangram_sdk.errors import SchedulerBrokenError
from tangram_sdk.ray import RemoteTangram

async def main():
    ticks = 0
    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1
    tk = asyncio.create_task(tick())
    import ray  # noqa: F401  (imported before the clock starts: the import itself is slow)
    t0 = time.monotonic()
    try:
        async with RemoteTangram("nope", connect_timeout=1.0):
            print("CONNECTED")
    except SchedulerBrokenError as exc:
        dt = time.monotonic() - t0
        print(f"OK {dt:.2f} {ticks} {int(dt / 0.01)}", str(exc).splitlines()[0][:100], flush=True)
    tk.cancel()
    os._exit(0)  # ray.init still tries in its thread (~20 s), and asyncio.run would wait for it

asyncio.run(main())
'''


def test_a_remote_tangram_with_no_reachable_cluster_fails_in_its_bound_without_blocking_the_loop() -> None:
    """Stop 37's audit: RemoteTangram ran ray.init on the event loop, outside connect_timeout:
    against an unreachable RAY_ADDRESS the loop stood still for 20 s (every other link's heartbeats
    with it) and then a bare ConnectionError came out. Now: SchedulerBrokenError within the bound."""
    pytest.importorskip("ray")
    env = {**os.environ, "RAY_ADDRESS": "10.255.255.1:6379", "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-c", _UNREACHABLE], env=env, capture_output=True, text=True,
                         timeout=120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith(("OK", "CONNECTED"))), None)
    assert line is not None and line.startswith("OK"), (out.stdout[-2000:], out.stderr[-2000:])
    _ok, dt, ticks, want, *_msg = line.split()
    assert float(dt) < 4.0, line
    assert int(ticks) >= 0.3 * int(want), f"the event loop was blocked: {line}"  # (the init thread holds the GIL at times)


async def test_a_job_table_that_never_answers_keeps_one_look_in_flight_and_warns(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Stop 38: the watch that ends a pool with the Ray job that made it looked at the job table in
    a thread with no bound: a wedged GCS stopped it for good, silently. Now one
    look is in flight at a time, the watch keeps polling it, warns once, and ends when it answers."""
    import asyncio
    import threading

    from tangram_sdk.ray import actor

    monkeypatch.setattr(actor, "_JOB_LOOK_WARN", 0.2)
    gate = threading.Event()
    looks: list[str] = []

    def is_dead(job: str) -> bool:
        looks.append(job)
        if len(looks) == 1:
            gate.wait(10)  # the GCS does not answer until the gate opens
            return False
        return len(looks) >= 3

    watch = asyncio.create_task(actor._wait_job_end("job-1", is_dead, poll=0.05))
    await asyncio.sleep(0.6)
    assert looks == ["job-1"] and not watch.done(), "a second look was stacked on the unanswered one"
    assert "has not answered" in caplog.text and caplog.text.count("has not answered") == 1
    gate.set()  # it answers (alive); the next looks say the job has ended
    await asyncio.wait([watch], timeout=5)
    assert watch.done() and watch.exception() is None
    assert looks == ["job-1"] * 3


async def test_a_cancelled_job_watch_ends_at_once_while_a_look_hangs() -> None:
    import asyncio
    import threading
    import time

    from tangram_sdk.ray import actor

    gate = threading.Event()
    watch = asyncio.create_task(actor._wait_job_end("job-1", lambda job: gate.wait(10), poll=0.05))
    await asyncio.sleep(0.3)
    t0 = time.monotonic()
    watch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watch
    assert time.monotonic() - t0 < 0.5
    gate.set()
