"""Bad command-line input is refused before anything runs: exit status 2, one line on stderr, no
traceback, nothing on stdout (no table, no half run). Every case the first-hour issue listed is here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tangram_sdk.cli import main

SMALL = ["--batch", "4", "--nodes", "1", "--cores", "8", "--no-progress"]


def _cases(tmp: Path) -> list[tuple[list[str], str]]:
    bad_trace = tmp / "bad.jsonl"
    bad_trace.write_text(json.dumps({"pool": {"cpus": 2}}) + "\n" + json.dumps({"arrival": 0, "kind": "x"}) + "\n")
    no_pool = tmp / "nopool.jsonl"
    no_pool.write_text(json.dumps({"arrival": 0, "kind": "x", "cpus": 1, "duration": 1}) + "\n")
    big = tmp / "big.jsonl"  # a 4-core action in a 2-core pool: every policy would stop at it mid-run
    big.write_text(json.dumps({"pool": {"cpus": 2}}) + "\n"
                   + json.dumps({"arrival": 0, "kind": "x", "cpus": 4, "duration": 1}) + "\n")
    small = tmp / "small.jsonl"  # fits a 2-core pool, but a static sandbox (3 cores) does not
    small.write_text(json.dumps({"pool": {"cpus": 2}}) + "\n"
                     + json.dumps({"arrival": 0, "kind": "x", "cpus": 1, "duration": 1}) + "\n")
    a_file = tmp / "file.txt"
    a_file.write_text("x")
    missing = tmp / "missing"
    return [
        # counts > 0
        (["simulate", "--batch", "-5"], "argument --batch: must be an integer > 0, got '-5'"),
        (["simulate", "--batch", "0"], "argument --batch: must be an integer > 0"),
        (["simulate", "--batch", "many"], "argument --batch: expected an integer, got 'many'"),
        (["simulate", "--nodes", "0"], "argument --nodes: must be an integer > 0"),
        (["simulate", "--cores", "-1"], "argument --cores: must be an integer > 0"),
        (["simulate", "--workload", "mopd", "--gpus", "0"], "argument --gpus: must be an integer > 0"),
        (["simulate", "--workload", "mopd", "--iso-gpus", "0"], "argument --iso-gpus: must be an integer > 0"),
        (["simulate", "--seed", "-1"], "argument --seed: must be an integer >= 0"),
        (["simulate", "--sweep-batch", "a,b"], "argument --sweep-batch: expected a comma list of integers > 0, got 'a'"),
        (["simulate", "--sweep-batch", "256,0"], "argument --sweep-batch: expected a comma list of integers > 0, got '0'"),
        (["simulate", "--sweep-batch", ","], "argument --sweep-batch: expected a comma list"),
        # files exist and parse
        (["simulate", "--workload", "trace", "--trace", str(missing / "t.jsonl")], "argument --trace: no such file"),
        (["simulate", "--workload", "trace", "--trace", str(tmp)], "is a directory, not a file"),
        (["simulate", "--workload", "trace", "--trace", str(bad_trace)], "line 2: missing field 'duration'"),
        (["simulate", "--workload", "trace", "--trace", str(no_pool)], "no pool"),
        # output directories exist
        (["simulate", *SMALL, "--json", str(missing / "o.json")], "argument --json: directory"),
        (["simulate", *SMALL, "--json", str(tmp)], "argument --json: "),
        (["simulate", *SMALL, "--plot", str(missing / "deeper")], "argument --plot: neither"),
        (["simulate", *SMALL, "--plot", str(a_file)], "argument --plot: "),
        (["simulate", *SMALL, "--plot", str(tmp / "out.png")], "--plot takes a directory"),
        # options that need another option
        (["simulate", "--trace", str(bad_trace)], "--trace needs --workload trace"),
        (["simulate", "--workload", "trace"], "--workload trace needs --trace PATH"),
        (["simulate", "--workload", "mopd", "--iso-gpus", "2"], "--iso-gpus needs the isolated policy"),
        (["simulate", "--workload", "mopd", "--nodes", "2"], "--nodes does not apply to --workload mopd"),
        (["simulate", "--gpus", "4"], "--gpus does not apply to --workload ai-coding"),
        (["simulate", "--cpus", "4"], "--cpus does not apply to --workload ai-coding"),
        (["simulate", "--workload", "trace", "--trace", str(no_pool), "--cpus", "2", "--batch", "3"],
         "--batch does not apply to --workload trace"),
        # policies the workload cannot run, found before the first policy runs
        (["simulate", "--policy", "fifo0"], "--policy: unknown policy 'fifo0'"),
        (["simulate", "--policy", "tangram,fastest"], "--policy: unknown policy 'fastest'"),
        (["simulate", *SMALL, "--policy", "tangram,isolated"], "--policy isolated needs GPU services"),
        (["simulate", *SMALL, "--gpus-needed"], "--gpus-needed compares with the isolated baseline"),
        (["simulate", "--workload", "mopd", "--batch", "8", "--gpus", "12", "--policy", "tangram,isolated"],
         "exceed the pool's 12"),
        (["simulate", "--workload", "fast"], "argument --workload: invalid choice: 'fast'"),
        (["simulate", "--policy", "tangram,all"], "'all' stands alone"),
        (["simulate", "--workload", "trace", "--trace", str(big), "--policy", "tangram,fifo1"],
         "--policy tangram: x actions can never run on this pool"),
        (["simulate", "--workload", "trace", "--trace", str(small), "--policy", "tangram,static"],
         "--policy static: its sandboxes can never run on this pool"),
        # workload parameters: checked by type, then built, before anything runs (stop 33: some
        # ended in a traceback, or after the first policies had run)
        (["simulate", *SMALL, "--param", "test_hint_sigma=abc"], "--param test_hint_sigma: expected a number or null"),
        (["simulate", *SMALL, "--policy", "tangram,static", "--param", "sandbox_rate=x"],
         "--param sandbox_rate: expected a number or null"),
        (["simulate", *SMALL, "--policy", "tangram,static", "--param", "sandbox_rate=-1"],
         "parameter sandbox_rate must be > 0, got -1"),
        (["simulate", *SMALL, "--policy", "static", "--param", "sandbox_cpus=0"], "parameter sandbox_cpus must be an integer >= 1, got 0"),
        (["simulate", *SMALL, "--param", "test_malleable=1"], "--param test_malleable: expected true or false"),
        (["simulate", *SMALL, "--param", "actions_min=10", "--param", "actions_max=5"],
         "--workload ai-coding with --param actions_min=10, actions_max=5: "),
        (["simulate", *SMALL, "--param", "test_frac=2"], "parameter test_frac must be in [0, 1], got 2"),
        (["simulate", "--workload", "mopd", "--batch", "4", "--param", "calls_min=0", "--param", "calls_max=0"],
         "mopd: parameter calls_min must be an integer >= 1, got 0"),
        # stop 36: values the model cannot take (a hang, ZeroDivisionErrors, NaN tables, ACT < exec)
        (["simulate", "--workload", "deepsearch", "--batch", "16", "--policy", "isolated", "--param", "iso_tp=-1"],
         "parameter iso_tp must be an integer >= 1, got -1"),
        (["simulate", *SMALL, "--param", "busy_frac=0"], "parameter busy_frac must be in (0, 1], got 0"),
        (["simulate", "--workload", "mopd", "--batch", "4", "--param", "decode_tok_s=0"],
         "parameter decode_tok_s must be > 0"),
        (["simulate", *SMALL, "--param", "test_worker_startup=1e308"], "must be a finite number of at most 1e+09"),
        (["simulate", *SMALL, "--param", "think_sigma=NaN"], "--param think_sigma: expected a finite number, got nan"),
        (["simulate", *SMALL, "--param", "test_work_mean=Infinity"], "--param test_work_mean: expected a finite number"),
        (["simulate", "--workload", "mopd", "--batch", "4", "--param", "restore_s=-1"],
         "parameter restore_s must be >= 0, got -1"),
        (["simulate", "--workload", "deepsearch", "--batch", "8", "--gpus-needed", "--param", "gpus=4"],
         "--param gpus: use --gpus"),
        (["simulate", "--workload", "mopd", "--batch", "8", "--policy", "isolated", "--param", "iso_gpus=-2"],
         "--param iso_gpus: use --iso-gpus"),
        (["simulate", *SMALL, "--param", "gpus=2"], "--param: ai-coding has no parameter 'gpus'"),
        # --gpus replaced nodes x gpus_per_node without a word
        (["simulate", "--workload", "mopd", "--batch", "8", "--gpus", "8", "--param", "nodes=2"],
         "--param nodes: --gpus sets the pool size; give the pool one way"),
        (["simulate", "--workload", "mopd", "--batch", "8", "--gpus-needed", "--param", "gpus_per_node=4"],
         "--param gpus_per_node: --gpus-needed sets the pool size"),
        (["simulate", "--workload", "trace", "--trace", str(small), "--seed", "7"],
         "--seed does not apply to --workload trace"),
        # demo
        (["demo", "--trajectories", "0"], "argument --trajectories: must be an integer > 0"),
        (["demo", "--actions", "0"], "argument --actions: must be an integer > 0"),
        (["demo", "--work", "-1"], "argument --work: must be a number > 0, got '-1'"),
        (["demo", "--work", "0"], "argument --work: must be a number > 0"),
        (["demo", "--think", "-0.5"], "argument --think: must be a number >= 0"),
        (["demo", "--think", "nan"], "argument --think: expected a finite number"),
        (["demo", "--seed", "x"], "argument --seed: expected an integer, got 'x'"),
        (["demo", "--cpus", "zero"], "argument --cpus: bad cpuset element 'zero'"),
        (["demo", "--cpus", "0-999"], "are not available to this process"),
        # top
        (["top"], "give a pool to watch: --prometheus URL or --ray NAME"),
        (["top", "--prometheus", "ftp://host/metrics"], "argument --prometheus: expected a URL"),
        (["top", "--prometheus", "http://host:99999/metrics"], "port must be 1..65535"),
        (["top", "--prometheus", "http://h:1/m", "--ray", "t"], "not allowed with argument"),
        (["top", "--prometheus", "http://h:1/m", "--namespace", "x"], "--namespace and --address need --ray NAME"),
        (["top", "--prometheus", "http://h:1/m", "--interval", "0"], "argument --interval: must be a number > 0"),
        (["top", "--prometheus", "http://h:1/m", "--iterations", "0"], "argument --iterations: must be an integer > 0"),
        (["top", "--ray", " "], "argument --ray: the pool's name is empty"),
        # the subcommand the help used to promise
        (["bench"], "invalid choice: 'bench'"),
        ([], "the following arguments are required"),
    ]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_every_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    failures = []
    for argv, needle in _cases(tmp_path):
        rc, out, err = _run(argv, capsys)
        lines = err.strip().splitlines()
        if rc != 2 or out or len(lines) != 1 or needle not in err or "Traceback" in err:
            failures.append(f"{argv}: rc={rc} out={out[:200]!r} err={err[-400:]!r} (wanted {needle!r})")
    assert not failures, "\n".join(failures)
    assert not list(tmp_path.glob("missing*")) and not (tmp_path / "out.png").exists()  # nothing written


@pytest.mark.parametrize(("argv", "module", "needle"), [
    (["simulate", *SMALL, "--plot", "PLOTDIR"], "matplotlib", "--plot needs matplotlib: pip install 'tangram-sdk[plot]'"),
    (["top", "--ray", "tangram"], "ray", "--ray needs ray: pip install 'tangram-sdk[ray]'"),
])
def test_options_needing_a_missing_package_say_which_extra(argv: list[str], module: str, needle: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import <module>` now fails, as if not installed
    argv = [str(tmp_path / "plots") if a == "PLOTDIR" else a for a in argv]
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and not out and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "plots").exists()


def test_the_console_command_prints_no_traceback(tmp_path: Path) -> None:
    """The installed entry point, as a user types it: the message and status reach the shell."""
    proc = subprocess.run([sys.executable, "-m", "tangram_sdk", "simulate", "--workload", "trace", "--trace",
                           str(tmp_path / "nope.jsonl")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"tangram simulate: error: argument --trace: no such file: '{tmp_path / 'nope.jsonl'}' "
        "(see 'tangram simulate --help')"]


def test_help_texts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--seed SEED random seed of the workload" in text
    assert "--no-progress print no progress on stderr" in text
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "bench" not in text and "top" in text and "simulate" in text


def test_good_input_still_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(x) for x in [
        {"pool": {"cpus": 2}}, {"arrival": 0, "kind": "x", "cpus": 1, "duration": 1.0, "traj": "a"},
        {"arrival": 2, "kind": "x", "cpus": 1, "duration": 1.0, "traj": "a"}]) + "\n")
    rc, out, err = _run(["simulate", "--workload", "trace", "--trace", str(trace), "--policy", "tangram,fifo1",
                         "--json", str(tmp_path / "o.json")], capsys)
    assert rc == 0, err
    assert "trace: 1 trajectories, 2 actions" in out and json.loads((tmp_path / "o.json").read_text())["runs"]
    assert "\r" not in err and "actions simulated in" in err  # not a terminal: a line per run


def test_a_column_that_does_not_apply_prints_a_dash(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["simulate", *SMALL, "--policy", "static"], capsys)
    assert rc == 0, err
    row = next(line for line in out.splitlines() if line.startswith("static"))
    assert row.split()[-2] == "-"  # ACT/tangram: no tangram row to compare with (was a blank cell)
