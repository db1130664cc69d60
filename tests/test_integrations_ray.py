"""One pool per RL job: veRL and OpenRLHF workers (Ray actors) sharing one job-wide Tangram.

A local Ray cluster (2 CPUs, started here). The workers are stand-ins for veRL's AgentLoopWorker
and OpenRLHF's rollout actor (tests/rl_workers.py: the real ones need a model server / vLLM), but
the tool and agent paths are the frameworks' own: veRL's ``load_all_tools`` builds the tools from
one YAML and ``ToolAgentLoop._call_tool`` calls them; OpenRLHF's loader builds ``AgentExecutor()``
from one agent file and ``MultiTurnAgentExecutor.execute`` steps it. Nothing is deployed by the
test: the first worker to need the pool its config names creates the scheduler actor, the others
attach. Every call logs what it held and when, and the test checks from those timestamps that no
core and no quota slot was ever held twice at once across the workers, then kills a worker that
holds units and checks they come back.

Also here: cancellation and timeouts through both adapters on the job-wide pool (units back before
the cancel propagates, the body never runs after it, timeout messages reach the model).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import ray
else:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'tangram-sdk[ray]')")

pytest.importorskip("verl.tools.tool_registry", reason="verl not installed")
pytest.importorskip("openrlhf.utils.agent", reason="openrlhf not installed")

from tangram_sdk import ActionSpec  # noqa: E402
from tangram_sdk.integrations import resolve_runtime, shutdown  # noqa: E402
from tangram_sdk.ray import TangramCluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

NS = "tangram-rl-job"
TESTS = Path(__file__).resolve().parent
VERL_POOL = "verl-job"  # rl_function_tools.POOL
SCHEMA = {"type": "function", "function": {
    "name": "run_tests", "description": "Run the tests on some cores.",
    "parameters": {"type": "object", "properties": {"cpus": {"type": "integer", "description": "cores"}},
                   "required": ["cpus"]}}}


RAY_TESTS_ON_PATH = True  # the workers import tests/rl_*.py (conftest's ray_local)


@pytest.fixture(scope="module")
def cluster(ray_local: Any) -> Any:
    return ray_local


def _kill_pool(name: str) -> None:
    try:
        TangramCluster.get(name, namespace=NS, timeout=10).shutdown()
    except Exception:  # noqa: BLE001 - not created (the test failed before), or already gone
        pass


def _tool_yaml(path: Path, name: str, **extra: Any) -> str:
    import yaml

    path.write_text(yaml.safe_dump({"tools": [{
        "class_name": "tangram_sdk.integrations.verl.TangramTool",
        "config": {"type": "native", "tangram": {
            "wraps": "rl_verl_tools.RecordingTool", "spec_for": "rl_verl_tools:spec_for",
            "pool": {"name": name, "cpus": 4, "quotas": {"api": {"concurrency": 2}}}, **extra}},
        "tool_schema": SCHEMA}]}))
    return str(path)


def _check_no_overgrant(records: list[dict[str, Any]], cores: int, api: int) -> tuple[int, int]:
    """From the calls' own timestamps: each core is held by one call at a time, at most ``cores``
    cores and ``api`` quota slots at any instant. Returns the peaks."""
    by_core: dict[int, list[tuple[float, float, int]]] = {}
    for r in records:
        for c in r["cpus"]:
            by_core.setdefault(c, []).append((r["t0"], r["t1"], r["pid"]))
    assert set(by_core) <= set(range(cores)), sorted(by_core)
    for c, spans in by_core.items():
        spans.sort()
        for (a0, a1, pa), (b0, b1, pb) in zip(spans, spans[1:]):
            assert b0 >= a1, f"core {c} held by pid {pa} {(a0, a1)} and pid {pb} {(b0, b1)} at once"

    def peak(weight: str) -> int:
        edges = sorted([(r["t0"], 1, r) for r in records] + [(r["t1"], -1, r) for r in records],
                       key=lambda e: (e[0], e[1]))
        level = top = 0
        for _t, d, r in edges:
            level += d * (len(r["cpus"]) if weight == "cpus" else r["api"])
            top = max(top, level)
        return top

    peak_cpus, peak_api = peak("cpus"), peak("api")
    assert peak_cpus <= cores and peak_api <= api, (peak_cpus, peak_api)
    return peak_cpus, peak_api


def _settled(cl: TangramCluster, held: int = 0, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        s = cl.statistics()
        (node,) = s["nodes"].values()
        if (s["held"] == held and s["pending"] == 0) or time.monotonic() > deadline:
            return s | {"node": node}
        time.sleep(0.02)


# ---------------------------------------------------------------------------------------- veRL
def test_verl_workers_share_one_pool_and_a_killed_worker_frees_its_units(cluster: Any, tmp_path: Path) -> None:
    import rl_workers

    t_start = time.monotonic()
    cfg = _tool_yaml(tmp_path / "tool_config.yaml", VERL_POOL)
    Worker = ray.remote(num_cpus=0)(rl_workers.ToolWorker)
    workers = [Worker.remote(cfg, str(TESTS / "rl_function_tools.py")) for _ in range(4)]
    try:
        pids = ray.get([w.pid.remote() for w in workers], timeout=120)
        assert len(set(pids)) == 4
        rng = random.Random(13)
        batches = []
        for w in range(4):  # 16 concurrent tool calls per worker (+4 function-tool calls): 80 in all
            calls: list[tuple[str, dict[str, Any]]] = [
                ("run_tests", {"cpus": rng.choice((1, 1, 2)), "api": rng.random() < 0.5,
                               "hold": rng.uniform(0.005, 0.02)}) for _ in range(16)]
            calls += [("lookup", {"query": f"w{w}q{i}"}) for i in range(4)]
            batches.append(calls)
        # all four start at once: the first to need the pool creates the actor, the others attach
        outs = ray.get([wk.call_many.remote(b) for wk, b in zip(workers, batches)], timeout=120)
        for out in outs:
            assert all(t.startswith(("ran on", "results for")) for t in out), out
        records = [r for rs in ray.get([w.records.remote() for w in workers]) for r in rs]
        assert len(records) == 80 and len({r["pid"] for r in records}) == 4
        peak_cpus, peak_api = _check_no_overgrant(records, cores=4, api=2)
        assert peak_cpus >= 3 and peak_api == 2, (peak_cpus, peak_api)  # the pool was really contended
        cl = TangramCluster.get(VERL_POOL, namespace=NS)
        s = _settled(cl)
        assert s["clients"] == 4, s["clients"]  # one scheduler, four workers attached
        assert s["node"]["peak_cpus_used"] <= 4 and s["quotas"]["api"]["peak_used"] <= 2
        assert s["granted"] == s["released"] == 80 and s["node"]["cpus_free"] == 4
        assert cl.check_invariants() == []

        # a worker holding every core and a quota slot dies: the others get them at once
        ray.get(workers[0].start.remote("hog", "run_tests", {"cpus": 4, "api": True, "block": True}))
        assert ray.get(workers[0].await_holding.remote("hog"))
        ray.get(workers[1].start.remote("next", "run_tests", {"cpus": 4, "api": True, "hold": 0.01}))
        s = _settled(cl, held=1)
        # (the waiter takes its quota slot first, then waits for the cores: docs/ray.md, Design)
        assert s["node"]["cpus_free"] == 0 and s["pending"] == 1 and s["quotas"]["api"]["used"] == 2, s
        killed_at = time.monotonic()
        ray.kill(workers[0])
        assert ray.get(workers[1].result.remote("next"), timeout=30).startswith("ran on")
        after = [r for r in ray.get(workers[1].records.remote()) if r["tag"] == "next"]
        assert len(after) == 1 and after[0]["cpus"] == [0, 1, 2, 3] and after[0]["t0"] > killed_at
        s = _settled(cl)
        assert s["node"]["cpus_free"] == 4 and s["quotas"]["api"]["used"] == 0 and s["clients"] == 3, s
        print(f"killed worker's 4 cores reached the next worker {after[0]['t0'] - killed_at:.3f} s after the kill; "
              f"test took {time.monotonic() - t_start:.1f} s")
    finally:
        for w in workers:
            ray.kill(w)
        _kill_pool(VERL_POOL)


# ---------------------------------------------------------------------------------------- OpenRLHF
def test_openrlhf_rollout_actors_share_one_pool_and_a_killed_actor_frees_its_units(cluster: Any) -> None:
    import rl_workers

    name = "orlhf-job"  # rl_agent_file.POOL
    Worker = ray.remote(num_cpus=0)(rl_workers.RolloutWorker)
    workers = [Worker.remote(str(TESTS / "rl_agent_file.py")) for _ in range(2)]
    try:
        rng = random.Random(7)

        def action() -> str:
            return f"{rng.choice((1, 1, 2))} {int(rng.random() < 0.5)} {rng.uniform(0.005, 0.02):.3f}"

        runs = [[(f"w{w}e{i}", [action(), action()]) for i in range(32)] for w in range(2)]  # 64 steps each
        rewards = ray.get([wk.episodes.remote(r) for wk, r in zip(workers, runs)], timeout=120)
        assert rewards == [[1.0] * 32, [1.0] * 32]
        records = [r for rs in ray.get([w.records.remote() for w in workers]) for r in rs]
        assert len(records) == 128 and len({r["pid"] for r in records}) == 2
        peak_cpus, peak_api = _check_no_overgrant(records, cores=4, api=2)
        assert peak_cpus >= 3 and peak_api == 2
        cl = TangramCluster.get(name, namespace=NS)
        s = _settled(cl)
        assert s["clients"] == 2 and s["granted"] == s["released"] == 128 and cl.check_invariants() == []

        ray.get(workers[0].start.remote("hog", ["4 1 block"]))
        assert ray.get(workers[0].await_holding.remote())
        ray.get(workers[1].start.remote("next", ["4 1 0.01", "1 0 0.001"]))
        s = _settled(cl, held=1)
        assert s["node"]["cpus_free"] == 0 and s["pending"] == 1, s
        killed_at = time.monotonic()
        ray.kill(workers[0])
        assert ray.get(workers[1].result.remote("next"), timeout=30) == 1.0
        after = [r for r in ray.get(workers[1].records.remote()) if r["label"] == "next"]
        assert after[0]["cpus"] == [0, 1, 2, 3] and after[0]["t0"] > killed_at
        s = _settled(cl)
        assert s["node"]["cpus_free"] == 4 and s["quotas"]["api"]["used"] == 0 and s["clients"] == 1, s
    finally:
        for w in workers:
            ray.kill(w)
        _kill_pool(name)


# ---------------------------------------------------------------------------------------- cancellation
class _View:
    """What the pool holds, read *outside* the caller's own link: the Ray actor through a Ray call
    (job scope), or the in-process Tangram (process scope)."""

    def __init__(self, name: str, scope: str) -> None:
        self.name = name
        self.scope = scope

    async def read(self) -> tuple[int, int, int, int]:
        """(cores free, api slots used, leases held, requests waiting)."""
        if self.scope == "job":
            s = await asyncio.to_thread(TangramCluster.get(self.name, namespace=NS).statistics)
            (node,) = s["nodes"].values()
            return node["cpus_free"], s["quotas"]["api"]["used"], s["held"], s["pending"]
        t = await resolve_runtime({"pool": self.name})
        s = await t.astatistics()
        return s["cpus_free"], s["quotas"]["api"]["used"], s["running"], s["queued"]

    async def until(self, want: tuple[int, int, int, int], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while (got := await self.read()) != want:
            assert time.monotonic() < deadline, f"pool never reached {want}, still {got}"
            await asyncio.sleep(0.01)


async def _cancel_checks(view: _View, start: Any, holding: Any, ran: Any, timed_out: Any) -> None:
    """The same script through either adapter. ``start(tag, what)`` starts a call/step as a task,
    ``holding(tag)`` waits until its body runs, ``ran(tag)`` says whether its body ever finished,
    ``timed_out()`` runs one call that must time out and returns what reaches the model."""
    hog = start("hog", "4 1 block")
    await holding("hog")
    await view.until((0, 1, 1, 0))
    victim = start("victim", "1 1 0.01")  # waits for a core (on the job-wide actor it has its api slot
    await view.until((0, 2 if view.scope == "job" else 1, 1, 1))  # already: quotas first, docs/ray.md)
    victim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await victim
    assert await view.read() == (0, 1, 1, 0), "the cancelled waiter's slot must be back before the cancel propagates"
    hog.cancel()  # cancel a running body
    with pytest.raises(asyncio.CancelledError):
        await hog
    assert await view.read() == (4, 0, 0, 0), "a cancelled holder's units must be back before the cancel propagates"
    await asyncio.sleep(0.1)
    assert not ran("victim") and not ran("hog"), "a body ran after its cancel"
    # a timeout reaches the model as a message saying what was short
    hog = start("hog2", "4 0 block")
    await holding("hog2")
    text = await timed_out()
    assert "not granted within 0.2 s" in text and "cpu" in text, text
    assert await view.read() == (0, 0, 1, 0)
    hog.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hog
    assert await view.read() == (4, 0, 0, 0)


@pytest.mark.parametrize("scope", ["job", "process"])
@pytest.mark.parametrize("timeout", [None, 30])
async def test_cancel_and_timeout_through_a_verl_tool(cluster: Any, tmp_path: Path, scope: str,
                                                      timeout: float | None) -> None:
    import rl_verl_tools

    import rl_workers

    name = f"cancel-verl-{scope}-{timeout}"
    pool = {"name": name, "cpus": 4, "quotas": {"api": {"concurrency": 2}}, "scope": scope}
    import yaml

    def tool(tname: str, t: float | None) -> dict[str, Any]:
        return {"class_name": "tangram_sdk.integrations.verl.TangramTool",
                "config": {"type": "native", "tangram": {
                    "wraps": "rl_verl_tools.RecordingTool", "spec_for": "rl_verl_tools:spec_for", "pool": pool,
                    **({"timeout": t} if t is not None else {})}},
                "tool_schema": {**SCHEMA, "function": {**SCHEMA["function"], "name": tname}}}

    (tmp_path / "tools.yaml").write_text(yaml.safe_dump({"tools": [tool("slow", timeout), tool("quick", 0.2)]}))
    worker = rl_workers.ToolWorker(str(tmp_path / "tools.yaml"))  # this process is the worker here

    def start(tag: str, what: str) -> asyncio.Task[Any]:
        cpus, api, hold = what.split()
        args = {"cpus": int(cpus), "api": api == "1", "tag": f"{name}:{tag}", "hold": 0.01}
        if hold == "block":
            args["block"] = True
        return asyncio.get_running_loop().create_task(worker._call("slow", args))

    async def holding(tag: str) -> None:  # tags are per test: the tool module's state is per process
        assert await worker.await_holding(f"{name}:{tag}")

    def ran(tag: str) -> bool:
        return any(r["tag"] == f"{name}:{tag}" for r in rl_verl_tools.LOG)

    async def timed_out() -> str:
        text = await worker._call("quick", {"cpus": 1, "tag": "late"})
        # veRL's _call_tool turns the TimeoutError into the tool message: it used to end after the colon
        assert text.startswith("Error executing tool 'quick': quick: not granted within 0.2 s"), text
        return text

    try:
        await _cancel_checks(_View(name, scope), start, holding, ran, timed_out)
    finally:
        await shutdown()
        if scope == "job":
            _kill_pool(name)


@pytest.mark.parametrize("scope", ["job", "process"])
@pytest.mark.parametrize("timeout", [None, 30])
async def test_cancel_and_timeout_through_an_openrlhf_step(cluster: Any, scope: str, timeout: float | None) -> None:
    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

    from rl_workers import Engine, Tokenizer
    from tangram_sdk.integrations.openrlhf import with_tangram

    name = f"cancel-orlhf-{scope}-{timeout}"
    runtime = {"pool": {"name": name, "cpus": 4, "quotas": {"api": {"concurrency": 2}}, "scope": scope}}
    events: dict[str, asyncio.Event] = {}
    finished: set[str] = set()

    class Env(AgentInstanceBase):
        def __init__(self) -> None:
            pass

        async def reset(self, states: dict[str, Any], **kw: Any) -> dict[str, Any]:
            return {"observation": states["observation"]}

        async def step(self, states: dict[str, Any], **kw: Any) -> dict[str, Any]:
            import torch

            _c, _a, hold = states["action_text"].split()
            events.setdefault(states["label"], asyncio.Event()).set()
            await asyncio.sleep(3600 if hold == "block" else float(hold))
            finished.add(states["label"])
            return {"rewards": torch.tensor(1.0), "scores": torch.tensor(1.0), "environment_feedback": "",
                    "done": True, "sampling_params": states.get("sampling_params"), "extra_logs": {}}

    def spec_for(states: dict[str, Any]) -> ActionSpec:
        cpus, api, _h = states["action_text"].split()
        return ActionSpec(kind="step", cpus=int(cpus), quotas={"api": 1} if api == "1" else None)

    slow = MultiTurnAgentExecutor(with_tangram(Env, spec_for=spec_for, runtime=runtime, timeout=timeout))
    quick = MultiTurnAgentExecutor(with_tangram(Env, spec_for=spec_for, runtime=runtime, timeout=0.2))

    def episode(executor: Any, label: str, what: str) -> Any:
        params = type("P", (), {"max_tokens": None, "logprobs": None})()
        return executor.execute("prompt", label, params, 4096, Tokenizer(), Engine([what]))

    def start(tag: str, what: str) -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(episode(slow, tag, what))

    async def holding(tag: str) -> None:
        await asyncio.wait_for(events.setdefault(tag, asyncio.Event()).wait(), 30)

    async def timed_out() -> str:
        # OpenRLHF's executor does not catch a failing step: the TimeoutError is what the rollout sees
        with pytest.raises(TimeoutError) as info:
            await episode(quick, "late", "1 0 0.01")
        return str(info.value)

    try:
        await _cancel_checks(_View(name, scope), start, holding, lambda tag: tag in finished, timed_out)
    finally:
        await shutdown()
        if scope == "job":
            _kill_pool(name)



def test_a_loop_per_batch_leaves_no_handle_behind(cluster: Any) -> None:
    """veRL's reward loop runs every batch under a new event loop (asyncio.run): each batch opened
    a handle (a socket, a client at the actor) on the job-wide pool and none was ever closed: one
    file descriptor per batch for the life of the worker. Now a loop's handles close with it."""
    from tangram_sdk.integrations import action

    name = "per-batch-loop"
    runtime = {"pool": {"name": name, "cpus": 1}}
    spec = ActionSpec(kind="x", cpus=1)

    async def batch() -> None:
        async with action(spec, runtime=runtime) as lease:
            assert len(lease.cpus) == 1

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    try:
        asyncio.run(batch())
        first = fds()
        for _ in range(8):
            asyncio.run(batch())
        assert fds() - first <= 1, (first, fds())
        cl = TangramCluster.get(name, namespace=NS, timeout=10)
        for _ in range(100):  # the actor sees each close at once; the TTL (10 s) is not waited for
            stats = cl.statistics()
            if stats["clients"] == 0:
                break
            time.sleep(0.02)
        assert stats["clients"] == 0 and stats["expired_clients"] == 0, stats  # closed, not left to expire
    finally:
        _kill_pool(name)


# ---------------------------------------------------------------------------------------- attach
async def test_config_attaches_by_name_to_a_pool_the_driver_deployed(cluster: Any) -> None:
    """What a pool mapping cannot say (managers, per-node pools) is deployed by the driver; config
    that names the pool attaches to it. A name nobody deployed is a SpecError saying so."""
    from tangram_sdk import Pool, SpecError
    from tangram_sdk.integrations import Guard
    from tangram_sdk.ray import RemoteTangram, deploy

    cl = await asyncio.to_thread(deploy, "driver-pool", namespace=NS, pool=Pool(cpus=2))
    try:
        tg = await resolve_runtime({"pool": "driver-pool"})
        assert isinstance(tg, RemoteTangram) and await resolve_runtime({"pool": "driver-pool"}) is tg
        async with Guard(ActionSpec(kind="x", cpus=2), runtime={"pool": "driver-pool"}) as lease:
            assert lease.cpus == (0, 1) and lease.attachment("node") is not None
        with pytest.raises(SpecError, match="no pool named 'nobody' in Ray namespace"):
            await resolve_runtime({"pool": "nobody"})
    finally:
        await shutdown()
        await asyncio.to_thread(cl.shutdown)


# ---------------------------------------------------------------------------------------- examples
@pytest.mark.parametrize(("example", "expect"), [
    ("verl_tool.py", ("call 5: ran on", "was not run: argument 'cores'", "<RemoteTangram", "completed: 6")),
    ("openrlhf_agent.py", ("episode lima: reward=1.0 steps=2", "<RemoteTangram", "completed: 8")),
])
def test_the_examples_run_unchanged_on_the_job_wide_pool(cluster: Any, example: str, expect: tuple[str, ...]) -> None:
    """The same example code, local by default, on the Ray scheduler actor with --ray (verl_tool
    installs a RemoteTangram; openrlhf_agent's pool, named in its RUNTIME, becomes job-wide)."""
    env = dict(os.environ, RAY_ADDRESS=cluster.address_info["gcs_address"], PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(TESTS.parent / "examples" / example), "--ray"], env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for text in expect:
        assert text in out, f"{example} --ray did not print {text!r}:\n{out[-3000:]}"
