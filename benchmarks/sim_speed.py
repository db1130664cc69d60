"""Simulator speed: actions simulated per second, and how it scales with batch size and policy.

    .venv/bin/python benchmarks/sim_speed.py [--batches 256,1024,3072] [--gpus 40] [--workload mopd]

Requirement (issue 5): one mopd step at batch 3072 (~100k actions) in <= 30 s on this 2-core machine.
``fifo1`` (no elastic planning) isolates the engine's own cost from the scheduler's. The MOPD
default is calibrated lighter (8-16 calls, isolated-36 ~3 % busy); the speed point keeps the
earlier, heavier shape (24-40 calls per trajectory, 4096-token chunks at 30 tok/s: ~98k actions at
3072, the pool ~19 % busy) unless ``--param`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tangram_sdk.sim.metrics import summarise
from tangram_sdk.sim.workloads import build, run_policy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="mopd")
    ap.add_argument("--batches", default="256,1024,3072")
    ap.add_argument("--policies", default="fifo1,tangram")
    ap.add_argument("--gpus", type=int, default=None, help="GPU pool (mopd default 40)")
    ap.add_argument("--param", action="append", default=None, metavar="NAME=VALUE",
                    help="workload parameter (repeatable); mopd default: calls 24-40, chunk 4096 at 30 tok/s")
    args = ap.parse_args(argv)
    params: dict[str, object] = ({"calls_min": 24, "calls_max": 40, "chunk_tokens": 4096, "decode_tok_s": 30.0}
                                 if args.workload == "mopd" else {})
    for item in args.param or ():
        name, _, value = item.partition("=")
        params[name] = json.loads(value)
    print(f"{'workload':>10} {'policy':>8} {'batch':>6} {'actions':>8} {'build s':>8} {'sim s':>7} "
          f"{'actions/s':>10} {'rounds':>8} {'mean ACT':>9}")
    worst = None
    for b in (int(x) for x in args.batches.split(",")):
        t0 = time.perf_counter()
        kw = dict(params)
        if args.gpus is not None:
            kw["gpus"] = args.gpus
        wl = build(args.workload, b, **kw)
        t_build = time.perf_counter() - t0
        for pol in args.policies.split(","):
            r = run_policy(wl, pol)
            s = summarise(r)
            rounds = sum(st.get("rounds", 0) for st in r.scheduler_stats)
            print(f"{args.workload:>10} {pol:>8} {b:>6} {s['actions']:>8} {t_build:8.1f} {r.wall_s:7.1f} "
                  f"{s['actions'] / r.wall_s:10.0f} {rounds:>8} {s['act_mean_s']:9.3f}", flush=True)
            if pol == "tangram" and b >= 3072:
                worst = r.wall_s
    if worst is not None:
        print(f"batch-3072 tangram step: {worst:.1f} s ({'OK' if worst <= 30 else 'OVER'} the 30 s budget)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
