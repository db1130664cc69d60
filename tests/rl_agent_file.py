"""An OpenRLHF agent file (``--train.agent_func_path``) for the multi-worker tests: OpenRLHF builds
``AgentExecutor()`` from it in every rollout actor, and every step names the job's pool.

Each step records what it held and when (CLOCK_MONOTONIC, one clock for the whole machine).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from tangram_sdk import ActionSpec
from tangram_sdk.integrations.openrlhf import with_tangram

POOL = {"pool": {"name": "orlhf-job", "cpus": 4, "quotas": {"api": {"concurrency": 2}}}}
LOG: list[dict[str, Any]] = []
HOLDING = asyncio.Event()


def step_spec(states: dict[str, Any]) -> ActionSpec:
    """``"<cpus> <api> <hold>"`` in the model's action text -> that many cores (+ an api slot)."""
    cpus, api, _hold = states["action_text"].split()[:3]
    return ActionSpec(kind="step", cpus=int(cpus), quotas={"api": 1} if api == "1" else None)


class Env(AgentInstanceBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.turn = 0

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {"observation": states["observation"]}

    async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        import torch

        lease = kwargs["lease"]
        _cpus, _api, hold = states["action_text"].split()[:3]
        t0 = time.monotonic()
        if hold == "block":
            HOLDING.set()
            await asyncio.sleep(3600)
        await asyncio.sleep(float(hold))
        LOG.append({"pid": os.getpid(), "cpus": list(lease.cpus), "api": lease.quotas.get("api", 0),
                    "t0": t0, "t1": time.monotonic(), "label": states["label"]})
        self.turn += 1
        done = self.turn >= 2
        return {"rewards": torch.tensor(1.0 if done else 0.0), "scores": torch.tensor(1.0),
                "environment_feedback": " ok", "done": done, "sampling_params": states.get("sampling_params"),
                "extra_logs": {"cores": float(len(lease.cpus))}}


class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self) -> None:
        super().__init__(with_tangram(Env, spec_for=step_spec, runtime=POOL))
