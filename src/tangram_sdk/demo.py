"""``tangram demo``: a small agentic-rollout workload, run live on this machine, twice.

Each trajectory alternates "thinking" (an LLM decoding; here a sleep) with a CPU action: a real
subprocess pinned to the lease's cores, whose busy-loop work is split over ``lease.units``
processes, so more cores really do finish it sooner.

* **static**: what trajectory-level provisioning does. A trajectory takes a fixed sandbox of
  ``cores / trajectories`` cores (at least 1) at its first action and holds it until it ends, so
  trajectories queue for sandboxes and a sandbox idles while its trajectory thinks.
* **tangram**: every action acquires cores for itself alone, elastically (1..all cores).

Both runs use the same seeded workload; the table compares average action completion time (ACT:
queueing + execution) and wall time.

Why the machine check: elastic cores only help if the machine really runs the split work in
parallel. A short probe before and after (one pinned process alone, then one per core at once)
measures how many cores' worth of work the machine delivers; on a loaded machine that is close to
one, Tangram cannot win, and the demo says so instead of printing a ratio as if it were a speedup.
A loss is printed as a loss.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._cpuset import format_cpuset, parse_cpuset
from .lease import Lease
from .pool import Pool
from .runtime import Tangram
from .spec import ActionSpec, Amdahl, Elasticity

# The action: spin for `iters` loop iterations split across `k` pinned worker processes.
_WORK = r"""
import os, sys
from multiprocessing import Process
iters, k = int(sys.argv[1]), int(sys.argv[2])
def spin(n):
    x = 0
    for i in range(n):
        x += i
if k <= 1:
    spin(iters)
else:
    ps = [Process(target=spin, args=(iters // k,)) for _ in range(k)]
    [p.start() for p in ps]
    [p.join() for p in ps]
"""


# The probe: pin to one core, spin `iters` iterations, print how long the loop took (startup excluded).
_PROBE = r"""
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[2])})
n = int(sys.argv[1])
t0 = time.perf_counter()
x = 0
for i in range(n):
    x += i
print(time.perf_counter() - t0)
"""


@dataclass
class Probe:
    """What the machine delivered: ``parallel`` cores' worth of work from ``cores`` pinned processes."""

    cores: int
    single_s: float
    parallel: float
    load: float | None

    def describe(self) -> str:
        load = f", load average {self.load:.2f}" if self.load is not None else ""
        return (f"{self.cores} pinned processes at once got {self.parallel:.2f} cores' worth of work "
                f"(of {self.cores}{load})")

    def short(self) -> str:
        return f"{self.parallel:.2f} of {self.cores} cores' worth of parallel work"


def probe(cpus: tuple[int, ...], rate: float, seconds: float = 0.15) -> Probe:
    """Single-core vs all-core: one pinned spin alone, then one per core at the same time."""
    import subprocess

    iters = max(1000, int(rate * seconds))

    def spin(cores: tuple[int, ...]) -> list[float]:
        procs = [subprocess.Popen([sys.executable, "-c", _PROBE, str(iters), str(c)], stdout=subprocess.PIPE,
                                  text=True) for c in cores]
        out = []
        for p in procs:
            text, _ = p.communicate(timeout=60)
            out.append(float(text.strip() or "inf"))
        return out

    # best of two each: a one-off preemption should not read as the machine's speed
    single = min(spin(cpus[:1])[0] for _ in range(2))
    parallel = max(sum(single / t for t in spin(cpus) if t > 0) for _ in range(2))
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    return Probe(len(cpus), single, parallel, load)


def _no_speedup(p: Probe) -> bool:
    """True when the machine ran the cores' work barely faster than one core: no room for elasticity."""
    return p.cores < 2 or p.parallel < 1.0 + 0.3 * (p.cores - 1)


def _partly_busy(p: Probe) -> bool:
    """True when other work took a visible share of the cores (below 85 % of them delivered) but
    not all of the speedup: a result there is real but smaller and noisier than on an idle machine."""
    return p.cores >= 2 and p.parallel < 0.85 * p.cores


def _calibrate() -> float:
    """Loop iterations per second on one core (so --work means single-core seconds)."""
    n = 200_000
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return n / max(time.perf_counter() - t0, 1e-6)


@dataclass
class _Run:
    name: str
    acts: list[float] = field(default_factory=list)
    queued: list[float] = field(default_factory=list)
    wall: float = 0.0
    units: list[int] = field(default_factory=list)


class _Progress:
    """A bar redrawn in place on a terminal; otherwise (a log, CI) one line when a phase ends."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.label = total, 0, ""
        self.enabled, self.tty = enabled, enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def start(self, label: str) -> None:
        self.label, self.done, self.t0 = label, 0, time.perf_counter()
        if self.tty:
            sys.stderr.write(f"\r{label} ...")
            sys.stderr.flush()

    def tick(self) -> None:
        self.done += 1
        if self.tty:
            bar = "#" * (30 * self.done // self.total)
            sys.stderr.write(f"\r{self.label:<8} [{bar:<30}] {self.done}/{self.total}")
            sys.stderr.flush()

    def end(self, what: str = "") -> None:
        if not self.enabled:
            return
        sys.stdout.flush()  # keep the phase lines in order with the results when both go to one log
        took = time.perf_counter() - self.t0
        if self.tty:
            sys.stderr.write("\r\x1b[K" if not what else "\n")
        else:
            done = f", {self.done}/{self.total} actions" if self.done else ""
            sys.stderr.write(f"{self.label}: done in {took:.1f} s{done}{what}\n")
        sys.stderr.flush()


async def _trajectory(t: Tangram, mode: str, plan: list[tuple[float, int]], cores: int, sandbox: int,
                      run: _Run, progress: _Progress) -> None:
    loop = asyncio.get_running_loop()
    elastic = ActionSpec(kind="run_tests", cpus=1,
                         elastic=Elasticity("cpu", max_units=cores, efficiency=Amdahl(0.95)))
    held: Lease | None = None
    try:
        for think, iters in plan:
            await asyncio.sleep(think)
            arrived = loop.time()
            if mode == "static":
                if held is None:  # a sandbox is bound to the trajectory at its first action
                    held = lease = await t.acquire_lease(ActionSpec(kind="sandbox", cpus=sandbox))
                queued = loop.time() - arrived
                r = await lease.run([sys.executable, "-c", _WORK, str(iters), str(len(lease.cpus))])
                run.units.append(len(lease.cpus))
            else:
                async with t.acquire(elastic) as lease:
                    queued = lease.queued_s
                    r = await lease.run([sys.executable, "-c", _WORK, str(iters), str(lease.units)])
                    run.units.append(lease.units)
            if not r.ok:
                raise RuntimeError(f"demo action failed: {r.stderr.decode()[-300:]}")
            run.acts.append(loop.time() - arrived)
            run.queued.append(queued)
            progress.tick()
    finally:
        if held is not None:
            await t.release(held)


async def _run_mode(mode: str, pool: Pool, plans: list[list[tuple[float, int]]], sandbox: int,
                    progress: _Progress) -> _Run:
    run = _Run(mode)
    progress.start(mode)
    t0 = time.perf_counter()
    async with Tangram(pool) as t:
        await asyncio.gather(*[_trajectory(t, mode, p, len(pool.cpus), sandbox, run, progress) for p in plans])
        t.scheduler.check_invariants()
    run.wall = time.perf_counter() - t0
    return run


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _verdict(ratio: float, what: str) -> str:
    """``ratio`` = static / tangram (> 1: Tangram better). Within 3 % is a tie, said as one."""
    if ratio >= 1.03:
        return f"Tangram faster by {ratio:.2f}x in {what}"
    if ratio <= 1 / 1.03:
        return f"Tangram slower by {1 / ratio:.2f}x in {what}"
    return f"Tangram and static about the same in {what} ({ratio:.2f}x)"


def run_demo(args: argparse.Namespace) -> int:
    """Entry point of ``tangram demo`` (arguments already checked by the CLI)."""
    cpus = parse_cpuset(args.cpus) if args.cpus else tuple(sorted(os.sched_getaffinity(0)))
    pool = Pool(cpus=list(cpus))
    trajectories = args.trajectories if args.trajectories is not None else len(cpus)
    rng = random.Random(args.seed)
    rate = _calibrate()
    plans = []
    for _ in range(trajectories):
        plan = []
        for _ in range(args.actions):
            think = rng.expovariate(1.0 / args.think) if args.think > 0 else 0.0
            work = args.work * rng.lognormvariate(0.0, 0.5)  # heavy-ish tail, mean ~1.13x
            plan.append((think, max(1, int(work * rate))))
        plans.append(plan)
    sandbox = max(1, len(cpus) // trajectories)
    total = trajectories * args.actions
    print(f"tangram demo: {trajectories} trajectories x {args.actions} actions on cores "
          f"{format_cpuset(cpus)} ({len(cpus)}); work ~{args.work:g} s single-core per action, "
          f"think ~{args.think:g} s")
    print("ACT = action completion time: from asking for cores to the action's end (queueing + execution), "
          "averaged over actions; lower is better.")
    print(f"static: a sandbox of {sandbox} core(s) per trajectory, held for the trajectory's whole life; "
          f"tangram: cores per action, 1..{len(cpus)} (elastic)\n")
    progress = _Progress(total, not args.no_progress)
    progress.start("machine check (before)")
    before = probe(cpus, rate)
    progress.end()
    print(f"machine check before: {before.describe()}")
    results = []
    for mode in ("static", "tangram"):
        results.append(asyncio.run(_run_mode(mode, pool, plans, sandbox, progress)))
        progress.end()
    progress.start("machine check (after)")
    after = probe(cpus, rate)
    progress.end()
    print(f"machine check after:  {after.describe()}\n")
    print(f"{'policy':<10}{'mean ACT s':>12}{'mean queue s':>14}{'mean cores':>12}{'wall s':>10}")
    for r in results:
        print(f"{r.name:<10}{_mean(r.acts):>12.3f}{_mean(r.queued):>14.3f}{_mean(r.units):>12.2f}{r.wall:>10.2f}")
    print()
    for line in summary(results[0], results[1], before, after):
        print(line)
    return 0


def summary(s: _Run, t: _Run, before: Probe, after: Probe) -> list[str]:
    """The verdict (static ``s`` vs tangram ``t``): a loss is worded as a loss, and a machine that
    showed no parallel speedup is named as the reason in one line."""
    act_ratio = _mean(s.acts) / max(_mean(t.acts), 1e-9)
    wall_ratio = s.wall / max(t.wall, 1e-9)
    out = [f"result: {_verdict(act_ratio, 'mean ACT')} ({_mean(t.acts):.3f} s vs {_mean(s.acts):.3f} s static); "
           f"{_verdict(wall_ratio, 'wall time')} ({t.wall:.2f} s vs {s.wall:.2f} s)"]
    worst = min((before, after), key=lambda p: p.parallel)
    if worst.cores < 2:
        out.append("why: with one core there is nothing to split, so elastic cores cannot speed an action up; "
                   "run it with two or more cores.")
    elif _no_speedup(worst) and act_ratio < 1.03:
        out.append(f"why: this machine showed no parallel speedup (only {worst.short()}: other work is using the "
                   "cores), so more cores cannot finish an action sooner; on an idle machine the elastic speedup "
                   "shows.")
    elif _no_speedup(worst):
        out.append(f"note: a machine check found only {worst.short()} (other work on the cores), so this "
                   "ratio was measured on a busy machine and will vary from run to run.")
    elif _partly_busy(worst):
        # the one systematic cost there: a kind's first action is sized on the declared efficiency
        # (nothing measured yet) and can take every core while the next trajectory's action waits
        out.append(f"note: a machine check found {worst.short()} (other work on the cores): more cores "
                   "gain less here, a kind's first action (sized before any was measured) may make the "
                   "next one wait, and one run varies; repeat it, or run it on an idle machine.")
    return out
