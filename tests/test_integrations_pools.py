"""One pool per name in a process, and which Tangram an adapter uses (no Ray here; the job-wide
Ray path is tests/test_integrations_ray.py).

* Two adapters in one process naming the same pool share one scheduler, however the pool is
  spelled (the old code built one scheduler per spelling: a tool YAML ``pool: {cpus: 4}`` plus a
  reward function's ``runtime={'pool': {'cpus': 4}}`` held 8 cores of 4).
* Precedence, the same for every adapter: an explicit Tangram object > install() > config > none
  (the old code used a config pool even when a Tangram was installed, against its own docs).
* Every adapter takes a RemoteTangram-shaped object too (install() refused one before).
"""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tangram_sdk import ActionSpec, Pool, RuntimeClosedError, SpecError, Tangram, TangramError
from tangram_sdk.integrations import (
    AnyTangram,
    Guard,
    SyncTangram,
    action,
    current_lease,
    install,
    pool_def,
    resolve_runtime,
    shutdown,
    using,
)


def _have(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


HAVE_VERL = _have("verl.tools.tool_registry")
HAVE_OPENRLHF = _have("openrlhf.utils.agent")
needs_verl = pytest.mark.skipif(not HAVE_VERL, reason="verl not installed")
needs_openrlhf = pytest.mark.skipif(not HAVE_OPENRLHF, reason="openrlhf not installed")

TOOL_MODULE = '''
import asyncio, time
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse
from tangram_sdk.integrations import current_lease

LOG = []

class HoldTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        lease = current_lease()
        t0 = time.monotonic()
        await asyncio.sleep(float(parameters.get("hold", 0.03)))
        LOG.append(("tool", tuple(lease.cpus), t0, time.monotonic()))
        return ToolResponse(text=f"held {list(lease.cpus)}"), 0.0, {}
'''

SCHEMA = {"type": "function", "function": {"name": "hold", "description": "Hold a core.",
                                            "parameters": {"type": "object", "properties": {}, "required": []}}}


@pytest.fixture
def tool_module(write_module: Any) -> Any:
    return write_module(TOOL_MODULE, "pools_tools")


@pytest.fixture(autouse=True)
async def clean() -> AsyncIterator[None]:
    previous = install(None)
    try:
        yield
    finally:
        await shutdown()
        install(previous)


def _tool_yaml(path: Path, module: str, tangram: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({"tools": [{
        "class_name": "tangram_sdk.integrations.verl.TangramTool",
        "config": {"type": "native", "tangram": {"wraps": f"{module}.HoldTool", **tangram}},
        "tool_schema": SCHEMA}]}))
    return path


def _assert_disjoint(log: list[tuple[str, tuple[int, ...], float, float]], cores: int) -> int:
    """No core is held by two calls at once (from the calls' own timestamps); returns the peak."""
    edges: list[tuple[float, int]] = []
    by_core: dict[int, list[tuple[float, float]]] = {}
    for _who, cpus, t0, t1 in log:
        edges += [(t0, len(cpus)), (t1, -len(cpus))]
        for c in cpus:
            by_core.setdefault(c, []).append((t0, t1))
    for c, spans in by_core.items():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1, f"core {c} granted twice at once: {(a0, a1)} and {(b0, b1)}"
    level = peak = 0
    for _t, d in sorted(edges, key=lambda e: (e[0], e[1])):
        level += d
        peak = max(peak, level)
    assert peak <= cores, f"{peak} cores held of {cores}"
    return peak


# -- one name, one scheduler ---------------------------------------------------------------------
async def test_four_spellings_of_one_pool_are_one_scheduler() -> None:
    spellings = [{"pool": {"cpus": 4}}, {"cpus": "0-3"}, {"pool": {"cpus": [0, 1, 2, 3], "name": "tangram"}},
                 {"pool": {"cpus": 4}, "options": {}}]
    got = [await resolve_runtime(s) for s in spellings]
    assert all(g is got[0] for g in got), got
    assert isinstance(got[0], AnyTangram)


async def test_two_definitions_under_one_name_fail_and_two_names_are_two_pools() -> None:
    a = await resolve_runtime({"pool": {"name": "a", "cpus": 2}})
    with pytest.raises(SpecError, match="two definitions of pool 'a'"):
        await resolve_runtime({"pool": {"name": "a", "cpus": 3}})
    with pytest.raises(SpecError, match="two definitions of pool 'a'"):
        Guard(ActionSpec(kind="x", cpus=1), runtime={"pool": {"name": "a", "cpus": 2, "quotas": {"q": {"concurrency": 1}}}})
    b = await resolve_runtime({"pool": {"name": "b", "cpus": 3}})
    assert a is not b
    assert await resolve_runtime({"pool": "a"}) is a  # attach by name


async def test_attach_by_name_needs_a_definition() -> None:
    with pytest.raises(SpecError, match="no pool named 'nowhere'"):
        await resolve_runtime({"pool": "nowhere"})
    # a definition read from config (here a Guard's) is enough: the attach opens it
    Guard(ActionSpec(kind="x", cpus=1), runtime={"pool": {"name": "later", "cpus": 1}})
    t = await resolve_runtime({"pool": "later"})
    async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
        assert lease.cpus == (0,)


def test_pool_mappings_are_checked_where_config_is_read() -> None:
    for bad, word in (({"pool": {"cpus": 1, "cpu": 2}}, "unknown key"), ({"pool": {"cpus": 1, "scope": "node"}}, "scope"),
                      ({"pool": {"name": "x"}}, "no resources"), ({"pool": {"cpus": 1}, "extra": 1}, "unknown key"),
                      ({"pool": {"name": " x", "cpus": 1}}, "name"), ({"pool": 5}, "pool must be"),
                      ({"pool": "x", "options": {"window": 2}}, "options"),
                      # options are the scheduler's, checked here too (stop 33: a typo loaded, then
                      # every call failed when the pool first opened mid-rollout)
                      ({"pool": {"cpus": 1}, "options": {"windw": 4}}, "unknown scheduler option"),
                      ({"pool": {"cpus": 1}, "options": {"window": "four"}}, "window must be int"),
                      ({"pool": {"cpus": 1}, "options": {"window": -1}}, "window and scan_limit must be >= 1"),
                      ({"pool": {"cpus": 1}, "options": {"objective": "fast"}}, "objective must be one of")):
        with pytest.raises(SpecError, match=word):
            pool_def(bad)
    d = pool_def({"pool": {"name": "r", "namespace": "ns", "scope": "process", "cpus": "0-1",
                           "quotas": {"s": {"concurrency": 2}}}, "options": {"window": 4}})
    assert (d.name, d.namespace, d.scope, d.pool.cpus, d.options) == ("r", "ns", "process", (0, 1), (("window", 4),))
    assert d.pool.quota_map["s"].concurrency == 2


async def test_a_pool_runs_on_one_loop_of_the_process() -> None:
    """A second event loop (another thread) naming a pool that runs here gets a clear error, not a
    second scheduler over the same cores."""
    await resolve_runtime({"pool": {"name": "one-loop", "cpus": 1}})
    errors: list[BaseException] = []

    def other_thread() -> None:
        async def main() -> None:
            await resolve_runtime({"pool": {"name": "one-loop", "cpus": 1}})

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - inspected below
            errors.append(exc)

    th = threading.Thread(target=other_thread)
    th.start()
    await asyncio.to_thread(th.join)
    assert len(errors) == 1 and isinstance(errors[0], TangramError), errors
    assert "another event loop" in str(errors[0])


@needs_verl
async def test_a_yaml_tool_pool_and_a_reward_pool_in_one_worker_share_one_scheduler(
        tool_module: Any, tmp_path: Path) -> None:
    """The issue's case: a tool YAML `pool: {cpus: 4}` and tangram_reward(runtime={'pool': {'cpus': 4}})
    in one worker. Old code: two schedulers, 8 cores held of 4 and calls started on held cores."""
    from verl.tools.tool_registry import initialize_tools_from_config

    from tangram_sdk.integrations.verl import tangram_reward

    cfg = _tool_yaml(tmp_path / "tools.yaml", tool_module.__name__, {"spec": {"cpus": 1}, "pool": {"cpus": 4}})
    (tool,) = initialize_tools_from_config(str(cfg))

    @tangram_reward(ActionSpec(kind="rm", cpus=1), runtime={"pool": {"cpus": "0-3"}})
    async def compute_score(data_source: str, solution_str: str, ground_truth: str, **kw: Any) -> float:
        lease = current_lease()
        assert lease is not None
        t0 = time.monotonic()
        await asyncio.sleep(0.03)
        tool_module.LOG.append(("reward", tuple(lease.cpus), t0, time.monotonic()))
        return 1.0

    calls = [tool.execute("i", {"hold": 0.03}) for _ in range(8)]
    scores = [compute_score(data_source="d", solution_str="s", ground_truth="g") for _ in range(8)]
    await asyncio.gather(*calls, *scores)
    assert len(tool_module.LOG) == 16
    assert _assert_disjoint(tool_module.LOG, 4) == 4
    pool = await resolve_runtime({"cpus": 4})
    await asyncio.sleep(0.02)
    assert pool.statistics()["completed"] == 16  # type: ignore[attr-defined]


# -- precedence: explicit object > install() > config > none --------------------------------------
@pytest.fixture
async def three() -> AsyncIterator[dict[str, Tangram]]:
    """Three pools told apart by their core ids: explicit 10, installed 20, config 30."""
    async with Tangram(Pool(cpus=[10])) as explicit, Tangram(Pool(cpus=[20])) as inst:
        yield {"explicit": explicit, "installed": inst}


CONFIG = {"pool": {"name": "precedence", "cpus": [30]}}


async def _which(run: Any) -> int:
    lease = await run()
    return int(lease.cpus[0])


@needs_verl
@needs_openrlhf
async def test_precedence_is_the_same_for_every_adapter(three: dict[str, Tangram], tool_module: Any,
                                                         tmp_path: Path) -> None:
    from openrlhf.utils.agent import AgentInstanceBase
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from tangram_sdk.integrations.openrlhf import with_tangram
    from tangram_sdk.integrations.verl import TangramAgentLoopMixin, TangramTool, tangram_reward, tangram_tool

    schema = OpenAIFunctionToolSchema.model_validate(SCHEMA)
    one = ActionSpec(kind="x", cpus=1)

    class Env(AgentInstanceBase):
        def __init__(self) -> None:
            pass

        async def step(self, states: dict[str, Any], **kwargs: Any) -> Any:
            return current_lease()

    class Base:
        def __init__(self, *a: Any, **k: Any) -> None:
            pass

    class Loop(TangramAgentLoopMixin, Base):
        pass

    def adapters(runtime: Any) -> dict[str, Any]:
        """Each adapter configured with `runtime` (None, a config mapping, or an object)."""
        yaml_tool = TangramTool(config={"type": "native", "tangram": {
            "wraps": f"{tool_module.__name__}.HoldTool", "spec": {"cpus": 1},
            **({"pool": runtime["pool"]} if isinstance(runtime, dict) else {})}}, tool_schema=schema)
        code_tool = tangram_tool(tool_module.HoldTool, spec=one, runtime=runtime)(
            config={"type": "native"}, tool_schema=schema)
        loop = Loop(tangram=runtime if isinstance(runtime, dict) else None)
        async def score(**kw: Any) -> Any:
            return current_lease()

        reward = tangram_reward(one, runtime=runtime)(score)
        step = with_tangram(Env, spec=one, runtime=runtime)

        async def via_tool(tool: Any) -> Any:
            await tool.execute("i", {"hold": 0})
            return _Cpus(tool_module.LOG[-1][1])

        async def via_loop() -> Any:
            async with loop.tangram_action(one) as lease:
                return lease

        async def via_guard() -> Any:
            async with Guard(one, runtime=runtime) as lease:
                return lease

        async def via_action() -> Any:
            async with action(one, runtime=runtime) as lease:
                return lease

        out = {
            "code tool": lambda: via_tool(code_tool),
            "reward": lambda: reward(data_source="d", solution_str="s", ground_truth="g"),
            "openrlhf step": lambda: step().step({}),
            "guard": via_guard,
            "action": via_action,
        }
        if not (runtime is not None and not isinstance(runtime, dict)):  # YAML holds no objects
            out["yaml tool"] = lambda: via_tool(yaml_tool)
            out["agent loop"] = via_loop
        return out

    # config only -> the config pool; config + install -> the installed one
    for name, run in adapters(CONFIG).items():
        assert await _which(run) == 30, name
    with using(three["installed"]):
        for name, run in adapters(CONFIG).items():
            assert await _which(run) == 20, f"{name}: install() must win over config"
        # an explicit object beats install()
        for name, run in adapters(three["explicit"]).items():
            assert await _which(run) == 10, f"{name}: an explicit Tangram must win over install()"
        for name, run in adapters(None).items():
            assert await _which(run) == 20, name
    # nothing at all -> an error that says what to do
    for name, run in adapters(None).items():
        with pytest.raises(RuntimeClosedError, match="install"):
            await run()
        assert name


class _Cpus:
    def __init__(self, cpus: tuple[int, ...]) -> None:
        self.cpus = cpus


# -- any Tangram handle ---------------------------------------------------------------------------
class Proxy:
    """A Tangram handle that is not a Tangram: forwards to one (as RemoteTangram forwards to the
    actor). Counts its acquires so the test can tell it was used."""

    def __init__(self, inner: Tangram) -> None:
        self.inner = inner
        self.acquires = 0

    def acquire(self, spec: ActionSpec, *, timeout: float | None = None) -> Any:
        self.acquires += 1
        return self.inner.acquire(spec, timeout=timeout)

    async def astatistics(self) -> dict[str, Any]:
        return self.inner.statistics()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_every_entry_point_takes_any_tangram_handle() -> None:
    from tangram_sdk.ray import RemoteTangram

    from tangram_sdk._protocol import is_tangram

    assert isinstance(RemoteTangram("x"), AnyTangram) and is_tangram(RemoteTangram("x"))
    assert not is_tangram(RemoteTangram) and not is_tangram(Tangram)  # classes are factories, not handles
    install(RemoteTangram("x"))  # the old code refused it: "install() needs a Tangram"
    async with Tangram(Pool(cpus=2)) as t:
        proxy = Proxy(t)
        install(proxy)
        async with Guard(ActionSpec(kind="g", cpus=1)) as lease:
            assert len(lease.cpus) == 1
        async with action(ActionSpec(kind="a", cpus=2)) as lease:
            assert len(lease.cpus) == 2
        sync = SyncTangram(proxy)
        assert (await asyncio.to_thread(sync.statistics))["completed"] == 2

        def in_thread() -> int:
            with sync.acquire(ActionSpec(kind="s", cpus=1)) as lease:
                return len(lease.cpus)

        assert await asyncio.to_thread(in_thread) == 1
        assert proxy.acquires == 3
        # a factory may return one too
        assert await resolve_runtime(lambda: proxy) is not None
    with pytest.raises(SpecError, match="RemoteTangram"):
        install(Pool(cpus=1))  # type: ignore[arg-type]


@needs_verl
def test_bad_pool_config_fails_where_the_adapter_is_built(tool_module: Any) -> None:
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from tangram_sdk.integrations.openrlhf import with_tangram
    from tangram_sdk.integrations.verl import TangramAgentLoopMixin, TangramTool

    schema = OpenAIFunctionToolSchema.model_validate(SCHEMA)
    base = {"wraps": f"{tool_module.__name__}.HoldTool", "spec": {"cpus": 1}}
    with pytest.raises(SpecError, match=r"tool 'hold' tangram config: pool: unknown key\(s\) \['cpu'\]"):
        TangramTool(config={"type": "native", "tangram": {**base, "pool": {"cpu": 4}}}, tool_schema=schema)
    with pytest.raises(SpecError, match="not both"):
        TangramTool(config={"type": "native", "tangram": {**base, "pool": "p", "runtime": "m:f"}}, tool_schema=schema)

    class Base:
        def __init__(self, *a: Any, **k: Any) -> None:
            pass

    class Loop(TangramAgentLoopMixin, Base):
        pass

    with pytest.raises(SpecError, match="unknown key"):
        Loop(tangram={"pool": {"cpus": 1}, "pools": {}})
    with pytest.raises(SpecError, match="scope"):
        Loop(tangram={"pool": {"cpus": 1, "scope": "cluster"}})
    # each of these loaded, then failed on every call (stop 33's adapter audit)
    with pytest.raises(SpecError, match="timeout must be None or a number of seconds >= 0"):
        TangramTool(config={"type": "native", "tangram": {**base, "timeout": -5}}, tool_schema=schema)
    with pytest.raises(SpecError, match="timeout must be None or a number of seconds >= 0"):
        TangramTool(config={"type": "native", "tangram": {**base, "timeout": "abc"}}, tool_schema=schema)
    with pytest.raises(SpecError, match="timeout must be None"):
        Loop(tangram={"pool": {"cpus": 1}, "timeout": -5})
    with pytest.raises(SpecError, match="unknown scheduler option"):
        TangramTool(config={"type": "native", "tangram": {**base, "pool": {"cpus": 1}, "options": {"windw": 4}}},
                    tool_schema=schema)
    with pytest.raises(SpecError, match="give `pool:` too"):
        TangramTool(config={"type": "native", "tangram": {**base, "options": {"window": 4}}}, tool_schema=schema)
    with pytest.raises(SpecError, match="from_parameters adjusts the static spec, but spec_for"):
        TangramTool(config={"type": "native", "tangram": {"wraps": f"{tool_module.__name__}.HoldTool",
                                                          "spec": {"cpus": 1},
                                                          "spec_for": f"{tool_module.__name__}:HoldTool",
                                                          "from_parameters": {"cpus": "n"}}}, tool_schema=schema)
    if HAVE_OPENRLHF:
        from openrlhf.utils.agent import AgentInstanceBase

        class Env(AgentInstanceBase):
            async def step(self, states: dict[str, Any], **kwargs: Any) -> Any:
                return {}

        with pytest.raises(SpecError, match="with_tangram"):
            with_tangram(Env, spec=ActionSpec(kind="x"), runtime={"pool": {"cpus": -1}})
        with pytest.raises(SpecError, match="timeout must be None"):
            with_tangram(Env, spec=ActionSpec(kind="x"), timeout=-5)
        with pytest.raises(SpecError, match="spec_for must be callable"):
            with_tangram(Env, spec_for="agent_func:step_spec")  # type: ignore[arg-type]
        with pytest.raises(SpecError, match="can never run on pool"):
            with_tangram(Env, spec=ActionSpec(kind="x", cpus=8), runtime={"pool": {"name": "small-o", "cpus": 2}})
    # a static spec that can never run on the pool the same config defines: it loaded, and every
    # call then came back "not run" to the model with reward 0 (stop 35's adapter audit)
    for i, (pool, spec, why) in enumerate((({"cpus": 2, "quotas": {"search": {"concurrency": 1}}},
                                            {"cpus": 1, "quotas": {"serach": 1}}, "serach"),
                                           ({"cpus": 2}, {"cpus": 8}, "cpus"), ({"cpus": 2}, {"cpus": 1, "gpus": 1}, "gpu"),
                                           ({"cpus": 0, "quotas": {"api": {"concurrency": 1}}}, {"cpus": 1}, "cpus"))):
        with pytest.raises(SpecError, match="can never run on pool") as ei:
            TangramTool(config={"type": "native", "tangram": {**base, "spec": spec,
                                                              "pool": {"name": f"small{i}", **pool}}},
                        tool_schema=schema)
        assert why in str(ei.value).lower(), ei.value
    TangramTool(config={"type": "native", "tangram": {**base, "spec": {"cpus": 2}, "pool": {"name": "fits", "cpus": 2}}},
                tool_schema=schema)
    # two tools of one YAML defining one name two ways: the second build fails (it built, and the
    # tool called second failed every call); the same definition again is fine
    TangramTool(config={"type": "native", "tangram": {**base, "pool": {"name": "twice", "cpus": 2}}}, tool_schema=schema)
    TangramTool(config={"type": "native", "tangram": {**base, "pool": {"name": "twice", "cpus": 2}}}, tool_schema=schema)
    with pytest.raises(SpecError, match="two definitions of pool 'twice'"):
        TangramTool(config={"type": "native", "tangram": {**base, "pool": {"name": "twice", "cpus": 3}}},
                    tool_schema=schema)



@pytest.mark.looptime(False)  # real sleeps: the holder and the shutdown race in wall time
async def test_shutdown_waits_for_the_holders_so_a_new_pool_never_grants_their_cores() -> None:
    """shutdown() closed the pool and returned while tool calls still held its cores; the next
    call opened a fresh pool under the same name and granted those cores again (two holders of
    one core). Now shutdown() returns once the holders have released, and a call meanwhile waits
    for that before the fresh pool starts."""
    runtime = {"pool": {"name": "sd-drain", "cpus": 1}}
    spec = ActionSpec(kind="x", cpus=1)
    log: list[tuple[str, float, float]] = []

    async def hold(tag: str, s: float) -> None:
        async with action(spec, runtime=runtime):
            t0 = time.monotonic()
            await asyncio.sleep(s)
            log.append((tag, t0, time.monotonic()))

    old = asyncio.create_task(hold("old", 0.4))
    await asyncio.sleep(0.1)
    closing = asyncio.create_task(shutdown())
    await asyncio.sleep(0.05)
    new = asyncio.create_task(hold("new", 0.05))  # opens the name again while shutdown waits
    await closing
    shut = time.monotonic()
    await asyncio.gather(old, new)
    (o0, o1), (n0, n1) = [(a, b) for tag, a, b in sorted(log, key=lambda x: x[0] != "old")]
    assert o1 <= shut, "shutdown() returned while a holder still held its core"
    assert o1 <= n0, f"one core held twice: old {o0:.3f}-{o1:.3f}, new {n0:.3f}-{n1:.3f}"


@pytest.mark.looptime(False)
async def test_a_cancelled_shutdown_is_cancelled_at_once_and_the_pool_still_closes() -> None:
    """Cancellation always wins: shutdown() awaited its host task directly, so a cancel went into
    that task and the suppress around it ate it; shutdown() returned normally once every holder
    had released (never, for a lease nobody releases). Now the caller's cancel propagates at once,
    the close goes on in the background, and a same-name pool still waits for the holders."""
    runtime = {"pool": {"name": "sd-cancel", "cpus": 1}}
    spec = ActionSpec(kind="x", cpus=1)
    held = asyncio.Event()
    ends: list[tuple[str, float, float]] = []

    async def hold(tag: str, s: float) -> None:
        async with action(spec, runtime=runtime):
            t0 = time.monotonic()
            held.set()
            await asyncio.sleep(s)
            ends.append((tag, t0, time.monotonic()))

    old = asyncio.create_task(hold("old", 0.5))
    await held.wait()
    closing = asyncio.create_task(shutdown())
    await asyncio.sleep(0.02)
    t0 = time.monotonic()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert time.monotonic() - t0 < 0.3, "the cancel waited for the holder (0.5 s)"
    new = asyncio.create_task(hold("new", 0.01))  # the name again: waits for the old holder
    await asyncio.gather(old, new)
    (o0, o1), (n0, _n1) = [(a, b) for tag, a, b in sorted(ends, key=lambda x: x[0] != "old")]
    assert o1 <= n0, "a same-name pool granted the core the closing pool's holder still held"
    await shutdown()
