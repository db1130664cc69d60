"""Two real Ray nodes (``ray.cluster_utils.Cluster``: two raylets on this machine): one agent pinned to
each, grants stay on their node, and removing a node takes its resources out of the pool and fails
its running action with NodeLostError. Skipped without Ray, except under CI=true."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

if os.environ.get("CI") == "true":
    import ray
else:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'tangram-sdk[ray]')")

from tangram_sdk import ActionSpec, Pool
from tangram_sdk.ray import NodeLostError, RemoteTangram, deploy

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

NS = "tangram-multinode"


@pytest.fixture(scope="module")
def two_nodes() -> Any:
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    small = {"object_store_memory": 100 * 1024 * 1024}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, **small})
    c.add_node(num_cpus=1, **small)
    ray.init(address=c.address, namespace=NS, log_to_driver=False)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


async def test_agents_per_node_and_node_loss(two_nodes: Any) -> None:
    cl = deploy("mn", namespace=NS, pool=Pool(cpus=2), check_invariants=True)
    try:
        s = cl.statistics()
        assert len(s["nodes"]) == 2 and all(n["cpus_total"] == 2 for n in s["nodes"].values())
        sched = s["scheduler_node"]
        driver = ray.get_runtime_context().get_node_id()
        assert sched == driver  # deploy pins the scheduler actor to the caller's node
        other = next(k for k in s["nodes"] if k != sched)  # neither the scheduler's nor the driver's
        victim = next(n for n in two_nodes.list_all_nodes() if n.node_id == other)
        async with RemoteTangram("mn", namespace=NS) as tg:
            for label in s["nodes"]:  # each grant carries its node, and the node's agent runs there
                async with tg.acquire(ActionSpec(kind="x", cpus=2), node=label) as lease:
                    assert lease.attachment("node") == label == lease.attachment("ray_node_id")
            outcome: dict[str, Any] = {}

            async def hold() -> None:
                try:
                    async with tg.acquire(ActionSpec(kind="x", cpus=2), node=other):
                        outcome["held"] = True
                        await asyncio.sleep(60)
                except NodeLostError as exc:
                    outcome["err"] = exc

            h = asyncio.create_task(hold())
            while "held" not in outcome:
                await asyncio.sleep(0.01)
            t = time.monotonic()
            two_nodes.remove_node(victim)
            await asyncio.wait_for(h, 30)
            assert "left the pool" in str(outcome["err"]), outcome
            print(f"node loss noticed after {time.monotonic() - t:.2f} s")
            s = await tg.statistics()
            assert s["nodes"][other]["alive"] is False and s["nodes"][sched]["alive"] is True
            assert s["held"] == 0 and s["lost"] == 1
            async with tg.acquire(ActionSpec(kind="x", cpus=2)) as lease:  # the survivor serves
                assert lease.attachment("node") == sched
        assert cl.check_invariants() == []
    finally:
        cl.shutdown()
