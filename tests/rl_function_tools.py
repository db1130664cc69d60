"""A veRL ``@function_tool`` file (veRL loads it from ``rollout.multi_turn.function_tool_path``).

A function tool has no config of its own, so it names the job's pool in code: ``action()`` with
``runtime={"pool": NAME}`` attaches to the pool the tool YAML defines (install() would do too).
"""

from __future__ import annotations

import asyncio
import time

from verl.tools.function_tool import function_tool

from tangram_sdk import ActionSpec
from tangram_sdk.integrations import action

POOL = "verl-job"


@function_tool
async def lookup(query: str) -> str:
    """Look a term up in the search API (one slot of the job-wide ``api`` quota).

    Args:
        query: what to look up.
    """
    import rl_verl_tools

    async with action(ActionSpec(kind="lookup", quotas={"api": 1}), runtime={"pool": POOL}) as lease:
        t0 = time.monotonic()
        await asyncio.sleep(0.01)
        rl_verl_tools.record("lookup", lease, t0, time.monotonic(), query)
    return f"results for {query}"
