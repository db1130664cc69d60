"""Fixtures for tests that need a real Docker engine (imported by test modules, not a conftest).

The engine is started by ``scripts/docker-up.sh`` (CI runs it before pytest). When no daemon
answers, Docker tests are skipped with the reason — except under ``CI=true``, where they FAIL:
a CI run that silently skipped every Docker test would prove nothing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tangram_sdk.lease import Lease
from tangram_sdk.managers.base import ManagerContext
from tangram_sdk.managers.cpu import DockerCpuManager, SandboxPool
from tangram_sdk.pool import Pool
from tangram_sdk.scheduler.decisions import Grant
from tangram_sdk.spec import ActionSpec

__all__ = ["IMAGE", "docker_engine", "make_lease", "manager_factory", "sandboxes", "started_manager"]

IMAGE = os.environ.get("TANGRAM_TEST_IMAGE", "tangram-test:busybox")
HOST_CPUS = tuple(sorted(os.sched_getaffinity(0)))


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"Docker tests cannot run under CI=true: {reason} (run scripts/docker-up.sh first)")
    pytest.skip(f"no Docker engine: {reason} (run: bash scripts/docker-up.sh)")


async def _probe() -> str | None:
    from tangram_sdk.managers._docker import DockerClient

    client = DockerClient(api_timeout=10)
    try:
        await client.ping()
        try:
            await client._call("image inspect", None, lambda d: d.images.inspect(IMAGE))
        except Exception as exc:  # noqa: BLE001 - any failure means: skip/fail with the reason
            return f"image {IMAGE} missing ({exc})"
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means: skip/fail with the reason
        return str(exc)
    finally:
        await client.close()


@pytest.fixture(scope="session")
def docker_engine() -> str:
    """Session-wide check that a daemon answers and the test image exists; returns the image."""
    reason = asyncio.run(_probe())
    if reason is not None:
        _unavailable(reason)
    return IMAGE


def make_lease(action_id: int, container: str | None, cpus: tuple[int, ...]) -> tuple[Grant, Lease]:
    """A Grant and the Lease the runtime would build for it (the manager only reads spec + ids)."""
    spec = ActionSpec(kind="test", cpus=len(cpus), container=container)
    grant = Grant(action_id, cpus=cpus, units=0)
    lease = Lease(action_id, spec, cpus=cpus, gpus=(), units=0, memory=0, quotas=(), queued_s=0.0,
                  granted_at=0.0)
    return grant, lease


@pytest.fixture
async def manager_factory(docker_engine: str) -> AsyncIterator[Any]:
    """Build started managers on a pool of this host's cores; closes them all at teardown."""
    made: list[DockerCpuManager] = []

    async def build(backend: str = "auto", **kw: Any) -> DockerCpuManager:
        m = DockerCpuManager(backend=backend, **kw)  # type: ignore[arg-type]
        await m.start(ManagerContext(Pool(cpus=list(HOST_CPUS)), post=lambda e: None))
        made.append(m)
        return m

    yield build
    for m in made:
        await m.aclose()


@pytest.fixture(params=["api", "cgroup"])
async def started_manager(request: pytest.FixtureRequest, manager_factory: Any) -> DockerCpuManager:
    """One manager per backend: every test using it runs against both."""
    m: DockerCpuManager = await manager_factory(request.param)
    assert m.active_backend == request.param
    return m


@pytest.fixture
async def sandboxes(started_manager: DockerCpuManager, docker_engine: str) -> AsyncIterator[SandboxPool]:
    async with await SandboxPool.create(started_manager, image=docker_engine, count=2) as pool:
        yield pool
