"""Remote acquire+release through the shared Ray Tangram vs the in-process runtime, same run.

    python benchmarks/ray_acquire.py                  # starts a small local Ray cluster
    python benchmarks/ray_acquire.py --address auto   # an existing cluster

Latency: one coroutine doing ``async with acquire(ActionSpec(cpus=1)): pass`` back to back (the
pool is large enough that nothing queues: this is the protocol + scheduler cost).
Throughput: ``--procs`` client processes (each its own Ray driver and connection) with
``--concurrency`` coroutines each, for ``--seconds``; the in-process row uses one process with
procs x concurrency coroutines. On a 2-core machine the 8 clients, the scheduler actor and Ray's own
daemons share two cores, so the throughput row measures contention as much as the protocol.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from tangram_sdk import ActionSpec, Pool, Tangram

NS = "tangram-bench"
SPEC = ActionSpec(kind="bench", cpus=1)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _latency(tg: Any, n: int, warmup: int = 200) -> list[float]:
    for _ in range(warmup):
        async with tg.acquire(SPEC):
            pass
    out = []
    perf = time.perf_counter
    for _ in range(n):
        t = perf()
        async with tg.acquire(SPEC):
            pass
        out.append(perf() - t)
    return out


async def _throughput(tg: Any, concurrency: int, seconds: float) -> int:
    stop = time.perf_counter() + seconds
    count = 0

    async def loop() -> None:
        nonlocal count
        while time.perf_counter() < stop:
            async with tg.acquire(SPEC):
                pass
            count += 1

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return count


async def _in_process(cpus: int, n: int, concurrency: int, seconds: float) -> tuple[list[float], float]:
    async with Tangram(Pool(cpus=cpus)) as tg:
        lat = await _latency(tg, n)
        done = await _throughput(tg, concurrency, seconds)
    return lat, done / seconds


def _worker(name: str, concurrency: int, seconds: float) -> None:
    import ray

    from tangram_sdk.ray import RemoteTangram

    ray.init(address=os.environ["RAY_ADDRESS"], namespace=NS, log_to_driver=False)

    async def main() -> None:
        async with RemoteTangram(name, namespace=NS) as tg:
            await _latency(tg, 0, warmup=50)
            print("READY", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            t = time.perf_counter()
            done = await _throughput(tg, concurrency, seconds)
            print(f"DONE {done} {time.perf_counter() - t}", flush=True)

    asyncio.run(main())


def _remote_throughput(address: str, name: str, procs: int, concurrency: int, seconds: float) -> float:
    env = dict(os.environ, RAY_ADDRESS=address)
    ps = [subprocess.Popen([sys.executable, __file__, "--worker", name, str(concurrency), str(seconds)],
                           env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    for p in ps:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "READY":
            raise RuntimeError(f"worker failed to start: {line!r}")
    for p in ps:
        assert p.stdin is not None
        p.stdin.write("GO\n")
        p.stdin.flush()
    total = 0
    for p in ps:
        out, _ = p.communicate(timeout=seconds + 120)
        (line,) = [x for x in out.splitlines() if x.startswith("DONE")]
        total += int(line.split()[1])
    return total / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default=None, help="Ray address (default: start a small local cluster)")
    ap.add_argument("-n", type=int, default=3000, help="sequential acquire+release pairs for latency")
    ap.add_argument("--procs", type=int, default=8, help="client processes for the throughput row")
    ap.add_argument("--concurrency", type=int, default=8, help="coroutines per client process")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--cpus", type=int, default=256, help="cores in the benchmark pool (large: no queueing)")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        _worker(a.worker[0], int(a.worker[1]), float(a.worker[2]))
        return

    import ray

    from tangram_sdk.ray import RemoteTangram, deploy

    if a.address:
        ctx = ray.init(address=a.address, namespace=NS, log_to_driver=False)
    else:
        ctx = ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024,
                       namespace=NS, log_to_driver=False)
    address = ctx.address_info["gcs_address"]
    conc = a.procs * a.concurrency
    local_lat, local_tput = asyncio.run(_in_process(a.cpus, a.n, conc, a.seconds))

    cl = deploy("bench", namespace=NS, pool=Pool(cpus=a.cpus))
    try:
        async def remote() -> tuple[list[float], float]:
            async with RemoteTangram("bench", namespace=NS) as tg:
                lat = await _latency(tg, a.n)
                done = await _throughput(tg, conc, a.seconds)
            return lat, done / a.seconds

        remote_lat, remote_tput1 = asyncio.run(remote())
        remote_tput = _remote_throughput(address, "bench", a.procs, a.concurrency, a.seconds)
        s = cl.statistics()
        errs = cl.check_invariants()
    finally:
        cl.shutdown()
        ray.shutdown()

    ms = 1e3
    print(f"\nacquire+release, ActionSpec(cpus=1), pool of {a.cpus} cores, {os.cpu_count()} host cores, "
          f"Python {sys.version.split()[0]}, ray {ray.__version__}")
    print(f"{'path':<44}{'median ms':>10}{'p99 ms':>10}{'mean ms':>10}{'ops/s':>12}")
    print("-" * 86)
    print(f"{'in-process Tangram (1 coroutine)':<44}{_pct(local_lat, .5) * ms:>10.3f}{_pct(local_lat, .99) * ms:>10.3f}"
          f"{statistics.fmean(local_lat) * ms:>10.3f}{1 / statistics.fmean(local_lat):>12.0f}")
    print(f"{'remote RemoteTangram (1 coroutine)':<44}{_pct(remote_lat, .5) * ms:>10.3f}"
          f"{_pct(remote_lat, .99) * ms:>10.3f}{statistics.fmean(remote_lat) * ms:>10.3f}"
          f"{1 / statistics.fmean(remote_lat):>12.0f}")
    print(f"{f'in-process, 1 process x {conc} coroutines':<44}{'':>10}{'':>10}{'':>10}{local_tput:>12.0f}")
    print(f"{f'remote, 1 process x {conc} coroutines':<44}{'':>10}{'':>10}{'':>10}{remote_tput1:>12.0f}")
    print(f"{f'remote, {a.procs} processes x {a.concurrency} coroutines':<44}{'':>10}{'':>10}{'':>10}"
          f"{remote_tput:>12.0f}")
    print(f"\nactor: granted={s['granted']} released={s['released']} peak cores used="
          f"{max(n['peak_cpus_used'] for n in s['nodes'].values())} invariant errors={errs or 'none'}")


if __name__ == "__main__":
    main()
