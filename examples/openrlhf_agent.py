"""OpenRLHF: an agent whose environment steps run inside ``tangram.acquire``.

This file is an OpenRLHF agent file: pass it as ``--train.agent_func_path examples/openrlhf_agent.py``
and OpenRLHF builds ``AgentExecutor()`` from it. Each ``step`` asks for what the action needs --
a search is one unit of the ``search`` quota, anything else runs a check on 1..N cores -- and the
Tangram of this rollout worker (built from ``RUNTIME`` on first use) decides when it runs.

Run directly (``python examples/openrlhf_agent.py``) it drives OpenRLHF's own
``MultiTurnAgentExecutor`` with a stand-in LLM engine and tokenizer, so it needs openrlhf and CPU
torch but no GPU or model. The pool is named in ``RUNTIME``: in a Ray job (every OpenRLHF rollout
actor is one) it is job-wide, the first actor to step creates the scheduler actor and the others
attach. ``--ray`` shows that: it starts a local Ray cluster first and the same code runs on it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from types import SimpleNamespace
from typing import Any

from tangram_sdk import ActionSpec, Elasticity
from tangram_sdk._optional import require_or_exit
from tangram_sdk.integrations import current_lease

# A missing module ends the example with one line naming the right install: the torch extra for
# torch (the CPU build is enough), openrlhf for OpenRLHF itself.
torch = require_or_exit("torch", needed_by="examples/openrlhf_agent.py")
_agent = require_or_exit("openrlhf.utils.agent", needed_by="examples/openrlhf_agent.py")
AgentInstanceBase, MultiTurnAgentExecutor = _agent.AgentInstanceBase, _agent.MultiTurnAgentExecutor

from tangram_sdk.integrations.openrlhf import with_tangram  # noqa: E402  (after the checks above)

CORES = sorted(os.sched_getaffinity(0))
# One pool for the job, by name: cores for checks, a quota for the search API.
RUNTIME = {"pool": {"name": "openrlhf-demo", "cpus": CORES, "quotas": {"search": {"concurrency": 2, "rate": 50}}}}


def step_spec(states: dict[str, Any]) -> ActionSpec:
    """What one environment step needs, from the action the model just produced."""
    action = states["action_text"]
    if action.startswith("search:"):
        return ActionSpec(kind="search", quotas={"search": 1}, duration=0.05)
    return ActionSpec(kind="check", cpus=1, elastic=Elasticity("cpu", max_units=len(CORES)), duration=0.2)


class AgentInstance(AgentInstanceBase):
    """A two-turn environment: the model searches, then submits an answer that is checked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.turn = 0

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {"observation": states["observation"]}

    async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        lease = kwargs.get("lease") or current_lease()  # with_tangram passes lease=
        action = states["action_text"]
        if action.startswith("search:"):
            await asyncio.sleep(0.05)  # the search API call, holding one quota unit
            feedback = f"\n[search results for {action[7:]!r}]\n"
        else:
            result = await lease.run([sys.executable, "-c", "import os; print(len(os.sched_getaffinity(0)))"])
            feedback = f"\n[checked on {result.stdout.decode().strip()} core(s)]\n"
        self.turn += 1
        done = self.turn >= 2
        reward = torch.tensor(1.0 if done and states["label"] in action else 0.0)
        return {
            "rewards": reward,
            "scores": reward,
            "environment_feedback": feedback,
            "done": done,
            "sampling_params": states.get("sampling_params"),
            "extra_logs": {"cores": float(len(lease.cpus))},
        }


class AgentExecutor(MultiTurnAgentExecutor):
    """What OpenRLHF loads from ``--train.agent_func_path``; built with no arguments."""

    def __init__(self) -> None:
        super().__init__(with_tangram(AgentInstance, spec_for=step_spec, runtime=RUNTIME, timeout=60))


# -- a local demo with stand-ins for the vLLM engine and the tokenizer ---------------------------
class _Tokenizer:
    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str = "pt") -> Any:
        return {"input_ids": torch.tensor([[ord(c) % 100 for c in text]])}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(32 + i % 90) for i in ids)


class _Engine:
    def __init__(self, answer: str) -> None:
        self.turns = [f"search: {answer}?", f"answer: {answer}"]
        self.i = 0

    async def generate(self, prompt_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> Any:
        text = self.turns[min(self.i, 1)]
        self.i += 1
        out = SimpleNamespace(token_ids=list(range(len(text))), text=text, logprobs=None, finish_reason="stop")
        return SimpleNamespace(outputs=[out])


async def demo() -> None:
    from tangram_sdk.integrations import resolve_runtime, shutdown

    executor = AgentExecutor()
    labels = ["paris", "rome", "oslo", "lima"]
    results = await asyncio.gather(*(
        executor.execute(f"Q{i}", label, SimpleNamespace(max_tokens=None, logprobs=None), 1024,
                         _Tokenizer(), _Engine(label))
        for i, label in enumerate(labels)
    ))
    for label, r in zip(labels, results):
        print(f"episode {label}: reward={r['reward']} steps={len(r['action_ranges'])} logs={r['extra_logs']}")
    tangram = await resolve_runtime(RUNTIME)  # a Tangram here, a RemoteTangram in a Ray job
    await asyncio.sleep(0.01)
    print(repr(tangram))
    stats = await tangram.astatistics()
    done = stats["completed"] if "completed" in stats else stats["released"]
    print("completed:", done)
    await shutdown()


if __name__ == "__main__":
    if "--ray" in sys.argv[1:]:
        import ray

        from tangram_sdk.ray import TangramCluster

        local = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": 2, "include_dashboard": False}  # else: join it
        ray.init(namespace="openrlhf-example", log_to_driver=False, **local)
        try:
            asyncio.run(demo())
        finally:
            TangramCluster.get("openrlhf-demo", namespace="openrlhf-example").shutdown()
            ray.shutdown()
    else:
        asyncio.run(demo())
