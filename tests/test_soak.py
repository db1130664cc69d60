"""Short mode of benchmarks/soak.py (thousands of concurrent trajectories, mixed action kinds, a real
TorchGpuManager, injected cancels/raises/timeouts) plus the memory bounds the long mode relies on.

The long run (>= 1 million actions, RSS asserted flat) is ``python benchmarks/soak.py --long``;
its figures are in docs/reliability.md.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Tangram

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from soak import Soak, rss_mb  # noqa: E402

pytestmark = pytest.mark.timeout(120)

torch_available = True
try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover - the test command installs torch
    torch_available = False


async def test_short_soak_leaks_nothing() -> None:
    """2048 concurrent trajectories x 4 actions: every unit, waiter, probe apply and GPU instance comes
    back; every kind of outcome and every cancel phase actually happened; RSS stays bounded. Cancels
    land inside managers' releases and GPU applies too (two bugs there are fixed and pinned by
    tests/test_chaos.py)."""
    soak = Soak(trajectories=2048, actions=4, epochs=1, seed=1, cancel_p=0.05, raise_p=0.05, timeout_p=0.15,
                gpu=torch_available, think_ms=0.0, avoid_known_bugs=False, stall_s=20.0)
    rep = await soak.run()
    assert rep["leaks"] == [] and rep["unexpected"] == [], rep["leaks"]
    out = rep["outcomes"]
    assert sum(out.values()) == 2048 * 4
    assert out.get("ok", 0) > 0 and out.get("raised", 0) > 0 and out.get("timeout", 0) > 0
    assert out.get("cancelled", 0) > 0
    assert {"queued", "applying", "held"} <= set(rep["cancel_phase"]), rep["cancel_phase"]
    sched = rep["scheduler"]
    assert sched["granted"] == sched["released"] and sched["rejected"] == 0
    if torch_available:
        assert rep["kinds"].get("score", 0) > 0 and rep["gpu"]["restores"] > 0
    assert rep["max_core_cache"] <= 4097
    growth = rep["rss_mb"]["end"] - rep["rss_mb"]["start"]
    assert growth < 50, rep["rss_mb"]


async def test_short_soak_with_every_fault_leaks_nothing() -> None:
    """The same with cancels also inside manager releases and GPU applies: nothing leaks (a cancel
    inside a manager's release once skipped returning the units, and one inside an LRU eviction
    wedged the GPU instance; see tests/test_chaos.py)."""
    soak = Soak(trajectories=1024, actions=3, epochs=1, seed=2, cancel_p=0.10, raise_p=0.05, timeout_p=0.15,
                gpu=torch_available, think_ms=0.0, avoid_known_bugs=False, stall_s=10.0)
    rep = await soak.run()
    assert rep["leaks"] == [], rep["leaks"]


async def test_per_spec_caches_stay_bounded_under_random_durations() -> None:
    """Elastic specs with a fresh random duration each are all distinct: the core's per-spec caches
    must stay within their bound, and memory must not grow with the number of specs seen."""
    el = Elasticity("cpu", max_units=4, efficiency=Amdahl(0.9))
    async with Tangram(Pool(cpus=4)) as t:
        async def burst(n: int, base: int) -> None:
            for i in range(n):
                spec = ActionSpec(kind="build", cpus=1, elastic=el, duration=0.001 + (base + i) * 1e-7)
                async with t.acquire(spec):
                    pass

        await burst(5000, 0)  # past the 4096 bound once: warm
        gc.collect()
        before = rss_mb()
        await burst(5000, 10_000)
        gc.collect()
        after = rss_mb()
        core = t.scheduler
        assert len(core._shape) <= 4097
        assert after - before < 8, (before, after)
        assert t.statistics()["completed"] == 10_000


async def test_core_state_per_kind_stays_bounded() -> None:
    """The core's per-kind state (a KindStats with the kind's last spec, walked when it plans an
    elastic split) stays bounded: a job that names kinds per repo/task (``kind=f"pytest-{repo}"``)
    must not grow memory and per-round cost without bound (it once did: ~0.4 KB per kind)."""
    async with Tangram(Pool(cpus=2)) as t:
        for i in range(6000):
            async with t.acquire(ActionSpec(kind=f"pytest-repo{i}", cpus=1)):
                pass
        assert len(t.scheduler._kinds) <= 4097, len(t.scheduler._kinds)
