"""The uncontended acquire's cost, as a count of calls: a deterministic guard against drift.

Wall-clock targets live in ``benchmarks/core_overhead.py`` (ratios measured in one run). They
slipped from ~1.05x anyio.CapacityLimiter to ~2.0x over two days of features without any test
noticing, because no single change cost much: the Python calls made per uncontended
acquire+release grew from 29 to 40. Calls are counted here with ``sys.setprofile`` (the same on
every run and machine), only in tangram_sdk's own frames, so the budget moves only when our code
does. Raise it deliberately, with the benchmark's numbers in docs/benchmarks.md, never to make a
red test pass."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from types import FrameType
from typing import Any

import attrs
import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Tangram

# (Python calls, C calls made from tangram_sdk frames) per acquire+release: budgets set 2026-12-03
# at 23 / 27, 71 / 85 and 84 / 99 measured (stop 33's cuts; they were 27 / 27, 75 / 83, 87 / 95).
# Stop 53 raised the elastic ones by two Python calls: the features since stop 33 had brought
# them to 75.3 / 84.9 and 88.9 / 99.4 on an idle machine, under 1 % below the budget, and a loaded
# CI machine's least of three runs was 76.7 and 89.4; core_overhead.py then measured 1.11x
# CapacityLimiter and 57,000 actions/s (docs/benchmarks.md). Stop 54: the 8-core pool here is one
# grant wide, where the pricing window now covers the widest grant's run (moldable._RUN_SHARE);
# with that alone the price was no longer zero on this path (101-105 / 98-99 and 118.6 / 113-114
# calls, grants of 5 cores); one caller's loop now forecasts none of its own arrivals
# (learn.LONE), so the loop here runs priced at zero on all 8 cores again: 77.0 / 82.0 and
# 90.7 / 96.4 on an idle machine, the same every run (no wall-clock price on this path now)
# Stop 65: a kind's learned mean checks its lengths' own average every 64th completion
# (learn._mean_excess): 25.015 / 29.06 on the fixed path, which sat at exactly 25 / 29
BUDGET = {"fixed": (25.05, 29.1), "elastic": (79, 88), "grouped": (93, 102)}
SPECS = {
    "fixed": ActionSpec(kind="noop", cpus=1),
    "elastic": ActionSpec(kind="tests", cpus=1, elastic=Elasticity("cpu", 8, Amdahl(0.9))),
}


def _ours(frame: FrameType | None) -> bool:
    return frame is not None and "tangram_sdk" in frame.f_code.co_filename


async def _calls_per_op(spec: ActionSpec, n: int = 200, grouped: bool = False) -> tuple[float, float]:
    """Calls per acquire+release of ``spec``; ``grouped``: a copy naming a new ``group`` every 10
    calls (what the veRL/OpenRLHF adapters send), made before counting."""
    specs = [attrs.evolve(spec, group=f"t{i // 10}") if grouped else spec for i in range(50 + n)]
    async with Tangram(Pool(cpus=8)) as t:
        for i in range(50):  # warm: memos filled, the kind's statistics past their first samples
            async with t.acquire(specs[i]):
                pass
        seen: Counter[str] = Counter()

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event == "call" and _ours(frame):
                seen["py"] += 1
            elif event == "c_call" and _ours(frame):
                seen["c"] += 1

        sys.setprofile(profile)
        try:
            for i in range(n):
                async with t.acquire(specs[50 + i]):
                    pass
        finally:
            sys.setprofile(None)
    return seen["py"] / n, seen["c"] / n


@pytest.mark.exclusive  # the elastic path's count moves with the wall clock: the cores to itself
@pytest.mark.parametrize("which", sorted(BUDGET))
def test_an_uncontended_acquire_stays_within_its_call_budget(which: str) -> None:
    grouped = which == "grouped"
    # the least of three runs: the elastic path's count moves with the wall clock it prices by
    # (arrival rates, expected releases), and a loaded machine adds calls to one run now and then
    # (seen up to +14 % at the same commit); the path's own cost is what the budget guards
    runs = [asyncio.run(_calls_per_op(SPECS["elastic" if grouped else which], grouped=grouped)) for _ in range(3)]
    py, c = min(r[0] for r in runs), min(r[1] for r in runs)
    most_py, most_c = BUDGET[which]
    assert py <= most_py and c <= most_c, (
        f"{which}: {py:.1f} Python / {c:.1f} C calls per acquire+release, budget {most_py} / {most_c}")
    assert py >= 0.6 * most_py  # the profile saw the path (not a vacuous pass)
