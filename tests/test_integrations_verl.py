"""The veRL adapter against veRL's real classes when verl is installed, else the missing path.

With verl importable these tests subclass the real ``verl.tools.base_tool.BaseTool``, build tools
through veRL's own YAML loader (``initialize_tools_from_config``), call them through the real
``ToolAgentLoop._call_tool`` dispatch, and load a reward function with veRL's
``get_custom_reward_fn``. Without verl, they check that each verl-only piece raises
IntegrationUnavailable naming ``pip install verl``, and that the framework-free pieces still work.
The missing path is also simulated when verl *is* installed, so both paths run everywhere.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tangram_sdk.errors import SpecError
from tangram_sdk.integrations import IntegrationUnavailable, current_lease
from tangram_sdk.integrations import verl as tverl
from tangram_sdk.runtime import Tangram
from tangram_sdk.spec import ActionSpec


def _verl_importable() -> bool:
    try:
        importlib.import_module("verl.tools.base_tool")
        importlib.import_module("verl.tools.schemas")
    except ImportError:
        return False
    return True


HAVE_VERL = _verl_importable()
needs_verl = pytest.mark.skipif(not HAVE_VERL, reason="verl not installed: the IntegrationUnavailable tests run instead")

TOOL_MODULE = '''
import asyncio
from typing import Any
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse
from tangram_sdk.integrations import current_lease

PEAK = {"now": 0, "max": 0, "created": 0, "released": 0}

class EchoTool(BaseTool):
    """A plain veRL tool that knows nothing of tangram."""

    async def create(self, instance_id=None, **kwargs):
        PEAK["created"] += 1
        return await super().create(instance_id, **kwargs)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        PEAK["now"] += 1
        PEAK["max"] = max(PEAK["max"], PEAK["now"])
        try:
            await asyncio.sleep(0.02)
            if parameters.get("fail"):
                raise RuntimeError("tool body failed")
            lease = current_lease()
            cpus = None if lease is None else list(lease.cpus)
            return ToolResponse(text=f"echo {parameters.get('text')} cpus={cpus}"), 0.5, {"n": 1}
        finally:
            PEAK["now"] -= 1

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.25

    async def release(self, instance_id: str, **kwargs) -> None:
        PEAK["released"] += 1

HINTS = {"bad": 0}

def suite_hint(tool_name, instance_id, parameters, agent_data):
    """A length hint from the sample's data, as a user would keep it: the suite's last run."""
    if parameters.get("text") == "nan":
        HINTS["bad"] += 1
        return float("nan")
    if parameters.get("text") == "boom":
        return agent_data.tools_kwargs["no-such-key"]  # a KeyError in the user's hint
    return None if agent_data is None else agent_data.tools_kwargs.get("suite_s")

def repo_group(tool_name, instance_id, parameters, agent_data):
    """The task a call is one of: the sample's repository (GRPO runs several samples of it)."""
    return None if agent_data is None else agent_data.tools_kwargs.get("repo")

def code_spec(tool_name, parameters):
    from tangram_sdk.spec import ActionSpec
    return ActionSpec(kind=tool_name, cpus=int(parameters["cpus"]))
'''

SCHEMA = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Echo text back.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}


@pytest.fixture
def tool_module(write_module: Any) -> Any:
    return write_module(TOOL_MODULE, "tangram_test_tools")


def write_yaml(path: Path, module: str, tangram_cfg: dict[str, Any]) -> Path:
    import yaml  # PyYAML comes with veRL's omegaconf

    doc = {
        "tools": [
            {
                "class_name": "tangram_sdk.integrations.verl.TangramTool",
                "config": {"type": "native", "tangram": {"wraps": f"{module}.EchoTool", **tangram_cfg}},
                "tool_schema": SCHEMA,
            }
        ]
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def agent_loop(tools: list[Any]) -> Any:
    """A real ToolAgentLoop with only what ``_call_tool`` reads (its constructor needs a model)."""
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    loop = object.__new__(ToolAgentLoop)
    loop.tools = {t.name: t for t in tools}
    loop.max_tool_response_length = 10_000
    loop.tool_response_truncate_side = "middle"
    return loop


async def call(loop: Any, name: str, args: dict[str, Any]) -> tuple[Any, float, dict[str, Any]]:
    from verl.experimental.agent_loop.tool_parser import FunctionCall

    class AgentData:  # _call_tool only forwards it to execute as agent_data=
        pass

    result: tuple[Any, float, dict[str, Any]] = await loop._call_tool(
        FunctionCall(name=name, arguments=json.dumps(args)), {}, AgentData()
    )
    return result


async def settle() -> None:
    """Let the scheduler task process the Released events posted by the last exits."""
    await asyncio.sleep(0.02)


# -- with the real veRL ------------------------------------------------------------------------------
@needs_verl
async def test_yaml_wrapped_tool_runs_inside_acquire(tangram: Tangram, tool_module: Any, tmp_path: Path) -> None:
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import ToolResponse
    from verl.tools.tool_registry import initialize_tools_from_config

    cfg = write_yaml(tmp_path / "tools.yaml", tool_module.__name__, {"spec": {"cpus": 1}, "timeout": 30})
    (tool,) = initialize_tools_from_config(str(cfg))
    assert isinstance(tool, BaseTool) and tool.name == "echo"
    assert tool.get_openai_tool_schema().function.name == "echo"
    loop = agent_loop([tool])

    results = await asyncio.gather(*(call(loop, "echo", {"text": f"t{i}"}) for i in range(5)))
    for resp, reward, metrics in results:
        assert isinstance(resp, ToolResponse) and resp.text.startswith("echo t") and "cpus=[" in resp.text
        assert reward == 0.5 and metrics["n"] == 1 and metrics["tangram_queued_s"] >= 0
    assert tool_module.PEAK["max"] == 2  # a 2-core pool, 1 core per call: never more than 2 at once
    assert tool_module.PEAK["created"] == tool_module.PEAK["released"] == 5
    assert await tool.calc_reward("x") == 0.25
    await settle()
    stats = tangram.statistics()
    assert stats["completed"] == 5 and stats["cpus_free"] == 2


def trajectory(suite_s: float | None = None, repo: str | None = None) -> Any:
    """veRL's own ``AgentData``, what its ToolAgentLoop passes to ``execute``: one per trajectory.
    Both get the request id full determinism gives every trajectory of a priority."""
    from verl.experimental.agent_loop.tool_agent_loop import AgentData

    return AgentData(messages=[], image_data=None, video_data=None, audio_data=None, mm_processor_kwargs=None,
                     metrics={}, request_id="det-0",
                     tools_kwargs={k: v for k, v in (("suite_s", suite_s), ("repo", repo)) if v is not None})


async def call_in(loop: Any, name: str, args: dict[str, Any], traj: Any) -> Any:
    from verl.experimental.agent_loop.tool_parser import FunctionCall

    return await loop._call_tool(FunctionCall(name=name, arguments=json.dumps(args)), {}, traj)


ELASTIC = {"cpus": 1, "elastic": {"resource": "cpu", "max_units": 2, "parallel": 0.9}}


@needs_verl
async def test_calls_name_their_trajectory_and_carry_the_hint(
    tangram: Tangram, tool_module: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """veRL makes a tool instance per *call*; the adapter groups an elastic call by its
    trajectory (the ``agent_data`` veRL passes), so the core learns lengths per trajectory (the
    step-risk sizing of docs/scheduler.md), and passes ``hint_for``'s answer as ``expected_s``. A
    hint that is not seconds is dropped with one warning; the call still runs."""
    from tangram_sdk.scheduler import Submitted
    from verl.tools.tool_registry import initialize_tools_from_config

    seen: list[Submitted] = []
    tangram.observers.append(lambda evs, now, ds: seen.extend(e for e in evs if isinstance(e, Submitted)))
    cfg = write_yaml(tmp_path / "tools.yaml", tool_module.__name__,
                     {"spec": ELASTIC, "hint_for": f"{tool_module.__name__}:suite_hint"})
    (tool,) = initialize_tools_from_config(str(cfg))
    tool.name = f"echo_{tmp_path.name}"  # a fresh name for the warn-once set
    loop = agent_loop([tool])
    a, b = trajectory(suite_s=40.0), trajectory()
    with caplog.at_level(logging.WARNING, logger="tangram_sdk.integrations"):
        for traj in (a, b, a, b):
            resp, _, _ = await call_in(loop, tool.name, {"text": "x"}, traj)
            assert resp.text.startswith("echo x")
        for _ in range(2):
            resp, _, _ = await call_in(loop, tool.name, {"text": "nan"}, b)
            assert resp.text.startswith("echo nan")  # a bad hint never fails the call
        for _ in range(2):  # nor one that raises (it failed the call with a bare "'no-such-key'")
            resp, _, _ = await call_in(loop, tool.name, {"text": "boom"}, b)
            assert resp.text.startswith("echo boom"), resp.text
    groups = [e.spec.group for e in seen]
    assert groups[0] == groups[2] != groups[1] == groups[3] == groups[4] and None not in groups
    assert [e.expected for e in seen] == [40.0, None, 40.0, None, None, None, None, None]
    assert tool_module.HINTS["bad"] == 2
    assert len([r for r in caplog.records if "hint_for returned nan" in r.getMessage()]) == 1
    assert len([r for r in caplog.records if "hint_for raised KeyError" in r.getMessage()]) == 1

    off = write_yaml(tmp_path / "off.yaml", tool_module.__name__, {"spec": ELASTIC, "group": "none"})
    (plain,) = initialize_tools_from_config(str(off))
    seen.clear()
    await call_in(agent_loop([plain]), "echo", {"text": "y"}, a)
    assert [e.spec.group for e in seen] == [None]
    with pytest.raises(SpecError, match="group"):
        initialize_tools_from_config(str(write_yaml(tmp_path / "bad.yaml", tool_module.__name__,
                                                    {"spec": ELASTIC, "group": "prompt"})))

    # group_for: the task (two samples of one repository share a group, another repository and a
    # sample without one (its trajectory) do not)
    by_task = write_yaml(tmp_path / "task.yaml", tool_module.__name__,
                         {"spec": ELASTIC, "group_for": f"{tool_module.__name__}:repo_group"})
    (tasked,) = initialize_tools_from_config(str(by_task))
    seen.clear()
    for traj in (trajectory(repo="django"), trajectory(repo="django"), trajectory(repo="flask"), b):
        await call_in(agent_loop([tasked]), "echo", {"text": "z"}, traj)
    g = [e.spec.group for e in seen]
    assert g[0] == g[1] == "django" and g[2] == "flask" and g[3] == groups[1]
    await settle()
    assert tangram.statistics()["cpus_free"] == 2


@needs_verl
async def test_unmappable_arguments_return_an_error_to_the_agent(
    tangram: Tangram, tool_module: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from verl.tools.tool_registry import initialize_tools_from_config

    cfg = write_yaml(tmp_path / "tools.yaml", tool_module.__name__,
                     {"spec_for": f"{tool_module.__name__}:code_spec"})
    (tool,) = initialize_tools_from_config(str(cfg))
    tool.name = f"echo_{tmp_path.name}"  # a fresh name: the warn-once set is per process
    loop = agent_loop([tool])
    with caplog.at_level(logging.DEBUG, logger="tangram_sdk.integrations"):
        bad1, r1, m1 = await call(loop, tool.name, {"text": "a"})  # no "cpus" argument
        bad2, _, _ = await call(loop, tool.name, {"text": "a", "cpus": "lots"})
        _, _, m3 = await call(loop, tool.name, {"text": "a", "cpus": 64})  # never fits the pool
        ok, _, _ = await call(loop, tool.name, {"text": "fine", "cpus": 2})
    assert bad1.text.startswith(f"Error: tool '{tool.name}' was not run") and r1 == 0.0
    assert m1 == {"tangram_error": "SpecMappingError"} and "lots" in bad2.text
    assert m3 == {"tangram_error": "InfeasibleSpecError"}
    assert ok.text.startswith("echo fine cpus=[0, 1]")
    warnings = [r for r in caplog.records if tool.name in r.getMessage() and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    await settle()
    assert tangram.statistics()["cpus_free"] == 2


@needs_verl
async def test_tool_body_errors_propagate_and_release(tangram: Tangram, tool_module: Any) -> None:
    from verl.tools.schemas import OpenAIFunctionToolSchema

    Wrapped = tverl.tangram_tool(tool_module.EchoTool, spec=ActionSpec(kind="echo", cpus=1))
    tool = Wrapped(config={"type": "native"}, tool_schema=OpenAIFunctionToolSchema.model_validate(SCHEMA))
    assert isinstance(tool, tool_module.EchoTool) and type(tool).__name__ == "TangramEchoTool"
    with pytest.raises(RuntimeError, match="tool body failed"):
        await tool.execute("id", {"text": "x", "fail": True})
    resp, _, _ = await call(agent_loop([tool]), "echo", {"text": "x", "fail": True})
    assert "tool body failed" in resp.text  # veRL's own catch-all turned it into a tool message
    await settle()
    stats = tangram.statistics()
    assert stats["cpus_free"] == 2 and stats["failed"] >= 2


@needs_verl
async def test_subclass_with_execute_with_lease_and_bad_config(tangram: Tangram) -> None:
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

    TangramTool = tverl.TangramTool
    schema = OpenAIFunctionToolSchema.model_validate(SCHEMA)

    class Sandbox(TangramTool):  # type: ignore[misc, valid-type]
        async def execute_with_lease(self, instance_id: str, parameters: dict[str, Any], lease: Any,
                                     **kwargs: Any) -> Any:
            result = await lease.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"])
            return ToolResponse(text=result.stdout.decode().strip()), 0.0, {}

    tool = Sandbox(config={"type": "native", "tangram": {"spec": {"cpus": 1}}}, tool_schema=schema)
    resp, _, metrics = await tool.execute("id", {"text": "x"})
    assert resp.text in ("[0]", "[1]") and metrics["tangram_units"] == 0

    with pytest.raises(SpecError, match="unknown key"):
        TangramTool(config={"type": "native", "tangram": {"spec": {"cpus": 1}, "cpu": 2}}, tool_schema=schema)
    with pytest.raises(SpecError, match="tangram.spec"):
        TangramTool(config={"type": "native", "tangram": {}}, tool_schema=schema)
    plain = TangramTool(config={"type": "native", "tangram": {"spec": {"cpus": 1}}}, tool_schema=schema)
    with pytest.raises(SpecError, match="wraps"):
        await plain.execute("id", {})
    # wrapped twice (tangram_tool of a Tangram tool, or `wraps` naming one): each call acquired
    # inside its own acquire and six calls on two cores deadlocked; now refused where it is built
    with pytest.raises(SpecError, match="already runs each call inside tangram.acquire"):
        tverl.tangram_tool(Sandbox, spec=ActionSpec(kind="x", cpus=1))
    with pytest.raises(SpecError, match="already runs each call inside tangram.acquire"):
        TangramTool(config={"type": "native", "tangram": {"spec": {"cpus": 1}, "wraps": Sandbox}}, tool_schema=schema)


@needs_verl
async def test_reward_fn_loaded_by_verl_holds_a_gpu_lease(tmp_path: Path) -> None:
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    (tmp_path / "my_reward.py").write_text(textwrap.dedent('''
        from tangram_sdk.integrations.verl import tangram_reward
        from tangram_sdk.spec import ActionSpec

        CALLS = []

        @tangram_reward(ActionSpec(kind="rm", gpus=1), runtime={"pool": {"gpus": 1}})
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, lease, **kwargs):
            CALLS.append((lease.gpus, kwargs))
            return {"score": float(solution_str == ground_truth), "gpus": list(lease.gpus)}
    '''))
    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": str(tmp_path / "my_reward.py"), "name": "compute_score", "reward_kwargs": {"scale": 2}}}})
    fn = get_custom_reward_fn(config)
    assert fn is not None and inspect.iscoroutinefunction(fn)  # what veRL's reward managers check
    out = await fn(data_source="gsm8k", solution_str="4", ground_truth="4", extra_info={})
    assert out == {"score": 1.0, "gpus": [0]}
    from tangram_sdk.integrations import shutdown

    await shutdown()


# -- always: framework-free pieces and the missing-framework path -------------------------------------
async def test_reward_wrapper_without_verl(tangram: Tangram) -> None:
    spec_seen: list[str] = []

    def spec_for(**kw: Any) -> ActionSpec:
        spec_seen.append(kw["data_source"])
        return ActionSpec(kind="judge", quotas={"search": 1})

    @tverl.tangram_reward(spec_for)
    async def compute_score(data_source: str, solution_str: str, ground_truth: str,
                            extra_info: Any = None) -> float:
        lease = current_lease()
        assert lease is not None and lease.quotas == {"search": 1}
        return 1.0

    assert inspect.iscoroutinefunction(compute_score)
    scores = await asyncio.gather(*(compute_score(data_source="d", solution_str="s", ground_truth="g")
                                    for _ in range(3)))
    assert scores == [1.0] * 3 and spec_seen == ["d"] * 3
    with pytest.raises(SpecError):
        tverl.tangram_reward(42)  # type: ignore[arg-type]


async def test_agent_loop_mixin_acquires_for_non_tool_actions(tangram: Tangram) -> None:
    class Base:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.args = args

    class MyLoop(tverl.TangramAgentLoopMixin, Base):
        pass

    loop = MyLoop("cfg", tangram={"timeout": 5})
    assert loop.args == ("cfg",) and loop.tangram_timeout == 5.0
    async with loop.tangram_action(ActionSpec(kind="interaction", cpus=1)) as lease:
        assert current_lease() is lease and len(lease.cpus) == 1
    if HAVE_VERL:  # the mixin composes with the real AgentLoopBase (not instantiated: needs a model)
        from verl.experimental.agent_loop.agent_loop import AgentLoopBase

        class Real(tverl.TangramAgentLoopMixin, AgentLoopBase):
            async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
                raise NotImplementedError

        assert Real.__mro__[1] is tverl.TangramAgentLoopMixin and "tangram" in inspect.signature(Real).parameters


def test_missing_verl_raises_integration_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tverl, "_lazy_classes", {})
    for mod in ("verl.tools.base_tool", "verl.tools.schemas"):
        monkeypatch.setitem(sys.modules, mod, None)  # makes `import mod` fail like a missing package
    with pytest.raises(IntegrationUnavailable, match="pip install verl") as info:
        from tangram_sdk.integrations.verl import TangramTool  # noqa: F401
    assert info.value.framework == "verl"
    with pytest.raises(IntegrationUnavailable):
        tverl._error_result("t", ValueError("x"))
    with pytest.raises(AttributeError):
        tverl.NoSuchThing  # noqa: B018


@pytest.mark.skipif(HAVE_VERL, reason="verl is installed: the simulated-missing test covers this path")
def test_verl_really_missing() -> None:
    with pytest.raises(IntegrationUnavailable, match="pip install verl"):
        tverl.TangramTool  # noqa: B018
