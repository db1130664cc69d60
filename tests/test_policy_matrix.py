"""The policy matrix in CI size (`python benchmarks/policy_matrix.py --quick`): Tangram against
every fixed policy a user could pick instead, cell by cell, on the same trajectories. Asserts the
issue-12 bar in every cell it runs: mean ACT within 2 % of the best fixed policy (8 % better in
contended cells), RL step within 2 % too — except the contended CPU cells' single step, the
straggler lottery, bounded per step (benchmarks/policy_matrix.py STRAGGLER_BOUND, docs/evaluation.md
"losing cells") and held to the strict bar over a *run*: the same cell over RUN_SEEDS seeds (6), the
total of its steps against each fixed policy's total (an RL job pays the sum of its steps; the
8 % ACT gain is judged on the run too). Malleable, restartable and hinted cells meet the strict bar
step by step. And in every cell and run without exception: no single fixed policy is more than 2 %
better than Tangram on mean ACT and step at once."""

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
    runs = pm.judge_runs(results)
    pm.settle(results, runs)
    table = pm.render(results) + "\n" + pm.render_runs(runs)
    assert len(results) >= 15, table
    # the contended cells' steps as runs: every cap, RUN_SEEDS steps each, the strict bar on the total
    want = [f"ai-coding contended cap{c}" for c in (8, 16, 32, 64)] + ["ai-coding mixed contended cap16"]
    assert {r["run"]: r["steps"] for r in runs} == dict.fromkeys(want, pm.RUN_SEEDS), table
    assert all(r["contended"] and not r["fails"] for r in runs), table
    for r in runs:
        assert r["step_ratio"] <= pm.ACT_BAR and r["act_ratio"] <= pm.CONTENDED_BAR, table
        assert r["one_ratio"] <= pm.ONE_POLICY_BAR, table
    in_runs = {r["run"] for r in runs}
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
            if pm.run_key(r["cell"]) not in in_runs:  # a run's gain is asserted on the run, above
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


def test_a_run_is_judged_on_the_total_of_its_steps_against_each_fixed_policy() -> None:
    pm = _matrix()

    def cell(seed: int, t_step: float, f2_step: float, f4_step: float, f4_error: bool = False) -> dict[str, object]:
        rows: list[dict[str, object]] = [{"policy": "tangram", "act": 0.90, "step": t_step},
                                         {"policy": "fifo2", "act": 1.00, "step": f2_step}]
        rows.append({"policy": "fifo4", "error": "no"} if f4_error else
                    {"policy": "fifo4", "act": 1.30, "step": f4_step})
        return {"cell": f"x contended s{seed}", "contended": True, "rows": rows, **pm.judge(rows, True)}

    # one step lost by 50 % to fifo4, the other two won: the total (300 vs 310) meets the bar
    won = [cell(0, 150.0, 160.0, 100.0), cell(1, 75.0, 110.0, 105.0), cell(2, 75.0, 120.0, 105.0)]
    (run,) = pm.judge_runs(won + [cell(0, 1.0, 1.0, 1.0) | {"cell": "alone s0"}])  # one seed: no run
    assert run["run"] == "x contended" and run["steps"] == 3 and run["best_step"] == "fifo4"
    assert run["step_ratio"] == pytest.approx(300.0 / 310.0) and run["worst_step"] == pytest.approx(1.5)
    assert run["losing_steps"] == 1 and not run["fails"]
    # the same single loss with smaller wins elsewhere: the total loses, whatever each step's bound
    lost = [cell(0, 150.0, 160.0, 100.0), cell(1, 104.0, 110.0, 105.0), cell(2, 104.0, 120.0, 105.0)]
    (run,) = pm.judge_runs(lost)
    assert run["step_ratio"] == pytest.approx(358.0 / 310.0)
    assert any(f.startswith("step 1.155 >") for f in run["fails"])
    # a fixed policy that failed in one seed is not compared on a total it does not have
    (run,) = pm.judge_runs([cell(0, 150.0, 160.0, 100.0), cell(1, 75.0, 110.0, 0.0, f4_error=True)])
    assert run["best_step"] == "fifo2" and run["step_ratio"] == pytest.approx(225.0 / 270.0)
    # a cell of a run that meets its bars has its contended gain judged on the run; others keep it
    def gain(acts: list[float]) -> list[dict[str, object]]:
        cs = [cell(s, 95.0, 100.0, 100.0) for s in range(len(acts))]
        for c, a in zip(cs, acts):
            c["rows"][0]["act"] = a  # against fifo2's 1.00: a gain of 1 - a
            c.update(pm.judge(c["rows"], True))
        return cs

    one_short = gain([0.93, 0.88, 0.88])  # one step 7 % better, the run 10 %
    assert [bool(c["unbounded"]) for c in one_short] == [True, False, False]
    pm.settle(one_short, pm.judge_runs(one_short))
    assert not any(c["unbounded"] for c in one_short)
    all_short = gain([0.95, 0.95])  # the run short of the gain too: nothing is settled
    pm.settle(all_short, pm.judge_runs(all_short))
    assert all(any("contended ACT" in f for f in c["unbounded"]) for c in all_short)
    pm.settle(won, pm.judge_runs(won))  # a step beyond the straggler bound stays a loss
    assert [c["unbounded"] for c in won] == [[f"step 1.500 > {pm.ACT_BAR}"], [], []]
