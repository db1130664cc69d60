"""Shared test configuration.

Under CI=true a skipped Docker (or Ray) test is a failure: the test command starts those components
itself, so a skip there means the real thing was never exercised.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # helper modules next to the tests

_MUST_RUN_IN_CI = ("docker", "ray")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and any(m in item.keywords for m in _MUST_RUN_IN_CI):
        report.outcome = "failed"
        report.longrepr = f"CI=true: a {'/'.join(m for m in _MUST_RUN_IN_CI if m in item.keywords)} test was skipped ({report.longrepr})"


# ------------------------------------------------------------------------------ shared fixtures
@pytest.fixture
async def tangram() -> Any:
    """A small pool (2 cores, one ``search`` quota of concurrency 1), installed as the adapters'
    default for the test (``using``): what the integration tests run their tools against."""
    from tangram_sdk import Pool, Quota, Tangram
    from tangram_sdk.integrations import using

    async with Tangram(Pool(cpus=2, quotas={"search": Quota(concurrency=1)})) as t:
        with using(t):
            yield t


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], Any]]:
    """``write_module(source, prefix)``: import ``source`` as a fresh module named after the test
    (the frameworks load tools by import path, so a tool under test must be a real module)."""
    import importlib

    made: list[str] = []

    def write(source: str, prefix: str) -> Any:
        name = f"{prefix}_{tmp_path.name.replace('-', '_')}"
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        made.append(name)
        return importlib.import_module(name)

    yield write
    for name in made:
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def ray_local(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A local Ray for one test module (2 CPUs, no dashboard, the module's ``NS`` namespace); a
    module with ``RAY_TESTS_ON_PATH = True`` also gets tests/ on its workers' import path."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    kw: dict[str, Any] = {}
    if getattr(request.module, "RAY_TESTS_ON_PATH", False):
        here = str(Path(__file__).resolve().parent)
        path = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        kw["runtime_env"] = {"env_vars": {"PYTHONPATH": path}}
        if here not in sys.path:
            sys.path.insert(0, here)
    ctx = ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024 * 1024,
                   namespace=request.module.NS, log_to_driver=False, **kw)
    try:
        yield ctx
    finally:
        ray.shutdown()
