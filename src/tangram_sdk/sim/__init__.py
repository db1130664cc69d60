"""Discrete-event simulator driving the real scheduler core on virtual time (see docs/simulator.md)."""

from .engine import Act, Result, Trajectory, simulate
from .metrics import summarise, timeline
from .trace import TraceError, TraceRecorder, load_trace, trace_workload
from .workloads import Workload, ai_coding, build, deepsearch, mopd, run_policy

__all__ = ["Act", "Result", "TraceError", "TraceRecorder", "Trajectory", "Workload", "ai_coding", "build",
           "deepsearch", "load_trace", "mopd", "run_policy", "simulate", "summarise", "timeline",
           "trace_workload"]
