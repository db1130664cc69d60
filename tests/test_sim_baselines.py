"""The simulator's fixed baselines as a user would run them instead of Tangram, with their real
failure modes as options (sim/baselines.py): sandbox creation limits, per-process quota
semaphores, batching model servers, TP and proportional slices for the isolated servers; and the
CLI that expresses them (``--param``, ``--iso-gpus share``)."""

from __future__ import annotations

import json

import pytest

from tangram_sdk.cli import main as cli_main
from tangram_sdk.sim.metrics import summarise
from tangram_sdk.sim.workloads import ai_coding, deepsearch, mopd, run_policy


def test_sandbox_creation_rate_and_load_dependent_startup_slow_static_only() -> None:
    """64 trajectories open their sandboxes at once: at 4 creations/s the last waits ~16 s, and
    each start-up grows with the creations in flight; Tangram creates none and is unchanged."""
    free = ai_coding(64, nodes=1, seed=0)
    limited = ai_coding(64, nodes=1, seed=0, sandbox_rate=4.0, sandbox_startup_per_inflight=0.05)
    s0, s1 = (summarise(run_policy(w, "static")) for w in (free, limited))
    assert s0["queue_mean_s"] < 0.01 < 0.1 < s1["queue_mean_s"]  # waits for a creation slot
    r1 = run_policy(limited, "static")
    assert max(r1.overhead) > 2.0 + 0.05 * 10  # start-up grew with the creations in flight
    assert s1["step_s"] > s0["step_s"]
    t0, t1 = (summarise(run_policy(w, "tangram"))["act_mean_s"] for w in (free, limited))
    assert t0 == t1


def test_per_process_search_semaphores_lose_to_one_quota() -> None:
    """8 rollout processes each guarding 1/8 of the search quota cannot lend each other their idle
    share: the fixed policy's search calls queue longer than under one global quota, Tangram's
    (one quota for the pool) do not change."""
    one = deepsearch(256, seed=0, search_concurrency=16, search_rate=8.0, search_procs=1)
    eight = deepsearch(256, seed=0, search_concurrency=16, search_rate=8.0, search_procs=8)
    f1, f8 = (summarise(run_policy(w, "fifo1")) for w in (one, eight))
    assert f8["queue_mean_s"] > 1.1 * f1["queue_mean_s"]
    t1, t8 = (summarise(run_policy(w, "tangram")) for w in (one, eight))
    assert t1["act_mean_s"] == t8["act_mean_s"]


def test_batching_isolated_server_serves_a_saturated_judge_faster_on_the_same_gpus() -> None:
    """SGLang-style batching (a batch of n costs 1 + 0.5 (n - 1) calls) on a saturated judge:
    queueing drops, and the run still reports 8 physical GPUs, not 8 x batch slots."""
    plain = deepsearch(512, seed=0, judge_work_mean=6.0, iso_batch=1)
    batched = deepsearch(512, seed=0, judge_work_mean=6.0, iso_batch=4, iso_batch_cost=0.5)
    a, b = (summarise(run_policy(w, "isolated")) for w in (plain, batched))
    assert b["queue_mean_s"] < 0.5 * a["queue_mean_s"]
    assert a["pool_gpus"] == b["pool_gpus"] == 8
    assert b["gpu_busy_mean"] <= 8.0 + 1e-9


def test_isolated_servers_can_run_tensor_parallel() -> None:
    """``iso_tp=4``: each teacher's 4 GPUs serve TP-4 calls (faster, as a TP-4 SGLang server
    would), the strongest isolated baseline for MOPD's light load."""
    tp1 = summarise(run_policy(mopd(128, seed=0), "isolated", iso_gpus=4))
    tp4 = summarise(run_policy(mopd(128, seed=0, iso_tp=4), "isolated", iso_gpus=4))
    assert tp4["exec_mean_s"] < 0.6 * tp1["exec_mean_s"]
    assert tp1["pool_gpus"] == tp4["pool_gpus"] == 36


def test_cli_iso_gpus_share_holds_the_whole_pool(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--gpus 10 --iso-gpus 1`` is 9 one-GPU slices (9 GPUs held); ``--iso-gpus share`` splits
    all 10 by call share (the hottest teacher gets 2)."""
    out = {}
    for iso in ("1", "share"):
        path = tmp_path / f"{iso}.json"
        rc = cli_main(["simulate", "--workload", "mopd", "--batch", "32", "--gpus", "10", "--iso-gpus", iso,
                       "--policy", "isolated", "--no-progress", "--json", str(path)])
        assert rc == 0
        out[iso] = json.loads(path.read_text())["runs"][0]["pool_gpus"]
    assert out == {"1": 9, "share": 10}
    capsys.readouterr()


def test_cli_param_overrides_a_workload_parameter_and_rejects_bad_ones(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = ["simulate", "--workload", "mopd", "--batch", "16", "--gpus", "8", "--policy", "fifo1", "--no-progress"]
    path = tmp_path / "p.json"
    assert cli_main([*base, "--param", "work_mean=2.0", "--json", str(path)]) == 0
    slow = json.loads(path.read_text())["runs"][0]["exec_mean_s"]
    assert cli_main([*base, "--json", str(path)]) == 0
    assert slow > 2.0 * json.loads(path.read_text())["runs"][0]["exec_mean_s"]
    capsys.readouterr()
    for bad, needle in ((["--param", "nope=1"], "has no parameter 'nope'"),
                        (["--param", "work_mean=fast"], "expected a number"),
                        (["--param", "work_mean"], "expected NAME=VALUE")):
        try:  # argparse's type errors exit; the workload check returns 2
            rc = cli_main([*base, *bad])
        except SystemExit as exc:
            rc = exc.code  # type: ignore[assignment]
        assert rc == 2
        assert needle in capsys.readouterr().err


def test_a_misspelt_workload_parameter_is_an_error_naming_it() -> None:
    # test_max_cpu=32 (for test_max_cpus) used to run the defaults without a word
    from tangram_sdk import SpecError
    from tangram_sdk.sim.workloads import ai_coding, deepsearch, mopd

    with pytest.raises(SpecError, match=r"ai_coding: unknown parameter\(s\) \['test_max_cpu'\]"):
        ai_coding(4, nodes=1, cores=8, test_max_cpu=32)
    with pytest.raises(SpecError, match="deepsearch: unknown"):
        deepsearch(4, judge_work=1.0)
    with pytest.raises(SpecError, match="mopd: unknown"):
        mopd(4, teacher=3)
    assert ai_coding(4, nodes=1, cores=8, test_max_cpus=32).params["test_max_cpus"] == 32
