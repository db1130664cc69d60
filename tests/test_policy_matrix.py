"""The policy matrix in CI size (`python benchmarks/policy_matrix.py --quick`): Tangram against
every fixed policy a user could pick instead, cell by cell, on the same trajectories. Asserts the
issue-12 bar in every cell it runs: mean ACT within 2 % of the best fixed policy (8 % better in
contended cells), RL step within 2 % too — except the contended CPU cells' step, which is bounded
(benchmarks/policy_matrix.py STRAGGLER_BOUND, docs/evaluation.md "losing cells") unless the tests
are malleable or restartable, or their callers pass length hints (those cells meet the strict
bar)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "policy_matrix.py"


def _matrix():  # type: ignore[no-untyped-def]
    # importable by name in the worker processes too (the cells run in a process pool)
    if str(_PATH.parent) not in sys.path:
        sys.path.insert(0, str(_PATH.parent))
    return importlib.import_module("policy_matrix")


def test_quick_policy_matrix_meets_the_bar() -> None:
    pm = _matrix()
    results = pm.run_matrix(quick=True, jobs=2)
    table = pm.render(results)
    assert len(results) >= 15, table
    families = {r["family"] for r in results}
    assert {"ai-coding", "mopd", "deepsearch", "trace"} <= families, table
    assert any(r["contended"] for r in results), table
    # malleable tests grow stragglers into idle cores, restartable ones are run again there,
    # hinted long ones are sized for their own end: in those cells the contended step meets the
    # strict bar
    for mode in ("malleable", "restartable", "hinted"):
        cells = [r for r in results if mode in r["cell"]]
        assert cells and all(r["step_ratio"] <= pm.ACT_BAR for r in cells), table
    bad = [f"{r['cell']}: {'; '.join(r['unbounded'])}" for r in results if r["unbounded"]]
    assert not bad, "\n".join(bad) + "\n" + table
    for r in results:  # the judge's own arithmetic, re-checked from the rows
        rows = {x["policy"]: x for x in r["rows"] if "error" not in x}
        t = rows.pop("tangram")
        assert r["act_ratio"] == pytest.approx(t["act"] / min(x["act"] for x in rows.values()))
        assert r["act_ratio"] <= pm.ACT_BAR, table
        if r["contended"]:
            assert r["act_ratio"] <= pm.CONTENDED_BAR, table
            assert r["step_ratio"] <= pm.STRAGGLER_BOUND, table
        else:
            assert r["step_ratio"] <= pm.ACT_BAR, table
