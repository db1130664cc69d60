"""A veRL tool and a veRL function tool for the multi-worker tests (imported inside Ray workers:
tests/test_integrations_ray.py puts tests/ on their PYTHONPATH).

The tool knows nothing of tangram: it is wrapped from the YAML (``tangram.wraps``) and reads its
grant with ``current_lease()``. Every call records what it held and when (CLOCK_MONOTONIC is one
clock for every process of the machine), so the test can check from timestamps that no core and no
quota slot was ever held twice at once across workers.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from tangram_sdk import ActionSpec
from tangram_sdk.integrations import current_lease

LOG: list[dict[str, Any]] = []
HOLDING: dict[str, asyncio.Event] = {}


def record(tool: str, lease: Any, t0: float, t1: float, tag: Any = None) -> None:
    LOG.append({"pid": os.getpid(), "tool": tool, "cpus": list(lease.cpus), "api": lease.quotas.get("api", 0),
                "t0": t0, "t1": t1, "tag": tag})


def spec_for(tool_name: str, parameters: dict[str, Any]) -> ActionSpec:
    """One call's demand, from the model's arguments: ``cpus`` cores, and one ``api`` slot if asked."""
    return ActionSpec(kind=tool_name, cpus=int(parameters["cpus"]),
                      quotas={"api": 1} if parameters.get("api") else None)


class RecordingTool(BaseTool):
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
        lease = current_lease()
        assert lease is not None, "the tool body ran without a lease"
        t0 = time.monotonic()
        tag = parameters.get("tag")
        if parameters.get("block"):
            HOLDING.setdefault(str(tag), asyncio.Event()).set()
            await asyncio.sleep(3600)  # held until the worker is killed or the call cancelled
        await asyncio.sleep(float(parameters.get("hold", 0.01)))
        record(self.name, lease, t0, time.monotonic(), tag)
        return ToolResponse(text=f"ran on {list(lease.cpus)}"), 0.0, {}
