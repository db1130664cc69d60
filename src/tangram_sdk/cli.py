"""``tangram`` / ``python -m tangram_sdk``: demo, simulate, top. Parsing and checking only; logic lives elsewhere.

Every argument is checked before anything runs: a bad value, a missing file or directory, an
option that needs another one, or an optional package the options need but that is not installed
ends the command at once with one line on stderr and exit status 2 (no traceback, no half run).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ._args import Parser, nonneg_float, nonneg_int, positive_float, positive_int


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument("--trajectories", type=positive_int, default=None,
                      help="concurrent trajectories (default: one per core)")
    demo.add_argument("--actions", type=positive_int, default=6, help="actions per trajectory (default 6)")
    demo.add_argument("--cpus", type=str, default=None,
                      help="cores to use, as a cpuset like 0-3 or 0,2 (default: every core this process may use)")
    demo.add_argument("--work", type=positive_float, default=0.4,
                      help="single-core seconds of work per action, on average (default 0.4)")
    demo.add_argument("--think", type=nonneg_float, default=0.45,
                      help="mean seconds of 'thinking' (LLM decoding) between actions; 0 for none (default 0.45)")
    demo.add_argument("--seed", type=nonneg_int, default=0,
                      help="random seed of the workload: same seed, same actions in both runs (default 0)")
    demo.add_argument("--no-progress", action="store_true",
                      help="print no progress on stderr (by default: a bar on a terminal, one line per phase otherwise)")


def _check_demo(args: argparse.Namespace) -> str | None:
    if args.cpus is None:
        return None
    from ._cpuset import parse_cpuset
    from .errors import SpecError

    try:
        cpus = parse_cpuset(args.cpus)
    except (SpecError, ValueError, TypeError) as exc:
        return f"argument --cpus: {exc}"
    if not cpus:
        return "argument --cpus: no cores given"
    allowed = set(os.sched_getaffinity(0))
    outside = sorted(set(cpus) - allowed)
    if outside:
        from ._cpuset import format_cpuset

        return (f"argument --cpus: core(s) {format_cpuset(outside)} are not available to this process "
                f"(it may use {format_cpuset(sorted(allowed))})")
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tangram", description="Action-level resource management for agentic RL")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,simulate,top}")

    demo = sub.add_parser("demo", help="run a small live agentic-rollout workload on this machine: static vs Tangram",
                          description="Run a small agentic-rollout workload live on this machine's cores twice, "
                                      "trajectory-static sandboxes vs Tangram, after measuring how much parallel "
                                      "work the machine delivers; no Docker or GPU needed.")
    _demo_arguments(demo)

    sim = sub.add_parser("simulate", help="discrete-event simulation of a workload under several policies",
                         description="Simulate an RL step of a workload (or replay a trace) under several "
                                     "scheduling policies on virtual time, and compare them.")
    from .sim.cli import add_arguments as sim_arguments

    sim_arguments(sim)

    top = sub.add_parser("top", help="live view of a running pool (a Prometheus endpoint or the Ray actor)",
                         description="Watch a running Tangram: per-resource allocated vs busy units, queue per "
                                     "action kind, ACT split, GPU service restores and evictions; refreshed in "
                                     "place on a terminal.")
    from .top import add_arguments as top_arguments

    top_arguments(top)
    parser.subparsers = {"demo": demo, "simulate": sim, "top": top}  # type: ignore[attr-defined]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse and check ``argv``, then run the command; returns the exit status (2: bad usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        sub: argparse.ArgumentParser = parser.subparsers[args.command]  # type: ignore[attr-defined]
        if args.command == "demo":
            check = _check_demo
        elif args.command == "simulate":
            from .sim.cli import check
        else:
            from .top import check
        msg = check(args)
        if msg:
            sub.error(msg)
    except SystemExit as exc:  # argparse's exit (a usage error or --help), as a status
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args)
    if args.command == "simulate":
        from .sim.cli import run as sim_run

        return sim_run(args)
    from .top import run as top_run

    return top_run(args)


if __name__ == "__main__":
    sys.exit(main())
