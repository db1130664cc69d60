"""The greedy plan (mu-grid split + greedy eviction) is compared with exhaustive search under the
same cost estimate on small instances; docs/scheduler.md reports the measured gap."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

from plan_gap import run  # noqa: E402


def test_greedy_plan_is_close_to_exhaustive_optimum():
    gaps = run(instances=60, seed=1)
    assert len(gaps) > 100
    assert min(gaps) >= -1e-9  # exhaustive search really is a lower bound of the same estimate
    optimal = sum(g <= 1e-9 for g in gaps) / len(gaps)
    mean = sum(gaps) / len(gaps)
    assert optimal >= 0.8, optimal
    assert mean <= 0.02, mean
