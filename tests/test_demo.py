"""``tangram demo`` tells the truth: ACT spelled out, a loss worded as a loss, and a machine without
parallel speedup named as the reason; progress is one line per phase when stderr is not a terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tangram_sdk.demo import Probe, _Run, summary


def _run(name: str, act: float, wall: float) -> _Run:
    return _Run(name, acts=[act] * 4, queued=[0.0] * 4, wall=wall, units=[1] * 4)


FIRST = str(min(os.sched_getaffinity(0)))  # a core this process may use
IDLE = Probe(cores=2, single_s=0.15, parallel=1.95, load=0.1)
BUSY = Probe(cores=2, single_s=0.30, parallel=1.05, load=4.8)
PARTLY = Probe(cores=2, single_s=0.20, parallel=1.50, load=2.8)  # seen here beside a 2-job benchmark


def test_a_loss_is_printed_as_a_loss() -> None:
    # the run: tangram 1.712 s vs static 0.835 s used to print "ACT 0.49x lower"
    lines = summary(_run("static", 0.835, 10.0), _run("tangram", 1.712, 16.6), IDLE, IDLE)
    assert lines[0].startswith("result: Tangram slower by 2.05x in mean ACT (1.712 s vs 0.835 s static); "
                               "Tangram slower by 1.66x in wall time")
    assert not re.search(r"\blower\b|faster", lines[0])
    assert len(lines) == 1  # the machine had a parallel speedup: no excuse is printed


def test_a_win_and_a_tie() -> None:
    win = summary(_run("static", 0.9, 10.0), _run("tangram", 0.6, 9.0), IDLE, IDLE)
    assert win[0].startswith("result: Tangram faster by 1.50x in mean ACT") and "faster by 1.11x in wall time" in win[0]
    tie = summary(_run("static", 1.0, 10.0), _run("tangram", 0.99, 10.1), IDLE, IDLE)
    assert "Tangram and static about the same in mean ACT (1.01x)" in tie[0]


def test_no_parallel_speedup_is_named_in_one_line() -> None:
    lines = summary(_run("static", 0.835, 10.0), _run("tangram", 1.712, 16.6), IDLE, BUSY)
    assert lines[0].startswith("result: Tangram slower by 2.05x")
    assert len(lines) == 2 and lines[1].startswith("why: this machine showed no parallel speedup (only 1.05 of 2")
    won = summary(_run("static", 0.9, 10.0), _run("tangram", 0.6, 9.0), BUSY, IDLE)
    assert won[1].startswith("note: a machine check found only 1.05 of 2") and "will vary" in won[1]
    one = summary(_run("static", 1.0, 10.0), _run("tangram", 1.1, 10.0), Probe(1, 0.15, 1.0, None),
                  Probe(1, 0.15, 1.0, None))
    assert one[1].startswith("why: with one core there is nothing to split")


def test_a_partly_busy_machine_is_named_with_the_cost_it_brings() -> None:
    # 1.50 of 2 cores delivered, Tangram 1.11x slower: seven single runs here lost 3-17 % while
    # the repeated ABBA benchmark measured 0.974 of static; the reader learns why a run can lose
    lines = summary(_run("static", 0.657, 7.5), _run("tangram", 0.732, 8.29), IDLE, PARTLY)
    assert lines[0].startswith("result: Tangram slower by 1.11x")
    assert len(lines) == 2 and lines[1].startswith("note: a machine check found 1.50 of 2 cores' worth")
    assert "first action" in lines[1] and "varies" in lines[1]
    assert len(summary(_run("static", 0.657, 7.5), _run("tangram", 0.732, 8.29), IDLE, IDLE)) == 1


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tangram_sdk", "demo", "--actions", "2", "--work", "0.05",
                           "--think", "0.05", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.exclusive
@pytest.mark.timeout(180)
def test_the_live_demo_reports_what_it_measured() -> None:
    proc = _demo()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "ACT = action completion time" in out
    assert re.search(r"machine check before: \d+ pinned processes at once got [0-9.]+ cores' worth", out), out
    assert "machine check after: " in out
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(static|tangram)\s+([0-9.]+)", out, re.M)}
    ratio = rows["static"] / rows["tangram"]
    verdict = re.search(r"result: (Tangram faster by|Tangram slower by|Tangram and static about the same in)", out)
    assert verdict, out
    want = ("Tangram faster by" if ratio >= 1.03 else "Tangram slower by" if ratio <= 1 / 1.03
            else "Tangram and static about the same in")
    assert verdict.group(1) == want, (ratio, out)  # the words match the table, whichever way it went
    # stderr is a pipe: one line per phase, no redrawn bar
    assert "\r" not in proc.stderr
    phases = [line.split(":")[0] for line in proc.stderr.splitlines()]
    assert phases == ["machine check (before)", "static", "tangram", "machine check (after)"], proc.stderr
    assert _demo("--no-progress", "--cpus", FIRST).stderr == ""


def test_one_core_says_there_is_nothing_to_split() -> None:
    proc = _demo("--cpus", FIRST, "--no-progress", "--trajectories", "1")
    assert proc.returncode == 0, proc.stderr
    assert "why: with one core there is nothing to split" in proc.stdout
