"""``tangram`` / ``python -m tangram_sdk``: demo, simulate, bench. Parsing only; logic lives elsewhere."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tangram", description="Action-level resource management for agentic RL")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a small live agentic-rollout workload: static vs Tangram")
    demo.add_argument("--trajectories", type=int, default=None, help="default: one per core")
    demo.add_argument("--actions", type=int, default=6, help="actions per trajectory")
    demo.add_argument("--cpus", type=str, default=None, help="cores to use (default: all of this machine's)")
    demo.add_argument("--work", type=float, default=0.4, help="single-core seconds of work per action")
    demo.add_argument("--think", type=float, default=0.45, help="mean seconds of 'thinking' between actions")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-progress", action="store_true")

    sim = sub.add_parser("simulate", help="discrete-event simulation of a workload under several policies")
    from .sim.cli import add_arguments

    add_arguments(sim)

    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args)
    if args.command == "simulate":
        from .sim.cli import run as sim_run

        return sim_run(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
