"""Tiny pools on a busy machine: Tangram vs every fixed DoP, a few coding trajectories per node.

``tangram demo``'s shape in the simulator: ``batch`` coding trajectories (tests and shells) on one
node of ``cores``, DoP cap = the node, tests declared Amdahl 0.95 and truly ``--truths`` (0.0: a
machine too busy to give a second core anything; 0.5: 1.33x at 2 cores; 0.95: the declaration
holds). Runs report their parallelism (``--durations``: they do not, the harder case). Each cell
is the geometric mean over the seeds of Tangram's mean ACT over the best fixed policy's of the
same seed (fifo1 ... fifo<cores>), all in this run on the same trajectories, with how many seeds
lose by more than 2 % and the worst. ``--off`` adds a column with ``CpuSizing._whole_node`` (stop
58: a whole-node grant prices the waits of what arrives during it) replaced by the price's size;
``--closed-off`` one without stop 59's cap on a busy node (``moldable._CLOSED_MAX = 0``: no job is
taken for a closed pool of a few callers, ``CpuSizing._closed_dop``). ``--without RULE``
(repeatable) adds one per rule turned off: ``whole-node`` and ``closed`` (the two above), and stop
60's ``exact`` (the closed pool's identical-server model on every node, ``moldable._EXACT_CORES =
0``), ``probe`` (measured kinds re-check their speedup at the declared size, ``moldable._PROBE_X =
0``), ``censor`` (durations move beta only with 32 completions a size, ``learn._CENSOR = 0``).

    python benchmarks/tiny_busy.py                  # 5 shapes x 3 truths x 40 seeds, ~10 s here
    python benchmarks/tiny_busy.py --off            # and without stop 58's rule, same run
    python benchmarks/tiny_busy.py --closed-off     # and without stop 59's closed-pool cap
    python benchmarks/tiny_busy.py --durations      # efficiency learned from durations alone
    python benchmarks/tiny_busy.py --without exact --without probe   # stop 60's rules, each off
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from tangram_sdk.scheduler import learn, moldable
from tangram_sdk.sim.metrics import summarise
from tangram_sdk.sim.workloads import ai_coding, run_policy

SHAPES = "2:2,2:4,4:4,4:8,8:8"
# --without RULE: (owner, attribute, the value that turns the rule off); --off and --closed-off
# are the first two
RULES: dict[str, tuple[Any, str, Any]] = {
    # stop 58: a whole-node grant keeps the price's size
    "whole-node": (moldable.CpuSizing, "_whole_node", lambda self, a, want, free, mu, now: want),
    # stop 59: no job is taken for a closed pool
    "closed": (moldable, "_CLOSED_MAX", 0),
    "exact": (moldable, "_EXACT_CORES", 0),
    "probe": (moldable, "_PROBE_X", 0),
    "censor": (learn, "_CENSOR", 0),
}


def cell(batch: int, cores: int, truth: float, seeds: int, measured: bool) -> tuple[float, int, float]:
    fixed = [f"fifo{d}" for d in (1, 2, 4, 8, 16, 32, 64) if d <= cores]
    ratios = []
    for seed in range(seeds):
        wl = ai_coding(batch, nodes=1, cores=cores, seed=seed, test_max_cpus=cores, test_parallel=0.95,
                       true_parallel=truth)
        act = {p: summarise(run_policy(wl, p, measured=measured))["act_mean_s"] for p in ("tangram", *fixed)}
        ratios.append(act["tangram"] / min(act[p] for p in fixed))
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
    return gm, sum(r > 1.02 for r in ratios), max(ratios)


def _without(owner: Any, name: str, value: Any, batch: int, cores: int, truth: float, seeds: int,
             measured: bool) -> str:
    """The cell's column with ``owner.name`` set to ``value`` for its run (a rule turned off)."""
    keep = getattr(owner, name)
    setattr(owner, name, value)
    try:
        gm, lose, worst = cell(batch, cores, truth, seeds, measured)
    finally:
        setattr(owner, name, keep)
    return f"{gm:.3f}{'*' if gm > 1.02 else ' '} ({lose:>2} of {seeds}, {worst:.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="trajectories:cores,...")
    ap.add_argument("--truths", default="0.0,0.5,0.95", help="true Amdahl fractions of the tests")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--durations", action="store_true", help="runs report no parallelism")
    ap.add_argument("--off", action="store_true", help="also run without CpuSizing._whole_node")
    ap.add_argument("--closed-off", action="store_true", help="also run without CpuSizing._closed_dop")
    ap.add_argument("--without", action="append", default=[], choices=sorted(RULES),
                    help="also run with this rule off (repeatable)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    measured = not args.durations
    rules = (["whole-node"] if args.off else []) + (["closed"] if args.closed_off else []) + args.without
    head = f"{'trajs':>5} {'cores':>5} {'truth':>5}  {'tangram / best fixed (losing, worst)':<38}"
    print(f"{head:<60}" + "".join(f"  {'no ' + r:<24}" for r in rules) if rules else head)
    all_gm = []
    for shape in args.shapes.split(","):
        b, c = (int(x) for x in shape.split(":"))
        for truth in (float(x) for x in args.truths.split(",")):
            gm, lose, worst = cell(b, c, truth, args.seeds, measured)
            all_gm.append(gm)
            line = f"{b:>5} {c:>5} {truth:>5}  {gm:.3f}{'*' if gm > 1.02 else ' '} ({lose:>2} of {args.seeds}, {worst:.3f})"
            for rule in rules:
                line = f"{line:<60}  " + _without(*RULES[rule], b, c, truth, args.seeds, measured)
            print(line)
    losing = sum(g > 1.02 for g in all_gm)
    print(f"\ntangram: {len(all_gm)} cells, {losing} losing (geomean > 1.02, marked *), worst {max(all_gm):.3f} "
          f"({'measured' if measured else 'durations only'}; {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
