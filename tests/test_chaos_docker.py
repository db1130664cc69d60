"""Chaos with a real Docker engine: the daemon stopped and restarted in the middle of a run, and a
sandbox removed from outside (``docker rm -f``) while an action holds it.

Why a private daemon: stopping *the* shared dockerd would kill every other test's containers
(without ``--live-restore`` a daemon stops its containers on shutdown) and races with anything else
using it. This module starts its own real ``dockerd`` (same binary, own socket, data-root, exec-root
and pidfile, ``--live-restore``), imports the busybox test image into it like
``scripts/docker-up.sh`` does, kills and restarts that daemon, and always stops it in a finally.
Under ``CI=true`` a missing ``dockerd`` is a failure, not a skip (tests/docker_fixtures.py rules).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from docker_fixtures import HOST_CPUS, IMAGE, _unavailable  # noqa: E402

from tangram_sdk import ActionSpec, Pool, Quota, Tangram  # noqa: E402
from tangram_sdk.errors import DockerError, TangramError  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

aiodocker = pytest.importorskip("aiodocker")
from tangram_sdk.managers.cpu import DockerCpuManager, SandboxPool  # noqa: E402


class PrivateDaemon:
    """A real dockerd on its own socket and state directories (root needed)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tgchaos-", dir="/tmp"))
        self.sock = self.dir / "docker.sock"
        self.url = f"unix://{self.sock}"
        self.log = self.dir / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _cli(self, *args: str, input: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["docker", "-H", self.url, *args], input=input, capture_output=True, timeout=timeout)

    def up(self, wait_s: float = 60) -> None:
        self.proc = subprocess.Popen(
            ["dockerd", "-H", self.url, "--data-root", str(self.dir / "data"), "--exec-root", str(self.dir / "exec"),
             "--pidfile", str(self.dir / "docker.pid"), "--iptables=false", "--ip6tables=false", "--bridge=none",
             "--live-restore"],
            stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"private dockerd exited: {self.log.read_text()[-2000:]}")
            if self.sock.exists() and self._cli("version", timeout=10).returncode == 0:
                return
            time.sleep(0.3)
        raise RuntimeError(f"private dockerd did not answer in {wait_s}s: {self.log.read_text()[-2000:]}")

    def down(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def import_image(self) -> None:
        bb = shutil.which("busybox") or "/bin/busybox"
        root = Path(tempfile.mkdtemp(prefix="rootfs-", dir=self.dir))
        for d in ("bin", "tmp", "proc", "sys", "dev", "etc"):
            (root / d).mkdir()
        shutil.copy(bb, root / "bin" / "busybox")
        applets = subprocess.run([str(root / "bin" / "busybox"), "--list"], capture_output=True, text=True).stdout.split()
        for a in applets:
            if a != "busybox":
                (root / "bin" / a).symlink_to("busybox")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
        r = self._cli("import", "--change", "ENV PATH=/bin", "--change", 'CMD ["/bin/sh"]', "-", IMAGE, input=tar)
        assert r.returncode == 0, r.stderr

    def rm_f(self, ref: str) -> None:
        r = self._cli("rm", "-f", ref)
        assert r.returncode == 0, r.stderr

    def cleanup(self) -> None:
        try:
            self.down()
        finally:
            for sub in ("exec", "data"):  # dockerd bind-mounts its state dirs onto themselves
                subprocess.run(["umount", "-l", str(self.dir / sub)], capture_output=True)
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon() -> Iterator[PrivateDaemon]:
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        _unavailable("dockerd/docker binaries not installed (scripts/docker-up.sh installs them)")
    if os.geteuid() != 0:
        _unavailable("a private dockerd needs root")
    d = PrivateDaemon()
    try:
        try:
            d.up()
            d.import_image()
        except Exception as exc:  # noqa: BLE001 - reported as skip / CI failure with the reason
            _unavailable(f"could not start a private dockerd: {exc}")
        yield d
    finally:
        d.cleanup()


@pytest.fixture
async def manager(daemon: PrivateDaemon) -> AsyncIterator[DockerCpuManager]:
    m = DockerCpuManager(backend="api", docker_url=daemon.url, api_timeout=5)
    yield m
    try:
        await m.aclose()
    except Exception:  # noqa: BLE001
        pass


def whole(t: Tangram) -> None:
    t.scheduler.check_invariants()
    st = t.statistics()
    assert st["running"] == 0 and st["queued"] == 0 and st["waiters"] == 0, st
    assert st["cpus_free"] == st["cpus_total"], st
    assert all(q["used"] == 0 for q in st["quotas"].values())


async def _sandbox_action(t: Tangram, box: str) -> str:
    async with t.acquire(ActionSpec(kind="test", cpus=1, container=box)) as lease:
        r = await lease.exec(["sh", "-c", "echo ok"], timeout=20)
        assert r.ok and r.stdout.strip() == b"ok", r
    return "ok"


async def _plain_action(t: Tangram) -> str:
    async with t.acquire(ActionSpec(kind="search", quotas={"api": 1})):
        await asyncio.sleep(0.001)
    return "ok"


async def _worker(t: Tangram, box: str, stop: asyncio.Event, log: list[tuple[float, str, str, BaseException | None]]
                  ) -> None:
    while not stop.is_set():
        try:
            log.append((time.monotonic(), box, await _sandbox_action(t, box), None))
        except DockerError as exc:
            log.append((time.monotonic(), box, "docker_error", exc))
            await asyncio.sleep(0.05)
        except TangramError as exc:
            log.append((time.monotonic(), box, type(exc).__name__, exc))
            await asyncio.sleep(0.05)


async def test_daemon_stopped_and_restarted_mid_run(daemon: PrivateDaemon, manager: DockerCpuManager) -> None:
    pool = Pool(cpus=list(HOST_CPUS), quotas={"api": Quota(concurrency=4)})
    async with Tangram(pool, managers=[manager]) as t:
        async with await SandboxPool.create(manager, image=IMAGE, count=3) as boxes:
            stop = asyncio.Event()
            log: list[tuple[float, str, str, BaseException | None]] = []
            workers = [asyncio.create_task(_worker(t, b.id, stop, log)) for b in boxes]
            await asyncio.sleep(2.0)
            healthy_before = Counter(r for _, _, r, _ in log)
            assert healthy_before["ok"] >= 3 and set(healthy_before) == {"ok"}, healthy_before
            # -- the daemon goes away (SIGTERM; --live-restore keeps the containers running) --
            t_down = time.monotonic()
            await asyncio.to_thread(daemon.down)
            plain = await asyncio.gather(*(_plain_action(t) for _ in range(200)))  # the rest carries on
            assert plain == ["ok"] * 200
            await asyncio.sleep(2.0)
            t_up = time.monotonic()
            await asyncio.to_thread(daemon.up)
            await asyncio.sleep(3.0)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*workers), 60)
            during = [(r, e) for ts, _, r, e in log if t_down + 0.5 < ts < t_up]
            after = [r for ts, _, r, _ in log if ts > t_up + 2.0]
            assert during and all(r == "docker_error" for r, _ in during), Counter(r for r, _ in during)
            for _, e in during:  # typed, and names the container it was about
                assert isinstance(e, DockerError) and e.resource in boxes.ids, (e, e.resource if e else None)
            assert after and all(r == "ok" for r in after), Counter(after)  # recovered, same sandboxes
            assert set(Counter(r for _, _, r, _ in log)) <= {"ok", "docker_error"}
            whole(t)
            assert manager.statistics()["granted"] == 0
            for b in boxes:  # parked again in Docker's record
                info = await manager.client.inspect(b.id)
                assert info.running and info.cpu_quota == manager.park_quota_us
        assert await manager.client.list_labeled() == []  # the pool removed what it created


async def test_sandbox_removed_from_outside_while_held(daemon: PrivateDaemon, manager: DockerCpuManager) -> None:
    pool = Pool(cpus=list(HOST_CPUS), quotas={"api": Quota(concurrency=4)})
    async with Tangram(pool, managers=[manager]) as t:
        async with await SandboxPool.create(manager, image=IMAGE, count=3) as boxes:
            victim, others = boxes[0].id, [b.id for b in boxes][1:]
            holding = asyncio.Event()

            async def doomed() -> None:
                async with t.acquire(ActionSpec(kind="test", cpus=1, container=victim)) as lease:
                    holding.set()
                    await lease.exec(["sleep", "30"], timeout=60)  # removed underneath this exec

            task = asyncio.create_task(doomed())
            await holding.wait()
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            await asyncio.to_thread(daemon.rm_f, victim)
            await asyncio.wait([task], timeout=30)
            assert task.done(), "the exec in a removed container never returned"
            exc = task.exception()
            assert time.monotonic() - t0 < 30
            # the exec either reports the killed process or a typed error naming the container
            if exc is not None:
                assert isinstance(exc, DockerError) and victim[:12] in str(exc) + str(exc.resource), exc
            # others carry on while the victim is gone
            res = await asyncio.gather(*(_sandbox_action(t, b) for b in others for _ in range(3)))
            assert res == ["ok"] * 6
            # the removed container: a typed error naming it, and the unit comes back at once
            with pytest.raises(DockerError) as ei:
                await _sandbox_action(t, victim)
            assert victim[:12] in str(ei.value) or ei.value.resource == victim
            whole(t)
            assert manager.statistics()["granted"] == 0
        assert await manager.client.list_labeled() == []
