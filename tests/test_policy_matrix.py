"""The policy matrix in CI size (`python benchmarks/policy_matrix.py --quick`): Tangram against
every fixed policy a user could pick instead, cell by cell, on the same trajectories. Asserts the
issue-12 bar in every cell it runs: mean ACT within 2 % of the best fixed policy (8 % better in
contended cells), RL step within 2 % too — except the contended CPU cells' step, which is bounded
(benchmarks/policy_matrix.py STRAGGLER_BOUND, docs/evaluation.md "losing cells") unless the tests
are malleable or restartable, or their callers pass length hints (those cells meet the strict
bar). And in every cell without exception: no single fixed policy is more than 2 % better than
Tangram on mean ACT and step at once."""

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
        # whichever one fixed setting the user would have picked, it does not win on both counts
        worst_one = max(min(t["act"] / x["act"], t["step"] / x["step"]) for x in rows.values())
        assert r["one_ratio"] == pytest.approx(worst_one)
        assert worst_one <= pm.ONE_POLICY_BAR, table


def test_one_fixed_policy_better_on_both_counts_is_a_loss_without_tolerance() -> None:
    pm = _matrix()

    def row(policy: str, act: float, step: float) -> dict[str, object]:
        return {"policy": policy, "act": act, "step": step}

    # better on one count each: the per-metric bar judges them, the one-policy bar does not fire
    split = pm.judge([row("tangram", 1.00, 100.0), row("fifo2", 1.10, 95.0), row("fifo4", 0.99, 120.0)],
                     contended=False)
    assert split["one_ratio"] == pytest.approx(1.0 / 1.10)  # fifo2: worse on ACT, so below 1
    assert split["one_ratio"] < 1.0
    assert not any("better on ACT and step" in f for f in split["fails"])
    # fifo4 better by 5 % on ACT and 3 % on step: a loss, even in a contended cell's step tolerance
    both = pm.judge([row("tangram", 0.50, 200.0), row("fifo2", 0.60, 250.0), row("fifo4", 0.475, 194.0)],
                    contended=True)
    assert both["one_policy"] == "fifo4"
    assert both["one_ratio"] == pytest.approx(200.0 / 194.0)
    assert any("fifo4 better on ACT and step" in f for f in both["unbounded"])
