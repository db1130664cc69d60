"""``tangram simulate ... --plot DIR``: the PNGs exist, open, have a readable size, name every policy
in their legends, label their axes in words with units, and keep CPU and GPU utilisation apart.

Legend texts cannot be read back from a PNG; they come from ``plots.json``, which write_plots fills
from the very figure objects it saves (and the figure builders are checked directly too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib", reason="the plot extra is not installed")

from matplotlib import image as mpimg

from tangram_sdk.cli import main
from tangram_sdk.sim.plots import figure_act_cdf, figure_utilisation
from tangram_sdk.sim.trace import trace_workload
from tangram_sdk.sim.workloads import run_policy

CODING = ["tangram", "static", "fifo1", "fifo4", "fifo16"]


def _simulate(args: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["simulate", *args, "--plot", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    meta: dict[str, Any] = json.loads((out / "plots.json").read_text())
    for name in meta:
        assert f"wrote {out / name}" in printed
    return meta


def _open(path: Path) -> tuple[int, int]:
    img = mpimg.imread(path)  # decodes the PNG: a truncated or empty file fails here
    h, w = img.shape[:2]
    assert w >= 700 and h >= 400, (path.name, w, h)
    assert img.std() > 0.01, f"{path.name} is blank"
    return w, h


def _legend(meta: dict[str, Any], name: str) -> list[str]:
    return [t for ax in meta[name]["axes"] for t in ax["legend"]]


def test_cpu_workload_with_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plots"  # created: its parent exists
    meta = _simulate(["--workload", "ai-coding", "--batch", "12", "--nodes", "1", "--cores", "24", "--policy", "all",
                      "--sweep-batch", "6,12"], out, capsys)
    assert sorted(meta) == ["act-breakdown.png", "act-cdf.png", "sweep.png", "utilisation.png"]
    for name in meta:
        _open(out / name)
    assert _legend(meta, "act-cdf.png") == CODING
    assert meta["act-breakdown.png"]["axes"][0]["xticklabels"] == CODING
    assert _legend(meta, "act-breakdown.png") == ["queueing", "system overhead", "execution"]
    util = _legend(meta, "utilisation.png")
    for p in CODING:
        assert f"{p} busy" in util
    assert "static allocated" in util  # a static sandbox is held while its trajectory thinks
    (sweep_act, sweep_ratio) = meta["sweep.png"]["axes"]
    assert sorted(sweep_act["legend"]) == sorted(CODING)
    assert sorted(sweep_ratio["legend"]) == sorted(f"{p} / tangram" for p in CODING if p != "tangram")
    # axes in words, with units
    for name, m in meta.items():
        for ax in m["axes"]:
            assert ax["xlabel"] and ax["ylabel"], (name, ax)
            assert "_" not in ax["xlabel"] + ax["ylabel"], (name, ax)  # no raw keys like act_mean_s
    assert "(seconds" in meta["act-cdf.png"]["axes"][0]["xlabel"]
    assert "(seconds" in sweep_act["ylabel"] and "batch size" in sweep_act["xlabel"]
    assert meta["utilisation.png"]["axes"][0]["ylabel"] == "cores in use (% of pool)"


def test_mixed_cpu_and_gpu_pool_gets_separate_panels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "mixed.jsonl"
    rows = [{"pool": {"cpus": 4, "gpus": 4}}]
    for i in range(6):
        rows.append({"arrival": 3.0 * i, "kind": "test", "cpus": 1, "duration": 1.0, "traj": f"a{i % 2}",
                     "elastic": {"resource": "cpu", "max_units": 4, "parallel": 0.9}})
        rows.append({"arrival": 3.0 * i + 0.2, "kind": "score", "gpus": 1, "service": f"rm{i % 3}",
                     "duration": 0.5, "traj": f"b{i % 2}"})
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "mixed"
    meta = _simulate(["--workload", "trace", "--trace", str(trace), "--policy", "all"], out, capsys)
    pols = ["tangram", "fifo1", "fifo4", "fifo16", "isolated"]
    assert _legend(meta, "act-cdf.png") == pols
    cpu, gpu = meta["utilisation.png"]["axes"]
    assert cpu["ylabel"] == "cores in use (% of pool)" and gpu["ylabel"] == "GPUs in use (% of pool)"
    for ax in (cpu, gpu):
        assert [t for t in ax["legend"] if t.endswith(" busy")] == [f"{p} busy" for p in pols]
    w, h = _open(out / "utilisation.png")
    assert h > w * 0.6  # two panels stacked, not one squeezed
    assert "sweep.png" not in meta


def test_figures_carry_the_legends_the_sidecar_reports(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in [
        {"pool": {"cpus": 2}}, {"arrival": 0, "kind": "x", "cpus": 1, "duration": 1.0, "traj": "a"},
        {"arrival": 0, "kind": "x", "cpus": 1, "duration": 1.0, "traj": "b"}]) + "\n")
    wl = trace_workload(trace)
    results = [run_policy(wl, p) for p in ("tangram", "fifo1", "fifo4")]
    fig = figure_act_cdf(results)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["tangram", "fifo1", "fifo4"]
    # tangram, coinciding with the fifo curves here, is drawn wide and underneath: they stay visible
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert lines["tangram"].get_linewidth() > lines["fifo1"].get_linewidth()
    assert lines["tangram"].get_zorder() < lines["fifo1"].get_zorder()
    assert len({(ln.get_linestyle(), ln.get_marker()) for ln in lines.values()}) == 3
    fig2 = figure_utilisation(results)
    assert len(fig2.axes) == 1  # CPU only: no empty GPU panel
