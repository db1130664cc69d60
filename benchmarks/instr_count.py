"""Instructions per operation under callgrind: a noise-free view of the core runtime's cost.

Wall-clock timings on a shared 2-core machine drift by +-20% between runs; instruction counts do
not. Each scenario runs twice under ``valgrind --tool=callgrind`` (N and 2N operations) and the
difference divided by N is reported, so start-up and imports cancel out. Needs ``valgrind``.

    python benchmarks/instr_count.py [--n 2000]

Scenarios (each paired with its baseline, as in ``core_overhead.py``):
  uncontended   Tangram acquire+release on an idle pool   vs  anyio.CapacityLimiter
  contended     2048 tasks x n/2048 actions on 8 cores     vs  asyncio.Semaphore
  core          release + round + submit, 2048 queued (pure core, no event loop)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

SCENARIO = r'''
import asyncio, sys, anyio
from tangram_sdk import ActionSpec, Pool, Scheduler, Tangram
what, n = sys.argv[1], int(sys.argv[2])
spec = ActionSpec(kind="noop", cpus=1)

async def uncontended(use_limiter):
    lim = anyio.CapacityLimiter(8)
    async with Tangram(Pool(cpus=8)) as t:
        for _ in range(500):
            async with t.acquire(spec):
                pass
            async with lim:
                pass
        for _ in range(n):
            if use_limiter:
                async with lim:
                    pass
            else:
                async with t.acquire(spec):
                    pass

async def contended(use_sem):
    tasks = 2048
    sem = asyncio.Semaphore(8)
    async with Tangram(Pool(cpus=8)) as t:
        async def worker():
            for _ in range(max(1, n // tasks)):
                if use_sem:
                    async with sem:
                        await asyncio.sleep(0)
                else:
                    async with t.acquire(spec):
                        await asyncio.sleep(0)
        await asyncio.gather(*[worker() for _ in range(tasks)])

def core():
    s = Scheduler(Pool(cpus=8))
    aid = 0
    for _ in range(2048):
        aid += 1
        s.submit(aid, spec, 0.0)
    running = set(s._running)
    now = 0.0
    for _ in range(n):
        now += 1e-5
        d = s.release(running.pop(), now)
        running.add(d[0].action_id)
        aid += 1
        s.submit(aid, spec, now)

if what == "core":
    core()
elif what.startswith("unc"):
    asyncio.run(uncontended(what == "unc-limiter"))
else:
    asyncio.run(contended(what == "con-semaphore"))
'''


def instructions(what: str, n: int) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
           SCENARIO, what, str(n)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    m = re.search(r"Collected : (\d+)", out)
    if m is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(m.group(1))


def per_op(what: str, n: int) -> float:
    return (instructions(what, 2 * n) - instructions(what, n)) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="operations in the short run (long: 2n)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    n = args.n
    con_n = max(n, 2048) * 10  # at least 10 actions per task
    rows = [
        ("uncontended", per_op("unc-tangram", n), "anyio.CapacityLimiter", per_op("unc-limiter", n)),
        ("contended", per_op("con-tangram", con_n), "asyncio.Semaphore", per_op("con-semaphore", con_n)),
        ("core only", per_op("core", n), "-", float("nan")),
    ]
    print(f"{'scenario':<13}{'Tangram instr/op':>18}  {'baseline':<24}{'instr/op':>10}{'ratio':>8}")
    for name, ours, base_name, base in rows:
        ratio = ours / base if base == base else float("nan")
        print(f"{name:<13}{ours:>18,.0f}  {base_name:<24}{base:>10,.0f}{ratio:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
