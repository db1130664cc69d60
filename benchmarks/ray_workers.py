"""Throughput of one job-wide pool across worker processes, through the adapters, vs the simple
alternatives, in the same run.

    python benchmarks/ray_workers.py                  # starts a small local Ray cluster
    python benchmarks/ray_workers.py --procs 8 --concurrency 256 --seconds 5 --cpus 256

Each of ``--procs`` worker processes is a Ray driver (as a veRL AgentLoopWorker or an OpenRLHF
rollout actor is a Ray process) running ``--concurrency`` coroutines that loop on
``async with Guard(ActionSpec(cpus=1), runtime={"pool": {"name": "bench-job", "cpus": N}})``:
the adapters' path, pool named in config, resolved per entry. The first worker to need the pool
deploys the scheduler actor, the rest attach. An action holds its core ``--hold`` seconds (0: an
acquire+release back to back, the scheduling cost itself). Rows, all in this run:

* **job-wide pool, adapters** -- the path above (correct: at most N cores held in the whole job);
* **job-wide pool, RemoteTangram directly** -- the same actor without the adapter layer;
* **per-process Tangram** -- the same config with ``scope: process``: one scheduler per process,
  what every worker got before pools had names (fast, but the job may hold procs x N cores; the
  peak column says what each process held at once);
* **static split, asyncio.Semaphore(N / procs)** -- what a user writes instead: never over-grants,
  never lends an idle worker's cores to a busy one.

Acquire latency is measured per acquire (call to grant, queueing included), p50/p99 over all
workers; with procs x concurrency > N cores most of it is queueing for a core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

NS = "tangram-bench-workers"
POOL = "bench-job"


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ---------------------------------------------------------------------------------- worker side
async def _work(mode: str, cpus: int, procs: int, concurrency: int, seconds: float, hold: float) -> dict[str, Any]:
    from tangram_sdk import ActionSpec
    from tangram_sdk.integrations import Guard, resolve_runtime, shutdown

    spec = ActionSpec(kind="bench", cpus=1)
    if mode == "semaphore":
        sem = asyncio.Semaphore(max(1, cpus // procs))

        class _Sem:
            async def __aenter__(self) -> None:
                await sem.acquire()

            async def __aexit__(self, *exc: object) -> None:
                sem.release()

        enter: Any = _Sem
    elif mode == "direct":
        tg = await resolve_runtime({"pool": {"name": POOL, "cpus": cpus}})  # deploys or attaches
        def enter() -> Any:
            return tg.acquire(spec)
    else:
        scope = "process" if mode == "local" else "job"
        guard = Guard(spec, runtime={"pool": {"name": POOL, "cpus": cpus, "scope": scope}})
        def enter() -> Any:
            return guard

    held = peak = 0
    lat: list[float] = []
    perf = time.perf_counter

    async def one() -> None:
        nonlocal held, peak
        t = perf()
        async with enter():
            lat.append(perf() - t)
            held += 1
            peak = max(peak, held)
            await asyncio.sleep(hold)  # an action always awaits something (0: one loop iteration)
            held -= 1

    for _ in range(50):  # warm up: connect, deploy or attach
        await one()
    print("READY", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    lat.clear()
    peak = 0
    stop = perf() + seconds
    count = 0

    async def loop() -> None:
        nonlocal count
        while perf() < stop:
            await one()
            count += 1

    t0 = perf()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    wall = perf() - t0
    await shutdown()
    step = max(1, len(lat) // 20000)  # a sample is enough for the percentiles
    return {"count": count, "wall": wall, "lat": lat[::step], "peak": peak}


def _worker(args: list[str]) -> None:
    import ray

    mode, cpus, procs, conc, seconds, hold = args
    if mode != "semaphore" and mode != "local":
        ray.init(address=os.environ["RAY_ADDRESS"], namespace=NS, log_to_driver=False)
    out = asyncio.run(_work(mode, int(cpus), int(procs), int(conc), float(seconds), float(hold)))
    print("DONE " + json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------- driver side
def _run(address: str, mode: str, a: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, RAY_ADDRESS=address)
    mode, _, conc = mode.partition("@")  # "guard@1": the same path at that concurrency (light load)
    cmd = [sys.executable, __file__, "--worker", mode, str(a.cpus), str(a.procs), conc or str(a.concurrency),
           str(a.seconds), str(a.hold)]
    ps = [subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
          for _ in range(a.procs)]
    for p in ps:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "READY":
            raise RuntimeError(f"{mode} worker failed to start: {line!r}")
    for p in ps:
        assert p.stdin is not None
        p.stdin.write("GO\n")
        p.stdin.flush()
    results = []
    for p in ps:
        out, _ = p.communicate(timeout=a.seconds + 120)
        (line,) = [x for x in out.splitlines() if x.startswith("DONE ")]
        results.append(json.loads(line[5:]))
    count = sum(r["count"] for r in results)
    wall = max(r["wall"] for r in results)
    lat = [x for r in results for x in r["lat"]]
    return {"rate": count / wall, "p50": _pct(lat, 0.5), "p99": _pct(lat, 0.99), "count": count,
            "peak": max(r["peak"] for r in results)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default=None, help="Ray address (default: start a small local cluster)")
    ap.add_argument("--procs", type=int, default=8, help="worker processes")
    ap.add_argument("--concurrency", type=int, default=256, help="concurrent actions per worker")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--cpus", type=int, default=256, help="cores in the job-wide pool")
    ap.add_argument("--hold", type=float, default=0.0, help="seconds each action holds its core")
    ap.add_argument("--modes", default="guard,direct,local,semaphore,guard@1",
                    help="rows to run; MODE@N runs MODE with N coroutines per worker")
    ap.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        _worker(a.worker)
        return

    import ray

    from tangram_sdk.ray import TangramCluster

    if a.address:
        ctx = ray.init(address=a.address, namespace=NS, log_to_driver=False)
    else:
        ctx = ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024,
                       namespace=NS, log_to_driver=False)
    address = ctx.address_info["gcs_address"]
    rows: dict[str, dict[str, Any]] = {}
    actor: dict[str, Any] = {}
    try:
        for mode in a.modes.split(","):
            rows[mode] = _run(address, mode, a)
            if mode.split("@")[0] in ("guard", "direct"):
                cl = TangramCluster.get(POOL, namespace=NS)
                s = cl.statistics()
                (node,) = s["nodes"].values()
                actor[mode] = {"peak": node["peak_cpus_used"], "errors": cl.check_invariants(),
                               "granted": s["granted"], "released": s["released"]}
                cl.shutdown()
    finally:
        ray.shutdown()

    labels = {
        "guard": "job-wide pool, adapters (Guard by name)",
        "direct": "job-wide pool, RemoteTangram directly",
        "local": "per-process Tangram (scope: process)",
        "semaphore": f"static split, asyncio.Semaphore({max(1, a.cpus // a.procs)})/process",
    }
    print(f"\n{a.procs} worker processes x {a.concurrency} concurrent actions, ActionSpec(cpus=1) held {a.hold:g} s, "
          f"pool of {a.cpus} cores, {os.cpu_count()} host cores, Python {sys.version.split()[0]}, "
          f"ray {ray.__version__}, {a.seconds:g} s per row")
    print(f"{'path':<50}{'actions/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'peak held':>18}")
    print("-" * 97)
    for mode, r in rows.items():
        base, _, conc = mode.partition("@")
        label = labels[base] + (f", {conc} coroutine(s)" if conc else "")
        if mode in actor:
            peak = f"{actor[mode]['peak']} of {a.cpus} (job)"
        elif mode == "local":
            peak = f"{r['peak']}/process x {a.procs}"
        else:
            peak = f"{r['peak']}/process"
        print(f"{label:<50}{r['rate']:>11.0f}{r['p50'] * 1e3:>9.2f}{r['p99'] * 1e3:>9.2f}{peak:>18}")
    for mode, info in actor.items():
        print(f"{mode}: actor granted={info['granted']} released={info['released']} "
              f"invariant errors={info['errors'] or 'none'}")


if __name__ == "__main__":
    main()
