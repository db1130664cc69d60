"""Trace record (runtime observer) -> replay (simulator), validation errors, and the CLI."""

from __future__ import annotations

import asyncio
import json

import pytest

from tangram_sdk.cli import main as cli_main
from tangram_sdk.pool import Pool
from tangram_sdk.runtime import Tangram
from tangram_sdk.sim.metrics import summarise
from tangram_sdk.sim.trace import TraceError, TraceRecorder, load_trace, trace_workload
from tangram_sdk.sim.workloads import mopd, run_policy
from tangram_sdk.spec import ActionSpec, Amdahl, Elasticity


def _write(path, lines):  # type: ignore[no-untyped-def]
    path.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n")
    return path


GOOD = {"arrival": 0.5, "kind": "test", "cpus": 1, "duration": 2.0,
        "elastic": {"resource": "cpu", "max_units": 8, "parallel": 0.9}}


@pytest.mark.parametrize(("bad", "needle"), [
    ("{not json", "line 3: not valid JSON"),
    ({"kind": "x", "duration": 1.0}, "line 3: missing field 'arrival'"),
    ({"arrival": 1.0, "kind": "x", "duration": -1}, "line 3: field 'duration' must be > 0"),
    ({"arrival": "soon", "kind": "x", "duration": 1}, "line 3: field 'arrival' must be a finite number"),
    ({"arrival": 1.0, "kind": "x", "duration": 1, "cpus": 1.5}, "line 3: field 'cpus' must be an int"),
    ({"arrival": 1.0, "kind": "x", "duration": 1, "colour": "red"}, "line 3: unknown field(s) ['colour']"),
    ({"arrival": 1.0, "kind": "x", "duration": 1, "cpus": 1,
      "elastic": {"resource": "cpu", "max_units": 0}}, "line 3: field 'elastic'"),
    ([1, 2], "line 3: expected a JSON object"),
    ({"arrival": 1.0, "kind": "bad kind!", "duration": 1}, "line 3: field 'kind'"),
])
def test_malformed_line_names_line_and_field(tmp_path, bad, needle) -> None:  # type: ignore[no-untyped-def]
    p = _write(tmp_path / "t.jsonl", [{"pool": {"cpus": 4}}, GOOD, bad])
    with pytest.raises(TraceError) as ei:
        load_trace(p)
    assert needle in str(ei.value)


def test_overlapping_actions_in_one_traj_are_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = _write(tmp_path / "t.jsonl", [{"pool": {"cpus": 4}},
                                      {"arrival": 0.0, "kind": "a", "cpus": 1, "duration": 2.0, "traj": "t1"},
                                      {"arrival": 1.0, "kind": "a", "cpus": 1, "duration": 2.0, "traj": "t1"}])
    with pytest.raises(TraceError, match="line 3: field 'arrival'"):
        trace_workload(p)


def test_replay_keeps_every_action(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lines = [{"pool": {"cpus": 8}}] + [
        {"arrival": 0.1 * i, "kind": "test" if i % 2 else "sh", "cpus": 1, "duration": 1.0 + 0.01 * i,
         **({"elastic": GOOD["elastic"]} if i % 2 else {}), **({"traj": f"t{i % 3}"} if i < 9 else {})}
        for i in range(20)]
    # make the traj actions sequential: space them beyond the previous one's end
    for i, rec in enumerate(lines[1:10]):
        rec["arrival"] = (i // 3) * 5.0 + (i % 3) * 0.1
    p = _write(tmp_path / "t.jsonl", lines)
    wl = trace_workload(p)
    assert wl.n_actions == 20
    s = summarise(run_policy(wl, "tangram"))
    assert s["actions"] == 20


@pytest.mark.looptime
async def test_record_from_runtime_then_replay(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pool = Pool(cpus=4)
    path = tmp_path / "rec.jsonl"
    spec = ActionSpec(kind="test", cpus=1, elastic=Elasticity("cpu", 4, Amdahl(0.9)), container="sb1")
    with TraceRecorder(path, pool=pool) as rec:
        async with Tangram(pool, observers=[rec]) as tangram:
            for _ in range(3):
                async with tangram.acquire(spec) as lease:
                    await asyncio.sleep(2.0 * spec.relative_duration(lease.units))
                await asyncio.sleep(0.5)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert "pool" in rows[0] and len(rows) == 4
    assert rows[1]["duration"] == pytest.approx(2.0) and rows[1]["traj"] == "sb1" and rows[1]["units"] == 4
    wl = trace_workload(path)
    assert wl.n_actions == 3 and len(wl.trajectories) == 1
    assert [a.think for a in wl.trajectories[0].acts] == pytest.approx([0.0, 0.5, 0.5])
    r = run_policy(wl, "fifo1")
    assert [round(e - s, 6) for s, e in zip(r.submit, r.end)] == pytest.approx([2.02] * 3)


async def test_a_recorded_group_is_the_trajectory_when_no_container_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the adapters name the trajectory with group=; recorded without it, 3 trajectories x 3 actions
    # replayed as 9 one-action trajectories (not closed-loop any more)
    pool = Pool(cpus=4)
    path = tmp_path / "rec.jsonl"
    with TraceRecorder(path, pool=pool) as rec:
        async with Tangram(pool, observers=[rec]) as tangram:

            async def trajectory(name: str) -> None:
                for _ in range(3):
                    async with tangram.acquire(ActionSpec(kind="tool", cpus=1, group=name)):
                        await asyncio.sleep(0.5)

            await asyncio.gather(*(trajectory(f"traj-{i}") for i in range(3)))
    wl = trace_workload(path)
    assert wl.n_actions == 9 and len(wl.trajectories) == 3
    assert sorted(len(t.acts) for t in wl.trajectories) == [3, 3, 3]


def test_cli_compare_json_and_plot(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "o.json"
    plots = tmp_path / "plots"
    rc = cli_main(["simulate", "--workload", "ai-coding", "--batch", "12", "--nodes", "1", "--cores", "24",
                   "--policy", "all", "--json", str(out), "--plot", str(plots), "--sweep-batch", "6,12",
                   "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    for pol in ("tangram", "static", "fifo4", "fifo16"):
        assert pol in text
    data = json.loads(out.read_text())
    assert {r["policy"] for r in data["runs"]} == {"tangram", "static", "fifo1", "fifo4", "fifo16"}
    assert len(data["sweep"]) == 10
    assert (plots / "act-cdf.png").stat().st_size > 1000 and (plots / "sweep.png").stat().st_size > 1000
    assert "  batch  " in text.splitlines()[1]  # the table (and the sweep's) says which batch each row is
    assert "-0.000" not in text


def test_cli_gpus_needed_and_progress(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    args = ["simulate", "--workload", "mopd", "--batch", "16", "--gpus", "12", "--iso-gpus", "1",
            "--policy", "tangram,isolated"]
    rc = cli_main([*args, "--gpus-needed"])
    assert rc == 0
    cap = capsys.readouterr()
    assert "GPUs needed vs isolated" in cap.out and "ACT +10%" in cap.out
    # stderr is not a terminal here: one line per run, no \r redraws in a log
    n = mopd(16, gpus=12).n_actions
    assert "\r" not in cap.err and f"mopd  tangram b=16: {n} actions simulated in" in cap.err
    assert f"mopd isolated b=16: {n} actions simulated in" in cap.err

    class Tty:  # a terminal: the redrawn bar
        def __init__(self) -> None:
            self.text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr("sys.stderr", tty)
    assert cli_main(args) == 0
    assert "\r" in tty.text and "100%" in tty.text


def test_cli_bad_policy_and_trace(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli_main(["simulate", "--workload", "ai-coding", "--batch", "2", "--nodes", "1", "--cores", "8",
                     "--policy", "isolated", "--no-progress"]) == 2
    bad = _write(tmp_path / "b.jsonl", [{"pool": {"cpus": 2}}, {"arrival": 0, "kind": "x"}])
    assert cli_main(["simulate", "--workload", "trace", "--trace", str(bad), "--no-progress"]) == 2
    assert "line 2: missing field 'duration'" in capsys.readouterr().err


def test_replay_times_are_relative_to_the_first_action(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A trace whose clock starts far from 0 (seconds since boot, as loop.time() is) replays as if
    it started at 0: step time and utilisation are about the actions, not the machine's uptime."""
    lines = [{"pool": {"cpus": 2}}] + [
        {"arrival": 5000.0 + 0.3 * i, "kind": "x", "cpus": 1, "duration": 0.25, "traj": f"t{i % 2}"}
        for i in range(8)]
    s = summarise(run_policy(trace_workload(_write(tmp_path / "t.jsonl", lines)), "fifo1"))
    assert s["step_s"] < 5.0, s["step_s"]
    assert s["cpu_util"] > 0.2, s["cpu_util"]


async def test_recorded_live_run_replays_to_the_same_step_time(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Record a live run (real clock, real Tangram) and replay it: the simulated RL step (first
    arrival to last completion) is within 5 % of the step measured live."""
    pool = Pool(cpus=4)
    path = tmp_path / "live.jsonl"
    loop = asyncio.get_running_loop()
    # long enough that the 20 ms per-grant cost the replay charges (see docs/simulator.md) stays ~2 %
    works = [[0.9, 0.6, 1.0], [0.7, 1.0, 0.8]]
    submitted: list[float] = []
    released: list[float] = []

    async def trajectory(i: int) -> None:
        spec = ActionSpec(kind="test", cpus=1, elastic=Elasticity("cpu", 2, Amdahl(0.9)), container=f"sb{i}")
        await asyncio.sleep(0.15 * i)  # staggered starts: each trajectory's offset must survive
        for w in works[i]:
            submitted.append(loop.time())
            async with tangram.acquire(spec) as lease:
                await asyncio.sleep(w * spec.relative_duration(lease.units))
            released.append(loop.time())
            await asyncio.sleep(0.2)  # "thinking"

    with TraceRecorder(path, pool=pool) as rec:
        async with Tangram(pool, observers=[rec]) as tangram:
            await asyncio.gather(*(trajectory(i) for i in range(len(works))))
    live_step = max(released) - min(submitted)
    rows = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    assert min(r["arrival"] for r in rows) == 0.0  # recorded relative to the first action
    assert max(r["end"] for r in rows) == pytest.approx(live_step, abs=0.01)
    replay = summarise(run_policy(trace_workload(path), "tangram"))
    assert replay["actions"] == 6
    assert replay["step_s"] == pytest.approx(live_step, rel=0.05), (replay["step_s"], live_step)


# --------------------------------------------------------------------- stop 36: a user's audit
def test_gpus_or_cpus_resize_one_dimension_of_a_traces_pool(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`--gpus 16` on a recorded deepsearch trace replaced its whole pool: its search quota was
    gone ("unknown quota 'search'"), and `--cpus` replaced a recorded pool the help said it only
    filled in. Now each flag resizes its own dimension and the rest stays as recorded."""
    lines = [{"pool": {"cpus": 4, "gpus": 2, "quotas": {"search": {"concurrency": 3}}}},
             {"arrival": 0.0, "kind": "search", "quotas": {"search": 1}, "duration": 1.0, "traj": "a"},
             {"arrival": 0.0, "kind": "judge", "gpus": 1, "duration": 1.0, "traj": "b"},
             {"arrival": 0.0, "kind": "tool", "cpus": 1, "duration": 1.0, "traj": "c"}]
    p = _write(tmp_path / "t.jsonl", lines)
    wl = trace_workload(p, gpus=16)
    assert len(wl.pool.gpus) == 16 and len(wl.pool.cpus) == 4 and dict(wl.pool.quotas)["search"].concurrency == 3
    wl = trace_workload(p, cpus=8)
    assert len(wl.pool.cpus) == 8 and len(wl.pool.gpus) == 2 and "search" in dict(wl.pool.quotas)
    rc = cli_main(["simulate", "--workload", "trace", "--trace", str(p), "--gpus", "16", "--policy",
                   "tangram,fifo1,tangram", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "pool 4 cpus / 16 gpus" in out and "seed" not in out.splitlines()[0]
    assert sum(1 for x in out.splitlines() if x.split()[:1] == ["tangram"]) == 1  # a policy listed twice runs once
    _write(tmp_path / "u.jsonl", [{"pool": {"cpus": 4, "gpu": 2}}, lines[3]])
    with pytest.raises(TraceError, match=r"field 'pool' has unknown key\(s\) \['gpu'\]"):
        load_trace(tmp_path / "u.jsonl")


def test_a_recorder_under_static_is_refused_not_a_trace_of_sandboxes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Under trajectory-static, actions run inside held sandboxes: the recorder wrote 48 sandbox
    lines for 2078 actions, and their replay was another workload (ACT 253 s vs 4.7 s)."""
    from tangram_sdk.sim.workloads import ai_coding

    wl = ai_coding(6, nodes=1, cores=32, seed=0)
    with TraceRecorder(tmp_path / "s.jsonl") as rec, pytest.raises(ValueError, match="record under tangram"):
        run_policy(wl, "static", observers=[rec])
    with TraceRecorder(tmp_path / "f.jsonl") as rec:
        run_policy(wl, "fifo4", observers=[rec])
    assert rec.lines == wl.n_actions


def test_a_recorded_restore_is_overhead_not_scaled_work(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A cold TP-2 teacher call (1.5 s restore + 0.34 s of work) was written as 3.07 s of 1-GPU
    work: the restore folded into the duration and scaled by the efficiency model. Now the
    restore the manager reported is the line's overhead and only the work is scaled back."""
    wl = mopd(16, gpus=6, seed=0, calls_min=2, calls_max=3)
    path = tmp_path / "m.jsonl"
    with TraceRecorder(path, pool=wl.pool) as rec:
        res = run_policy(wl, "tangram", observers=[rec])
    rows = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    assert res.restores > 0 and any("overhead" in r for r in rows)
    truth = sorted(a.work for t in wl.trajectories for a in t.acts)
    got = sorted(r["duration"] for r in rows)
    assert got == pytest.approx(truth, rel=1e-3, abs=2e-3)  # the 1-GPU work, whatever the width and restores
    over = [r["overhead"] for r in rows if "overhead" in r]
    assert all(0 < o <= wl.restore_s["teacher0"] + 1e-6 for o in over)


def test_isolated_slices_count_as_allocated_for_the_whole_step() -> None:
    """Isolated servers hold their GPUs idle or not; the simulator counted them only while a call
    ran, so isolated's GPU-seconds looked smaller than Tangram's."""
    wl = mopd(32, gpus=10, seed=0)
    iso = summarise(run_policy(wl, "isolated", iso_gpus=1))
    tg = summarise(run_policy(wl, "tangram"))
    assert iso["pool_gpus"] == 9 and iso["gpu_alloc_mean"] == pytest.approx(9.0)
    assert iso["gpu_busy_mean"] < iso["gpu_alloc_mean"] / 10
    assert tg["gpu_alloc_mean"] == pytest.approx(tg["gpu_busy_mean"]) and tg["gpu_s"] < iso["gpu_s"] / 10


def test_cli_json_says_what_ran_not_the_defaults(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """With `--gpus 10 --iso-gpus 1` the JSON said iso_gpus 4, nodes 5 x 8 GPUs (the defaults)."""
    out = tmp_path / "o.json"
    rc = cli_main(["simulate", "--workload", "mopd", "--batch", "8", "--gpus", "10", "--iso-gpus", "1",
                   "--policy", "tangram,isolated", "--json", str(out), "--no-progress"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["params"]["iso_gpus"] == 1 and "nodes" not in data["params"]
    assert data["pool"] == {"cpus": 0, "gpus": 10, "numa_nodes": 1}
    assert data["options"]["gpus"] == 10 and data["options"]["policy"] == "tangram,isolated"
    assert {r["policy"]: r["pool_gpus"] for r in data["runs"]} == {"tangram": 10, "isolated": 9}


def test_a_replay_pays_recorded_restores_only_where_its_policy_restores(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Recorded restores were replayed as every call's fixed overhead, isolated's too (its servers
    keep their models resident). Now they are each service's restore time for the simulator's
    residency model."""
    wl = mopd(16, gpus=6, seed=0, calls_min=2, calls_max=3)
    path = tmp_path / "m.jsonl"
    with TraceRecorder(path, pool=wl.pool) as rec:
        run_policy(wl, "tangram", observers=[rec])
    replay = trace_workload(path, gpus=12)  # room for an isolated slice per service
    assert set(replay.restore_s) <= set(wl.services) and replay.restore_s
    assert all(0 < v <= wl.restore_s["teacher0"] + 1e-6 for v in replay.restore_s.values())
    assert all(a.overhead == 0.0 for t in replay.trajectories for a in t.acts)
    iso = summarise(run_policy(replay, "isolated", iso_gpus=None))
    assert iso["overhead_mean_s"] == 0.0 and iso["restores"] == 0
    same = summarise(run_policy(trace_workload(path), "tangram"))  # the recorded pool: it restores again
    assert same["restores"] > 0 and same["overhead_mean_s"] > 0
