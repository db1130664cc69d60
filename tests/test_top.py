"""``tangram top`` watching live pools, driven in a pseudo-terminal as a person would.

The Prometheus target is a real Tangram in another process (2 cores, 2 "GPUs" that are torch CPU
devices with room for one model each, three reward models) serving PrometheusMetrics over HTTP,
with more test actions than cores so a queue forms and services are restored and evicted. The
Ray target is a deployed job-wide pool with leases held by a client.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="the prometheus extra is not installed")

SERVE = r"""
import asyncio, os, sys
import prometheus_client as pc
from tangram_sdk import ActionSpec, Pool, Tangram
from tangram_sdk.observe import PrometheusMetrics

try:
    import torch
except ImportError:
    torch = None

def build(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

async def main():
    cores = sorted(os.sched_getaffinity(0))[:2]
    registry = pc.CollectorRegistry()
    prom = PrometheusMetrics(registry=registry)
    managers, gpus = [], 0
    if torch is not None:
        from tangram_sdk import TorchGpuManager
        mb = sum(p.numel() * p.element_size() for p in build(0).parameters())
        gpu = TorchGpuManager(devices={0: "cpu", 1: "cpu"}, memory_budget=int(mb * 1.5))
        for i, name in enumerate(("rm-a", "rm-b", "rm-c")):
            gpu.register(name, factory=lambda i=i: build(i))
        managers, gpus = [gpu], 2
    async with Tangram(Pool(cpus=cores, gpus=gpus), managers=managers, observers=[prom]) as t:
        prom.bind(t)
        server, _thread = pc.start_http_server(0, addr="127.0.0.1", registry=registry)
        print(server.server_port, flush=True)

        async def tests():
            while True:
                async with t.acquire(ActionSpec(kind="test", cpus=1)):
                    await asyncio.sleep(0.4)

        async def scores():
            x = torch.randn(4, 64)
            while True:
                for name in ("rm-a", "rm-b", "rm-c"):
                    async with t.acquire(ActionSpec(kind="score", gpus=1, service=name)) as lease:
                        await lease.call(x)
                    await asyncio.sleep(0.05)

        work = [tests() for _ in range(5)] + ([scores(), scores()] if torch is not None else [])
        await asyncio.gather(*work)

asyncio.run(main())
"""

HAS_TORCH = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        assert line.strip().isdigit(), f"the live pool did not start: {line!r} {proc.stderr.read()[-2000:] if proc.poll() is not None else ''}"  # type: ignore[union-attr]
        time.sleep(1.5)  # let a queue form and a few actions complete
        yield f"http://127.0.0.1:{line.strip()}/metrics"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _top_in_pty(args: list[str], *, frames: int, timeout: float = 60) -> tuple[int, str]:
    """Run ``tangram top`` on a pseudo-terminal; after ``frames`` complete redraws press Ctrl-C."""
    pid, fd = pty.fork()
    if pid == 0:  # child: the pty is its controlling terminal
        os.execv(sys.executable, [sys.executable, "-m", "tangram_sdk", "top", *args])
    out = b""
    deadline = time.monotonic() + timeout
    sent = False
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 0.5)
            if r:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            # `frames` redraws complete: the next one has begun (a read can end mid-frame)
            if not sent and out.count(b"\x1b[H\x1b[2J") > frames:
                os.write(fd, b"\x03")  # Ctrl-C, through the terminal's line discipline
                sent = True
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace")


def _row(frame: str, name: str) -> list[str]:
    for line in frame.splitlines():
        if line.split()[:1] == [name]:
            return line.split()
    raise AssertionError(f"no row {name!r} in:\n{frame}")


def test_top_refreshes_a_live_pool_in_a_terminal(endpoint: str) -> None:
    code, out = _top_in_pty(["--prometheus", endpoint, "--interval", "0.4"], frames=4)
    assert code == 0, out[-3000:]  # Ctrl-C ends it cleanly
    assert "Traceback" not in out
    frames = [f for f in out.split("\x1b[H\x1b[2J") if f.strip()][:-1]  # the last may be cut by Ctrl-C
    assert len(frames) >= 4, out[-3000:]
    last = frames[-1].replace("\r\n", "\n")
    # per-resource allocated vs busy: both cores held (5 test loops on 2 cores), busy measured by the OS
    cpus = _row(last, "cpus")
    assert cpus[1:2] == ["2"] and cpus[3:4] == ["2"], last
    assert float(cpus[2]) >= 0.0
    # queue length and oldest wait per action kind: the test actions queue behind the cores
    test = _row(last, "test")
    assert int(float(test[1])) >= 1 and int(float(test[2])) == 2 and float(test[3]) > 0.0, last
    # ACT split into queue / overhead / execution, all numbers
    m = re.search(r"ACT \(action completion time.*?\): ([0-9.]+) = queue ([0-9.]+) \+ overhead ([0-9.]+) "
                  r"\+ execution ([0-9.]+)", last)
    assert m, last
    total, parts = float(m.group(1)), [float(x) for x in m.groups()[1:]]
    assert total > 0 and abs(sum(parts) - total) < 0.002, last
    # it really refreshes: the completed count grows between the first and the last frame
    done = [int(float(x)) for f in frames for x in re.findall(r"completed ([0-9.]+)", f)]
    assert done[-1] > done[0], done
    if HAS_TORCH:  # restores and evictions per service (one model fits per device, three take turns)
        for svc in ("rm-a", "rm-b", "rm-c"):
            row = _row(last, svc)
            assert int(float(row[1])) >= 1 and int(float(row[2])) >= 1, last
        gpus = _row(last, "gpus")
        assert gpus[3] == "2" and 0 <= int(gpus[1]) <= 2, last  # calls come and go: any of 0..2 held


def test_top_without_a_terminal_prints_one_block_per_refresh(endpoint: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "tangram_sdk", "top", "--prometheus", endpoint,
                           "--interval", "0.2", "--iterations", "2"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\r" not in proc.stdout
    assert proc.stdout.count("tangram top - ") == 2


def test_top_on_an_unreachable_endpoint_says_so_in_one_line() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "tangram_sdk", "top", "--prometheus", f"127.0.0.1:{port}/metrics",
                           "--once"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "cannot read" in err, err


# ------------------------------------------------------------------------------------------- Ray
@pytest.mark.ray
@pytest.mark.timeout(180)
def test_top_attaches_to_the_job_wide_ray_pool(tmp_path: Any) -> None:
    if os.environ.get("CI") == "true":
        import ray
    else:
        ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    from tangram_sdk import ActionSpec, Pool
    from tangram_sdk.ray import RemoteTangram, deploy

    ns = "tangram-top-test"
    ctx = ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024, namespace=ns,
                   log_to_driver=False)
    try:
        cluster = deploy("watched", namespace=ns, pool=Pool(cpus=3))
        import asyncio

        async def hold_and_watch() -> tuple[int, str]:
            async with RemoteTangram("watched", namespace=ns) as rt:
                async with rt.acquire(ActionSpec(kind="test", cpus=2)):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(None, lambda: _top_in_pty(
                        ["--ray", "watched", "--namespace", ns, "--address", ctx.address_info["gcs_address"],
                         "--interval", "0.5"], frames=2, timeout=120))

        code, out = asyncio.run(hold_and_watch())
        cluster.shutdown()
    finally:
        ray.shutdown()
    assert code == 0, out[-3000:]
    frames = [f for f in out.split("\x1b[H\x1b[2J") if f.strip()][:-1]  # the last may be cut by Ctrl-C
    last = frames[-1].replace("\r\n", "\n")
    row = next(line.split() for line in last.splitlines() if line.strip().endswith("]") and "/cpus" in line)
    assert row[1:2] == ["2"] and row[3:4] == ["3"], last  # 2 of 3 cores allocated to the held lease
    assert "not exposed" in last or "has no per-kind" in last, last  # the gap is said, not hidden


def test_prometheus_urls_and_label_values_read_as_written() -> None:
    """An IPv6 endpoint was refused as "not a URL", and label values were decoded as Latin-1
    ("café" came out "cafÃ©"); the exposition format escapes only backslash, quote and newline."""
    import argparse

    from tangram_sdk import top

    def url(text: str) -> str | None:
        args = argparse.Namespace(prometheus=text, ray=None, namespace="tangram", address="auto", once=False)
        return top.check(args) or args.prometheus

    assert url("http://[::1]:9100/metrics") == "http://[::1]:9100/metrics"
    assert url("[::1]:9100") == "http://[::1]:9100"
    assert url("http://[::1]/metrics") == "http://[::1]/metrics"
    assert "port must be 1..65535, got 70000" in (url("localhost:70000") or "")
    assert "expected a URL" in (url("http://a b") or "")
    parsed = top.parse_prometheus('tangram_x{kind="café",q="a\\\\b \\"c\\" d\\ne"} 3\n')
    assert parsed["tangram_x"] == [({"kind": "café", "q": 'a\\b "c" d\ne'}, 3.0)]
