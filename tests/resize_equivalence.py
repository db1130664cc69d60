"""The same-core equivalence (tests/test_sim_engine.py) for actions resized while they run: the
trace through the simulator and through the live runtime on looptime must log the same decisions,
entry by entry. Live, each action sleeps its work and, on every Resize its lease hears of,
re-times it exactly as the simulator does (one per-grant CPU cost, then the rest of its work at
the new size; a restartable action's work starts over)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from tangram_sdk import Pool
from tangram_sdk.runtime import Tangram
from tangram_sdk.scheduler import Resize
from tangram_sdk.sim.baselines import CPU_UPDATE_S, make_policy
from tangram_sdk.sim.engine import Trajectory, simulate

__all__ = ["assert_same_decisions"]


def _recorder(log: list[Any]) -> Callable[[Any, float, Any], None]:
    return lambda events, now, decisions: log.append((tuple(events), round(now, 6), tuple(decisions)))


def _q(t: float) -> float:
    return round(t * 1_000_000) / 1_000_000


async def _live(trajs: Sequence[Trajectory], pool: Pool) -> list[Any]:
    log: list[Any] = []
    loop = asyncio.get_running_loop()
    async with Tangram(pool, observers=[_recorder(log)], batch=False) as tangram:

        async def run(tr: Trajectory) -> None:
            for act in tr.acts:
                await asyncio.sleep(act.think)
                async with tangram.acquire(act.spec, expected_s=act.hint) as lease:
                    el = act.spec.elastic
                    restarts = el is not None and el.restartable
                    t0, f0 = loop.time() + CPU_UPDATE_S, 0.0
                    rate = 1.0 / (act.work * act.relative_duration(lease.units))
                    end = _q(t0 + 1.0 / rate)
                    changed = asyncio.Event()
                    lease.on_resize(lambda _l, ev=changed: ev.set())
                    while loop.time() < end:
                        waiter = asyncio.ensure_future(changed.wait())
                        done, _ = await asyncio.wait([waiter], timeout=end - loop.time())
                        if not done:
                            waiter.cancel()
                            break
                        changed.clear()
                        t = max(loop.time() + CPU_UPDATE_S, t0)  # as the simulator re-times it
                        f = 0.0 if restarts else min(1.0, f0 + (t - t0) * rate)
                        rate = 1.0 / (act.work * act.relative_duration(lease.units))
                        t0, f0 = t, f
                        end = _q(t + (1.0 - f) / rate)
            await asyncio.sleep(tr.tail)

        await asyncio.gather(*(run(tr) for tr in trajs))
    return log


async def assert_same_decisions(trajs: Sequence[Trajectory], pool: Pool) -> list[Resize]:
    """Simulate ``trajs`` on ``pool`` (1 us time grid), run them live (call under looptime), and
    assert both decision logs match; returns the Resize decisions made."""
    sim_log: list[Any] = []
    simulate(trajs, make_policy("tangram", pool), observers=[_recorder(sim_log)], time_resolution=1e-6)
    rt_log = await _live(trajs, pool)
    assert len(sim_log) == len(rt_log)
    for i, (a, b) in enumerate(zip(sim_log, rt_log)):
        assert a == b, f"entry {i} differs:\nsim {a}\nrt  {b}"
    return [d for _e, _t, ds in sim_log for d in ds if isinstance(d, Resize)]
