"""Stand-ins for veRL's AgentLoopWorker and OpenRLHF's RolloutRayActor, run as Ray actors by
tests/test_integrations_ray.py (plain classes here; the test applies ``ray.remote``).

veRL's real ``AgentLoopWorker`` needs a Hugging Face model config and an LLM server client, and
OpenRLHF's ``RolloutRayActor`` imports vLLM: neither builds on this CPU-only machine. So each stand-in
does exactly what the real worker does with tools and agents, with the frameworks' own code:

* ``ToolWorker`` loads its tools with veRL's ``load_all_tools(tool_config_path, function_tool_path)``
  (what ``AgentLoopWorker.__init__`` calls) and calls them through veRL's own
  ``ToolAgentLoop._call_tool`` (create -> execute -> release, errors turned into tool messages);
* ``RolloutWorker`` loads ``AgentExecutor`` from the agent file the way OpenRLHF's
  ``_load_agent_executor`` does and runs episodes with ``MultiTurnAgentExecutor.execute``, the LLM
  engine and tokenizer replaced by stand-ins that answer each turn with a scripted action.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from types import SimpleNamespace
from typing import Any


class ToolWorker:
    def __init__(self, tool_config_path: str, function_tool_path: str | None = None) -> None:
        from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
        from verl.tools.tool_registry import load_all_tools

        tools = load_all_tools(tool_config_path=tool_config_path, function_tool_path=function_tool_path)
        loop = object.__new__(ToolAgentLoop)  # its constructor needs a model; _call_tool reads only these
        loop.tools = {t.name: t for t in tools}
        loop.max_tool_response_length = 10_000
        loop.tool_response_truncate_side = "middle"
        self.agent_loop = loop
        self.tasks: dict[str, asyncio.Task[Any]] = {}

    async def _call(self, name: str, args: dict[str, Any]) -> str:
        from verl.experimental.agent_loop.tool_parser import FunctionCall

        class AgentData:
            pass

        response, _reward, _metrics = await self.agent_loop._call_tool(
            FunctionCall(name=name, arguments=json.dumps(args)), {}, AgentData())
        return str(response.text)

    async def call_many(self, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
        return list(await asyncio.gather(*(self._call(n, a) for n, a in calls)))

    async def start(self, tag: str, name: str, args: dict[str, Any]) -> None:
        """Start a call in the background (``await_holding``/``result``/``cancel`` follow it)."""
        self.tasks[tag] = asyncio.get_running_loop().create_task(self._call(name, {**args, "tag": tag}))

    async def await_holding(self, tag: str, timeout: float = 30.0) -> bool:
        import rl_verl_tools

        ev = rl_verl_tools.HOLDING.setdefault(tag, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), timeout)  # test code: a bound on the test, not the SDK
        except asyncio.TimeoutError:
            return False
        return True

    async def result(self, tag: str) -> str:
        return str(await self.tasks.pop(tag))

    async def records(self) -> list[dict[str, Any]]:
        import rl_verl_tools

        return list(rl_verl_tools.LOG)

    def pid(self) -> int:
        return os.getpid()


# -- OpenRLHF ---------------------------------------------------------------------------------------
def load_agent_executor(agent_func_path: str) -> Any:
    """OpenRLHF 0.11.2's ``_load_agent_executor`` (openrlhf/trainer/ray/vllm_engine.py), which cannot
    be imported here because its module imports vLLM."""
    from openrlhf.utils.agent import AgentExecutorBase

    assert agent_func_path.endswith(".py"), "Agent path must be a Python file"
    spec = importlib.util.spec_from_file_location("agent_module", agent_func_path)
    assert spec is not None and spec.loader is not None
    agent_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_module)
    assert hasattr(agent_module, "AgentExecutor"), "Agent module must contain AgentExecutor class"
    agent_executor_cls = agent_module.AgentExecutor
    assert issubclass(agent_executor_cls, AgentExecutorBase), "AgentExecutor must inherit from AgentExecutorBase"
    return agent_executor_cls(), agent_module


class Tokenizer:
    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str = "pt") -> Any:
        import torch

        return {"input_ids": torch.tensor([[ord(c) % 97 for c in text]])}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


class Engine:
    """Stands in for the vLLM engine: turn i of an episode answers ``actions[i]``."""

    def __init__(self, actions: list[str]) -> None:
        self.actions = actions
        self.i = 0

    async def generate(self, prompt_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> Any:
        text = self.actions[min(self.i, len(self.actions) - 1)]
        self.i += 1
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1, 2, 3], text=text, logprobs=None,
                                                        finish_reason="stop")])


class RolloutWorker:
    def __init__(self, agent_func_path: str) -> None:
        self.executor, self.module = load_agent_executor(agent_func_path)
        self.tasks: dict[str, asyncio.Task[Any]] = {}

    async def _episode(self, label: str, actions: list[str]) -> float:
        params = SimpleNamespace(max_tokens=None, logprobs=None)
        out = await self.executor.execute("prompt", label, params, 4096, Tokenizer(), Engine(actions))
        return float(out["reward"])

    async def episodes(self, runs: list[tuple[str, list[str]]]) -> list[float]:
        return list(await asyncio.gather(*(self._episode(label, acts) for label, acts in runs)))

    async def start(self, tag: str, actions: list[str]) -> None:
        self.tasks[tag] = asyncio.get_running_loop().create_task(self._episode(tag, actions))

    async def await_holding(self, timeout: float = 30.0) -> bool:
        try:
            await asyncio.wait_for(self.module.HOLDING.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def result(self, tag: str) -> float:
        return float(await self.tasks.pop(tag))

    async def records(self) -> list[dict[str, Any]]:
        return list(self.module.LOG)

    def pid(self) -> int:
        return os.getpid()
