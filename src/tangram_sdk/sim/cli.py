"""``tangram simulate``: options and the driver (tables, JSON, plots, sweeps, pool-size search)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from typing import Any

from .._args import existing_file, int_list, missing_module, nonneg_int, output_dir, output_file, positive_int
from .engine import Result, text_progress
from .metrics import min_pool_for, summarise
from ..spec import ActionSpec
from .workloads import WORKLOADS, Workload, build, build_policy, run_policy

__all__ = ["add_arguments", "check", "run"]

_COLS = (("policy", "policy", "{}"), ("trajectories", "batch", "{}"), ("actions", "actions", "{}"),
         ("act_mean_s", "ACT mean", "{:.3f}"),
         ("act_p50_s", "p50", "{:.3f}"), ("act_p99_s", "p99", "{:.2f}"), ("queue_mean_s", "queue", "{:.3f}"),
         ("exec_mean_s", "exec", "{:.3f}"), ("overhead_mean_s", "ovh", "{:.3f}"), ("step_s", "step s", "{:.1f}"),
         ("util", "util", "{}"), ("vs", "ACT/tangram", "{}"), ("wall_s", "wall s", "{:.1f}"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=sorted(WORKLOADS) + ["trace"], default="ai-coding")
    p.add_argument("--trace", type=existing_file, help="JSONL trace to replay (with --workload trace)")
    p.add_argument("--batch", type=positive_int, default=None, help="trajectories per RL step (workload default)")
    p.add_argument("--policy", default="tangram", help="tangram|static|fifo<N>|isolated|all, or a comma list")
    p.add_argument("--seed", type=nonneg_int, default=0, help="workload random seed (default 0)")
    p.add_argument("--nodes", type=positive_int, default=None, help="ai-coding: CPU nodes (default 15)")
    p.add_argument("--cores", type=positive_int, default=None, help="ai-coding: cores per node (default 256)")
    p.add_argument("--gpus", type=positive_int, default=None,
                   help="mopd/deepsearch/trace: GPU pool size (mopd default 40, deepsearch 8; a trace keeps its "
                        "CPUs and quotas)")
    p.add_argument("--cpus", type=positive_int, default=None, help="trace: CPU pool size (the trace's pool line, if any, keeps its GPUs and quotas)")
    p.add_argument("--iso-gpus", type=_iso_gpus, default=None, metavar="N|share",
                   help="isolated: N GPUs per service (the isolated pool is N x services; mopd default 4), "
                        "or 'share': the whole --gpus pool split in proportion to call share, >= 1 each")
    p.add_argument("--param", action="append", default=None, metavar="NAME=VALUE", type=_param,
                   help="override one workload parameter (docs/simulator.md lists them), e.g. "
                        "test_max_cpus=32 (ai-coding) or decode_tok_s=60 (mopd); null for an optional "
                        "one; repeatable")
    p.add_argument("--measured", action="store_true",
                   help="elastic CPU actions report the parallelism their work got, as lease.run/exec "
                        "measure it live; without it Tangram learns efficiency from durations alone")
    p.add_argument("--gpus-needed", action="store_true",
                   help="search the smallest GPU pools on which tangram's mean ACT is within 0, 10 and 25 %% "
                        "of the isolated baseline's")
    p.add_argument("--sweep-batch", type=int_list, default=None,
                   help="comma list of batch sizes, e.g. 256,512,1024,1536")
    p.add_argument("--json", dest="json_out", type=output_file, default=None, help="write all results as JSON here")
    p.add_argument("--plot", type=output_dir, default=None, metavar="DIR",
                   help="write PNG figures into DIR (created if missing): ACT CDF, ACT breakdown, CPU and GPU "
                        "utilisation; the batch sweep with --sweep-batch (needs matplotlib: the plot extra)")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr")


def _iso_gpus(text: str) -> int | str:
    if text.strip().lower() == "share":
        return "share"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be an integer > 0 or 'share', got {text!r}") from None


def _param(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    v: Any
    try:
        v = json.loads(value)
    except ValueError:
        v = value
    return name.strip(), v


_POLICY = re.compile(r"tangram|static|isolated|fifo[1-9][0-9]*")
_FLAGS = {"gpus": "--gpus", "iso_gpus": "--iso-gpus"}  # parameters a flag of their own sets


def check(args: argparse.Namespace) -> str | None:
    """Everything that can be checked before simulating: a message for the usage error, or None.

    Builds the workload (cheap: trajectories are drawn, nothing runs), so a trace that does not
    parse, or a policy the workload cannot run, fails here and not after the first policies ran.
    """
    trace = args.workload == "trace"
    if args.trace and not trace:
        return "--trace needs --workload trace"
    if trace and not args.trace:
        return "--workload trace needs --trace PATH"
    for opt, ok in (("--nodes", args.workload == "ai-coding"), ("--cores", args.workload == "ai-coding"),
                    ("--gpus", args.workload != "ai-coding"), ("--cpus", trace),
                    ("--batch", not trace), ("--sweep-batch", not trace)):
        if getattr(args, opt[2:].replace("-", "_")) is not None and not ok:
            return f"{opt} does not apply to --workload {args.workload}"
    if args.param:
        if trace:
            return "--param does not apply to --workload trace"
        from .workloads import PARAMS

        known = PARAMS[args.workload]
        for name, value in args.param:
            if name in _FLAGS and args.workload != "ai-coding":  # applied after the flag, it silently won (and --gpus-needed probed
                # one pool size over and over)
                return f"--param {name}: use {_FLAGS[name]} (it sets the same thing)"
            if name not in known:
                return (f"--param: {args.workload} has no parameter {name!r} "
                        f"(choose from {', '.join(sorted(known))})")
            default = known[name]
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if number and not math.isfinite(value):  # json.loads reads NaN and Infinity
                return f"--param {name}: expected a finite number, got {value!r}"
            if isinstance(default, bool):  # a switch (sandbox_names also takes a unit name)
                if not isinstance(value, bool) and not (name == "sandbox_names" and isinstance(value, str)):
                    return f"--param {name}: expected true or false, got {value!r}"
            elif default is None:  # an optional number: null turns it off
                if value is not None and not number:
                    return f"--param {name}: expected a number or null, got {value!r}"
            elif isinstance(default, (int, float)) and not number:
                return f"--param {name}: expected a number, got {value!r}"
        sized = [n for n, _ in args.param if n in ("nodes", "gpus_per_node")]
        if sized and args.workload == "mopd" and (args.gpus is not None or args.gpus_needed):
            # --gpus (or each size --gpus-needed probes) replaces nodes x gpus_per_node: ignored silently
            flag = "--gpus" if args.gpus is not None else "--gpus-needed"
            return f"--param {sized[0]}: {flag} sets the pool size; give the pool one way"
    if args.plot and args.plot.lower().endswith(".png"):
        return f"--plot takes a directory (it writes several PNGs into it), got {args.plot!r}"
    if args.plot and missing_module("matplotlib"):
        return "--plot needs matplotlib: pip install 'tangram-sdk[plot]'"
    names = [p.strip() for p in args.policy.split(",") if p.strip()]
    if "all" in names and len(names) > 1:
        return "--policy: 'all' stands alone (it is every policy of the workload); or list policies by name"
    bad = [p for p in names if p != "all" and not _POLICY.fullmatch(p)]
    if not names or bad:
        return (f"--policy: unknown policy {bad[0] if bad else args.policy!r}; "
                "choose from tangram, static, fifo<N> (N > 0), isolated, all")
    try:
        wl = _workload(args, args.batch)
        sweep = [_workload(args, b) for b in (args.sweep_batch or ())]
    except (ValueError, TypeError, ArithmeticError) as exc:  # TraceError included: it names the line
        given = ", ".join(f"{n}={v!r}" for n, v in args.param or ())
        return f"--workload {args.workload}" + (f" with --param {given}" if given else "") + f": {exc}"
    if not any(t.acts for t in wl.trajectories):
        return f"--workload {args.workload}: these parameters give a workload without a single action"
    pols = _policies(args, wl)
    if not wl.services:
        if "isolated" in pols:
            return f"--policy isolated needs GPU services, and {wl.name} has none"
        if args.gpus_needed:
            return f"--gpus-needed compares with the isolated baseline, which needs GPU services; {wl.name} has none"
    if trace and args.seed:
        return "--seed does not apply to --workload trace (a trace is one recorded run)"
    if args.iso_gpus is not None and "isolated" not in pols and not args.gpus_needed:
        return "--iso-gpus needs the isolated policy (--policy isolated or all) or --gpus-needed"
    # every policy built now (cheap, nothing runs), so one the workload cannot run fails before
    # the others have: isolated slices that do not fit, a fixed policy's bad parameter, an action
    # (a trace's, a static sandbox) larger than the pool
    for pol in pols + (["isolated"] if args.gpus_needed and "isolated" not in pols else []):
        try:
            policy = build_policy(wl, pol, iso_gpus=_iso(args, wl) if pol == "isolated" else None)
        except (ValueError, TypeError, ArithmeticError) as exc:
            return f"--policy {pol}: {exc}"
        why = _never_runs(wl, policy)
        if why is not None:
            return f"--policy {pol}: {why}"
    args.built, args.built_sweep = wl, sweep
    return None


def _never_runs(wl: Workload, policy: Any) -> str | None:
    """Why some action of ``wl`` (or the policy's sandbox) could never be granted under
    ``policy``, as the simulation would find out mid-run; None when every one can."""
    seen: set[ActionSpec] = set()
    for tr in wl.trajectories:
        for act in tr.acts:
            if act.spec in seen:
                continue
            seen.add(act.spec)
            li, spec = policy.route(act.spec)
            why = policy.lanes[li].feasibility(spec)
            if why is not None:
                return f"{act.spec.kind} actions can never run on this pool: {why}"
    hold = getattr(policy, "hold", None)
    if hold is not None and seen and (why := policy.lanes[0].feasibility(hold)) is not None:
        return f"its sandboxes can never run on this pool: {why}"
    return None


def _workload(args: argparse.Namespace, batch: int | None) -> Workload:
    if args.workload == "trace":
        from .trace import trace_workload

        wl_trace: Workload = trace_workload(args.trace, cpus=args.cpus, gpus=args.gpus)
        return wl_trace
    kw: dict[str, Any] = {"seed": args.seed}
    if args.workload == "ai-coding":
        if args.nodes is not None:
            kw["nodes"] = args.nodes
        if args.cores is not None:
            kw["cores"] = args.cores
    elif args.gpus is not None:
        kw["gpus"] = args.gpus
    for name, value in getattr(args, "param", None) or ():
        kw[name] = value
    return build(args.workload, batch, **kw)


def _policies(args: argparse.Namespace, wl: Workload) -> list[str]:
    if args.policy == "all":
        return list(wl.policies)
    return list(dict.fromkeys(p.strip() for p in args.policy.split(",") if p.strip()))  # each once


def _iso(args: argparse.Namespace, wl: Workload) -> int | None:
    """GPUs per isolated slice, or None for the proportional split of the whole pool."""
    if args.iso_gpus == "share":
        return None
    if args.iso_gpus is not None:
        return int(args.iso_gpus)
    iso: int | None = wl.params.get("iso_gpus")
    return iso


def _run(args: argparse.Namespace, wl: Workload, pol: str) -> Result:
    """One policy run. Progress: a redrawn bar on a terminal, else one line when the run ends (a
    log file or CI output gets no ``\\r`` redraws)."""
    label = f"{wl.name} {pol:>8} b={len(wl.trajectories)}"
    tty = not args.no_progress and sys.stderr.isatty()
    t0 = time.perf_counter()
    result: Result = run_policy(wl, pol, progress=text_progress(label) if tty else None,
                                iso_gpus=_iso(args, wl) if pol == "isolated" else None,
                                measured=bool(getattr(args, "measured", False)))
    if not args.no_progress and not tty:
        print(f"{label}: {len(result.end)} actions simulated in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
    return result


def _cell(fmt: str, v: Any) -> str:
    text = fmt.format(v)
    # a mean of float differences can come out as -1e-17: print it as the zero it is (but "-",
    # the placeholder of a column that does not apply, stays)
    return text[1:] if text.startswith("-") and text != "-" and not text.strip("-0.") else text


def _table(rows: list[dict[str, Any]]) -> str:
    base = {(r["workload"], r["trajectories"]): r["act_mean_s"] for r in rows if r["policy"] == "tangram"}
    cells = []
    for r in rows:
        r = dict(r)
        u = r.get("gpu_util") if r.get("pool_gpus") and r.get("gpu_busy_mean") else r.get("cpu_util")
        r["util"] = "-" if u is None else f"{u:.0%}"
        b = base.get((r["workload"], r["trajectories"]))
        r["vs"] = f"{r['act_mean_s'] / b:.2f}x" if b else "-"
        cells.append([_cell(fmt, r[k]) for k, _h, fmt in _COLS])
    head = [h for _k, h, _f in _COLS]
    w = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w[i]) for i, h in enumerate(head))]
    lines += ["  ".join(c[i].rjust(w[i]) for i in range(len(head))) for c in cells]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``tangram simulate``; returns the exit code."""
    out: dict[str, Any] = {"workload": args.workload, "seed": args.seed, "runs": []}
    if not hasattr(args, "built"):  # called without the CLI's up-front check
        msg = check(args)
        if msg is not None:
            print(f"tangram simulate: error: {msg}", file=sys.stderr)
            return 2
    wl = args.built
    pols = _policies(args, wl)
    results: list[Result] = []
    rows: list[dict[str, Any]] = []
    for pol in pols:
        try:
            r = _run(args, wl, pol)
        except (ValueError, ArithmeticError) as exc:
            print(f"tangram simulate: policy {pol}: {exc}", file=sys.stderr)
            return 2
        results.append(r)
        rows.append(summarise(r))
    print(f"{wl.name}: {len(wl.trajectories)} trajectories, {wl.n_actions} actions, "
          f"pool {len(wl.pool.cpus)} cpus / {len(wl.pool.gpus)} gpus"
          + ("" if wl.name == "trace" else f", seed {args.seed}"))
    print(_table(rows))
    out["runs"] = rows
    # what ran: the workload's parameters (a flag's value, not the default it replaced) and the options
    params = {k: v for k, v in wl.params.items() if isinstance(v, (int, float, str)) or v is None}
    if wl.name != "trace":
        for k in ("nodes", "gpus_per_node"):
            params.pop(k, None)  # the pool below says what it was
    out["params"] = params
    out["pool"] = {"cpus": len(wl.pool.cpus), "gpus": len(wl.pool.gpus),
                   "numa_nodes": len(wl.pool.numa) if wl.pool.numa else 1}
    if "isolated" in pols or args.gpus_needed:
        iso = _iso(args, wl)
        params["iso_gpus"] = "share" if iso is None else iso
    elif "iso_gpus" in params:
        params.pop("iso_gpus")
    out["options"] = {k: v for k, v in sorted(vars(args).items())
                      if k not in ("built", "built_sweep", "func", "command") and
                      (v is None or isinstance(v, (int, float, str, bool, list)))}
    sweep_rows: list[dict[str, Any]] = []
    if args.sweep_batch:
        for wb in args.built_sweep:
            for pol in pols:
                sweep_rows.append(summarise(_run(args, wb, pol)))
        print("\nbatch sweep:")
        print(_table(sweep_rows))
        out["sweep"] = sweep_rows
    if args.gpus_needed:
        out["gpus_needed"] = _gpus_needed(args, wl)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    if args.plot:
        from .plots import write_plots

        os.makedirs(args.plot, exist_ok=True)
        for path in write_plots(results, sweep_rows, args.plot):
            print(f"wrote {path}")
    return 0


GPUS_NEEDED_SLACK = (0.0, 0.10, 0.25)  # tangram's mean ACT within this much of the isolated baseline's


def _gpus_needed(args: argparse.Namespace, wl: Workload) -> dict[str, Any]:
    """Smallest GPU pools on which tangram's mean ACT is within 0, +10 % and +25 % of the isolated
    baseline's (by bisection over pool sizes; one run per size probed, shared by the three)."""
    iso_run = _run(args, wl, "isolated")
    iso = summarise(iso_run)
    target = iso["act_mean_s"]
    iso_gpus = iso_run.pool_gpus  # what its slices really hold (``--iso-gpus N``: N x services)
    cache: dict[int, float] = {}

    def act_at(g: int) -> float:
        if g not in cache:
            args2 = argparse.Namespace(**{**vars(args), "gpus": g})
            cache[g] = summarise(_run(args2, _workload(args2, len(wl.trajectories)), "tangram"))["act_mean_s"]
        return cache[g]

    need = {}
    for slack in GPUS_NEEDED_SLACK:
        need[slack] = min_pool_for(act_at, target * (1 + slack), 1, max(iso_gpus, 1))
    exact = need[0.0]
    res = {"isolated_gpus": iso_gpus, "isolated_act_mean_s": target, "tangram_gpus": exact,
           "tangram_act_at_need_s": cache.get(exact) if exact else None,
           "saved": (1 - exact / iso_gpus) if exact else None,
           "within": {f"+{slack:.0%}": {"tangram_gpus": g, "target_act_s": target * (1 + slack),
                                        "tangram_act_s": cache.get(g) if g else None,
                                        "saved": (1 - g / iso_gpus) if g else None}
                      for slack, g in need.items()},
           "probed": dict(sorted(cache.items()))}
    print(f"\nGPUs needed vs isolated ({iso_gpus} GPUs, mean ACT {target:.3f} s):")
    for slack, g in need.items():
        label = "equal ACT" if not slack else f"ACT +{slack:.0%}"
        print(f"  {label:>9}: tangram {g if g else 'not reached'}"
              + (f" ({1 - g / iso_gpus:.1%} saved, ACT {cache[g]:.3f} s)" if g else ""))
    print("  probed: " + ", ".join(f"{g}: {a:.3f} s" for g, a in sorted(cache.items())))
    return res
