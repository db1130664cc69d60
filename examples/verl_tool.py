"""veRL: a code-execution tool whose every call runs inside ``tangram.acquire``.

What a veRL user writes: a tool class (here ``CodeTool``, a ``TangramTool`` whose body runs the
code with ``lease.run`` on the cores it was granted) and the usual tool YAML, with tangram's
settings under the tool's ``config.tangram``. The YAML below is loaded with veRL's own
``initialize_tools_from_config``; the rollout is simulated by calling each tool the way veRL's
``ToolAgentLoop`` does (create -> execute -> release), so it runs without a model or a GPU.

The tool code does not know which Tangram it runs on: by default this process's own; with
``--ray`` a local Ray cluster is started, the job-wide scheduler actor deployed, and the same calls
draw on it through a ``RemoteTangram`` (what every veRL ``AgentLoopWorker`` of a job would share).

Needs: pip install 'tangram-sdk[torch]' verl cachetools fastapi uvicorn (the CPU build of torch is
enough, see README); ``--ray`` also the ray extra.
Run:  python examples/verl_tool.py [--ray]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import textwrap
from typing import Any

from tangram_sdk import Pool, Quota, Tangram
from tangram_sdk._optional import require_or_exit
from tangram_sdk.integrations import AnyTangram, install

# A missing module ends the example with one line naming the right install (veRL needs torch:
# the torch extra, whose CPU build is enough).
require_or_exit("torch", needed_by="examples/verl_tool.py")
ToolResponse = require_or_exit("verl.tools.schemas", needed_by="examples/verl_tool.py").ToolResponse
initialize_tools_from_config = require_or_exit(
    "verl.tools.tool_registry", needed_by="examples/verl_tool.py").initialize_tools_from_config

from tangram_sdk.integrations.verl import TangramTool  # noqa: E402  (after the checks above)

CORES = sorted(os.sched_getaffinity(0))


class CodeTool(TangramTool):  # type: ignore[misc, valid-type]
    """Runs the agent's Python snippet on the cores its lease holds."""

    async def execute_with_lease(self, instance_id: str, parameters: dict[str, Any], lease: Any,
                                 **kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        result = await lease.run([sys.executable, "-c", parameters["code"]], timeout=10)
        text = (result.stdout or result.stderr).decode(errors="replace").strip()
        return ToolResponse(text=text), 0.0, {"exit_code": result.exit_code}


TOOL_YAML = textwrap.dedent(f"""
    tools:
      - class_name: "__main__.CodeTool"
        config:
          type: native
          tangram:
            spec: {{kind: code, cpus: 1, elastic: {{resource: cpu, max_units: {len(CORES)}, parallel: 0.8}}}}
            from_parameters: {{max_units: cores}}   # the agent says how many cores it could use
            timeout: 30
        tool_schema:
          type: function
          function:
            name: code_interpreter
            description: Run a Python snippet and return its output.
            parameters:
              type: object
              properties:
                code: {{type: string, description: The code to run.}}
                cores: {{type: integer, description: How many cores the code can use.}}
              required: [code, cores]
""")

SNIPPET = "import os; print('ran on', len(os.sched_getaffinity(0)), 'core(s)')"


async def call_tool(tool: Any, arguments: dict[str, Any]) -> str:
    """What veRL's ToolAgentLoop._call_tool does for a BaseTool."""
    instance_id, _ = await tool.create(create_kwargs={})
    try:
        response, _reward, _metrics = await tool.execute(instance_id, arguments)
    except Exception as exc:  # noqa: BLE001 - veRL turns a raising tool into an error message for the agent
        return f"Error executing tool: {exc}"
    finally:
        await tool.release(instance_id)
    return str(response.text)


def load_tools() -> list[Any]:
    """Write the tool YAML and load it with veRL's own loader, as a veRL rollout worker does."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tool_config.yaml")
        with open(path, "w") as f:
            f.write(TOOL_YAML)
        return list(initialize_tools_from_config(path))


async def rollout(tangram: AnyTangram) -> None:
    """The same code for a local Tangram and the job-wide RemoteTangram."""
    (tool,) = load_tools()
    install(tangram)  # every TangramTool in this process now draws on this pool
    calls = [{"code": SNIPPET, "cores": 1 + i % len(CORES)} for i in range(6)]
    calls.append({"code": SNIPPET, "cores": "all"})  # malformed: the agent gets an error back
    outputs = await asyncio.gather(*(call_tool(tool, args) for args in calls))
    for i, text in enumerate(outputs):
        print(f"call {i}: {text}")
    await asyncio.sleep(0.01)
    print(repr(tangram))
    stats = await tangram.astatistics()
    # a local Tangram counts completed actions; the job-wide actor counts the leases given back
    done = stats["completed"] if "completed" in stats else stats["released"]
    print("completed:", done)
    install(None)


async def main() -> None:
    async with Tangram(Pool(cpus=CORES, quotas={"search": Quota(concurrency=4)})) as tangram:
        await rollout(tangram)


def main_ray() -> None:
    import ray

    from tangram_sdk.ray import RemoteTangram, deploy

    local = {} if os.environ.get("RAY_ADDRESS") else {"num_cpus": 2, "include_dashboard": False}  # else: join it
    ray.init(namespace="verl-example", log_to_driver=False, **local)
    cluster = deploy("verl-example", namespace="verl-example", pool=Pool(cpus=CORES),
                     quotas={"search": Quota(concurrency=4)})

    async def run() -> None:
        async with RemoteTangram("verl-example", namespace="verl-example") as tangram:
            await rollout(tangram)

    try:
        asyncio.run(run())
    finally:
        cluster.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    if "--ray" in sys.argv[1:]:
        main_ray()
    else:
        asyncio.run(main())
