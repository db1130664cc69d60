"""Fixed-worker runners made malleable by ``lease.workers``, live on this machine's cores.

A malleable lease is grown into idle cores while it runs; work whose worker count was fixed at
the grant (``make -j {units}``, ``pytest -n {units}``) cannot use them, work that started
``lease.workers`` workers (the most cores it may be grown to) can. Two tables, each against the
simple alternative measured in the same run:

1. **A straggler** admitted on 1 core while another action holds the rest; that action leaves
   ``--leave`` seconds later. Wall time of the same work (a command starting N busy worker
   processes that share a fixed number of loop iterations) for: a fixed DoP of 1; a malleable
   lease with N = ``lease.units`` (grown, but one worker); N = ``lease.workers``; and a fixed DoP
   of all cores (waits for them, then runs). One table per ``--leave``: which fixed DoP is best
   depends on it, which nobody knows when the action starts.
2. **What oversubscription costs** when no grow comes: the same total work with N workers on one
   core, against N = 1, wall and CPU seconds (each worker here is a Python process: its start-up
   is part of the cost, as a test runner's worker start-up would be). Rows run interleaved.

    python benchmarks/malleable_workers.py [--work 1.5] [--leave 0.2 1.0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

from tangram_sdk import ActionSpec, Pool, Tangram
from tangram_sdk.spec import Elasticity

_WORKERS = """
import subprocess, sys
n, iters = int(sys.argv[1]), int(sys.argv[2])
ps = [subprocess.Popen([sys.executable, "-c", f"for _ in range({iters // n}): pass"]) for _ in range(n)]
sys.exit(max(p.wait() for p in ps))
"""


def _calibrate() -> float:
    """Loop iterations per second of one worker process as the command runs it (best of three)."""
    import subprocess

    n, best = 10_000_000, 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"for _ in range({n}): pass"], check=True)
        best = max(best, n / (time.perf_counter() - t0))
    return best


async def _straggler(cores: tuple[int, ...], mode: str, iters: int, leave: float, tag: int) -> float:
    """Wall seconds from the straggler's admission to its end (for "dop-all": from the same
    moment, waiting for every core first)."""
    malleable = mode in ("units", "workers")
    el = Elasticity("cpu", max_units=len(cores), malleable=malleable) if mode != "dop-all" else None
    spec = (ActionSpec(kind=f"suite-{mode}-{tag}", cpus=1, duration=0.05, elastic=el) if el is not None
            else ActionSpec(kind=f"suite-{mode}-{tag}", cpus=len(cores)))
    async with Tangram(Pool(cpus=list(cores))) as t:
        blocker = await t.acquire_lease(ActionSpec(kind="other", cpus=len(cores) - 1))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        loop.call_later(leave, lambda: asyncio.ensure_future(t.release(blocker)))
        async with t.acquire(spec) as lease:
            n = 1 if mode == "dop1" else len(lease.cpus) if mode == "dop-all" else getattr(lease, mode)
            r = await lease.run([sys.executable, "-c", _WORKERS, str(n), str(iters)], timeout=600)
            if not r.ok:
                raise RuntimeError(r.stderr.decode())
        return loop.time() - t0


async def _oversubscribed(core: int, n: int, iters: int) -> tuple[float, float]:
    """Wall and CPU seconds of the command with ``n`` workers on one core."""
    async with Tangram(Pool(cpus=[core])) as t, t.acquire(ActionSpec(kind="one", cpus=1)) as lease:
        t0 = time.perf_counter()
        r = await lease.run([sys.executable, "-c", _WORKERS, str(n), str(iters)], timeout=600)
        if not r.ok:
            raise RuntimeError(r.stderr.decode())
        return time.perf_counter() - t0, r.cpu_s if r.cpu_s is not None else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=float, default=1.5, help="single-core seconds of the straggler's work")
    ap.add_argument("--leave", type=float, nargs="+", default=[0.2, 1.0],
                    help="seconds until the other action leaves (one table each)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each row (the median is shown)")
    args = ap.parse_args(argv)
    cores = tuple(sorted(os.sched_getaffinity(0)))
    if len(cores) < 2:
        print("needs 2 cores or more")
        return 2
    iters = int(_calibrate() * args.work)
    print(f"{len(cores)} cores; work {args.work:.1f} single-core s ({iters} iterations); median of {args.repeat}")

    rows = [("dop1", "fixed DoP 1 (-n 1)"), ("units", "malleable, N = lease.units"),
            ("workers", "malleable, N = lease.workers"), ("dop-all", f"fixed DoP {len(cores)} (waits)")]
    for leave in args.leave:
        runs: dict[str, list[float]] = {mode: [] for mode, _ in rows}
        for i in range(args.repeat):  # interleaved, so a slow spell of the machine hits every row
            for mode, _ in rows:
                runs[mode].append(asyncio.run(_straggler(cores, mode, iters, leave, i)))
        walls = {mode: statistics.median(v) for mode, v in runs.items()}
        best_fixed = min(walls["dop1"], walls["dop-all"])
        print(f"\n{f'straggler, the rest free after {leave:.1f} s':40} {'wall s':>8} {'x best fixed':>13}")
        for mode, label in rows:
            print(f"{label:40} {walls[mode]:8.3f} {walls[mode] / best_fixed:13.3f}")

    ns = (1, 2, 4, 8, 16)
    over: dict[int, list[tuple[float, float]]] = {n: [] for n in ns}
    for _ in range(args.repeat):
        for n in ns:
            over[n].append(asyncio.run(_oversubscribed(cores[0], n, iters)))
    print(f"\n{'workers on 1 core, same work':40} {'wall s':>8} {'x 1 worker':>13} {'CPU s':>8} {'x 1 worker':>11}")
    w1 = statistics.median(w for w, _ in over[1])
    c1 = statistics.median(c for _, c in over[1])
    for n in ns:
        w = statistics.median(x for x, _ in over[n])
        c = statistics.median(y for _, y in over[n])
        print(f"{n:<40} {w:8.3f} {w / w1:13.3f} {c:8.3f} {c / c1:11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
