"""Elastic (Tangram) vs the best fixed DoP on an open-loop stream, from narrow pools to wide ones.

Poisson arrivals of one elastic CPU kind (exponential work of 1 s on one core, Amdahl ``p``,
capped at ``cap`` cores) on a pool of ``cores`` (one node), at loads of 15-90 % of the pool's
single-core capacity. No trajectories: nothing adapts to the scheduler, so a fixed DoP picked for
the load is the strongest simple alternative (``tangram_sdk.sim.openloop``). Each cell is the
ratio of Tangram's summed mean ACT over the seeds to the best single fixed DoP's (1, 2, 4, ...
up to the cap), all measured in this run on the same arrivals. Columns for the mechanisms off,
in the same run: ``--run-share 0``, the narrow-pool window (the pricing window 1/16 of a
single-core run alone, as before stop 54; ``moldable._RUN_SHARE``); ``--fragment-grants 0``,
sizing past the fragment on an idle narrow node (stop 55; ``moldable._FRAGMENT_GRANTS``).

    python benchmarks/open_loop.py                       # 9 shapes x 6 loads x 3 seeds, ~30 s here
    python benchmarks/open_loop.py --fragment-grants 0   # and without stop 55's rule, same run
    python benchmarks/open_loop.py --option supply=expected   # a Scheduler option, same run
    python benchmarks/open_loop.py --option _POOL_GRANTS=0    # a moldable constant: stop 57's window off
    python benchmarks/open_loop.py --learned --option learn._SMEAR_Z=inf   # another module's: stop 65's mean off
    python benchmarks/open_loop.py --shapes 0.97:16:32:2 --option learn._SKEW_Z=inf   # stop 66's right tail off
    python benchmarks/open_loop.py --learned --sigma 1.5 --shapes 0.97:16:16   # heavy tails, learned
    python benchmarks/open_loop.py --shapes 0.9:16:16 --loads 0.3 --seeds 5
    python benchmarks/open_loop.py --mix 0.9 --shapes 0.97:16:16 --sigma 1.5   # two kinds, one node
"""

from __future__ import annotations

import argparse
import importlib
import math
import time
from typing import Any

import tangram_sdk.scheduler.moldable as moldable
from tangram_sdk import ActionSpec, Scheduler
from tangram_sdk.sim.openloop import elastic_spec, fixed_dop_acts, fixed_pair_acts, node_pool, open_loop

SHAPES = "0.9:16:16,0.75:16:16,0.97:16:16,0.5:16:16,0.9:8:16,0.9:16:32,0.9:32:32,0.9:16:64,0.9:32:128"
LOADS = "0.15,0.3,0.45,0.6,0.75,0.9"


def _const(name: str) -> tuple[Any, str]:
    """(module, attribute) of a constant named ``_NAME`` (moldable's) or ``module._NAME`` (a module
    of ``tangram_sdk.scheduler``: ``learn._SMEAR_Z``)."""
    mod, _, attr = name.rpartition(".")
    return (importlib.import_module(f"tangram_sdk.scheduler.{mod}") if mod else moldable), attr


def cell(p: float, cap: int, cores: int, load: float, seeds: int, n: int,
         variants: list[dict[str, Any]], sigma: float | None = None,
         learned: bool = False, mix: float | None = None, measured: bool = False,
         nodes: int = 1) -> tuple[str, list[float]]:
    """(best fixed DoP, Tangram / best for each variant) on ``seeds`` streams; a variant sets
    ``moldable`` constants (names starting with ``_``) and Scheduler options for its run (``{}``:
    the default). ``mix``: a second kind of Amdahl ``mix`` (same cap) takes half the arrivals,
    and the yardstick is the best pair of fixed DoPs, one per kind."""
    gap = 1.0 / (load * cores)
    dur = None if learned or measured else 1.0
    fixed: list[dict[Any, float]]
    spec: ActionSpec | tuple[ActionSpec, ...]
    if mix is None:
        fixed = [fixed_dop_acts(p, cap, cores, gap, n, seed=s, sigma=sigma, nodes=nodes) for s in range(seeds)]
        spec = elastic_spec(cap, p, dur)
    else:
        fixed = [fixed_pair_acts(p, mix, cap, cores, gap, n, seed=s, sigma=sigma) for s in range(seeds)]
        spec = (elastic_spec(cap, p, dur, kind="t"), elastic_spec(cap, mix, dur, kind="u"))
    best = min(fixed[0], key=lambda d: sum(f[d] for f in fixed))
    best_sum = sum(f[best] for f in fixed)
    label = f"fifo{best}" if mix is None else "fifo{}+{}".format(*best)
    out = []
    for variant in variants:
        consts = {k: v for k, v in variant.items() if k.startswith("_") or "." in k}
        options = {k: v for k, v in variant.items() if k not in consts}
        saved = {name: getattr(*_const(name)) for name in consts}
        for name, value in consts.items():
            setattr(*_const(name), type(saved[name])(value))
        try:
            t = sum(open_loop(Scheduler(node_pool(cores, nodes), **options), spec, gap, n, seed=s, sigma=sigma,
                              measured=measured)
                    for s in range(seeds))
        finally:
            for name, value in saved.items():
                setattr(*_const(name), value)
        out.append(t / best_sum)
    return label, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES,
                    help="p:cap:cores[:nodes],... (Amdahl p, DoP cap, pool cores, NUMA nodes: 1)")
    ap.add_argument("--loads", default=LOADS, help="offered load as a share of the pool at one core each")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--n", type=int, default=1500, help="arrivals per stream")
    ap.add_argument("--run-share", type=float, action="append", default=[],
                    help="also run with moldable._RUN_SHARE at this value (0: the window off); repeatable")
    ap.add_argument("--fragment-grants", type=float, action="append", default=[],
                    help="also run with moldable._FRAGMENT_GRANTS at this value (0: the rule off); repeatable")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="also run with this Scheduler option (supply=expected, load_target=1.0, ...) or, "
                         "named with a leading _, moldable constant (_FRAGMENT_SPREAD=inf), or another "
                         "scheduler module's (learn._SMEAR_Z=inf); repeatable")
    ap.add_argument("--sigma", type=float, default=None,
                    help="log-normal work of this log-sigma (mean 1 s) instead of exponential")
    ap.add_argument("--learned", action="store_true",
                    help="Tangram's spec declares no duration: lengths (and their spread) are learned")
    ap.add_argument("--measured", action="store_true",
                    help="as --learned, and each release reports the parallelism its work got (lease.run)")
    ap.add_argument("--mix", type=float, default=None, metavar="P2",
                    help="a second elastic kind (Amdahl P2, same cap) takes half the arrivals; the "
                         "yardstick is the best pair of fixed DoPs, one per kind")
    args = ap.parse_args(argv)
    variants: list[dict[str, Any]] = [{}]
    names = ["tangram"]
    for flag, const, values in (("share", "_RUN_SHARE", args.run_share),
                                ("fragment", "_FRAGMENT_GRANTS", args.fragment_grants)):
        for v in values:
            variants.append({const: v})
            names.append(f"{flag} {v:g}")
    for opt in args.option:
        name, _, text = opt.partition("=")
        value: Any = {"true": True, "false": False}.get(text.lower(), text)
        if isinstance(value, str):
            try:
                value = float(text)
            except ValueError:
                pass
        variants.append({name: value})
        names.append(text if len(text) <= 9 else text[:9])
    t0 = time.perf_counter()
    print(f"{'p':>5} {'cap':>4} {'cores':>5} {'load':>5}  {'best':<9} " + "  ".join(f"{n:>9}" for n in names))
    ratios: list[list[float]] = [[] for _ in variants]
    for shape in args.shapes.split(","):
        ps, caps, cs, *ns = shape.split(":")
        p, cap, cores, nodes = float(ps), int(caps), int(cs), int(ns[0]) if ns else 1
        for load in (float(x) for x in args.loads.split(",")):
            best, rs = cell(p, cap, cores, load, args.seeds, args.n, variants, args.sigma, args.learned,
                            args.mix, args.measured, nodes)
            for i, r in enumerate(rs):
                ratios[i].append(r)
            marks = "  ".join(f"{r:>8.3f}{'*' if r > 1.02 else ' '}" for r in rs)
            where = f"{cores}" if nodes == 1 else f"{cores}/{nodes}"
            print(f"{p:>5} {cap:>4} {where:>5} {load:>5}  {best:<9} " + marks, flush=True)
    print()
    for name, rs in zip(names, ratios):
        geo = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{name}: {len(rs)} cells, {sum(r > 1.02 for r in rs)} losing (> 1.02, marked *), "
              f"worst {max(rs):.3f}, best {min(rs):.3f}, geomean {geo:.3f}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
