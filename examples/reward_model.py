"""Reward models with evict-on-execution: services kept in host memory, restored per action.

Three small torch "reward models" share two devices whose memory budget holds only one model
each. An action names its service; the scheduler prefers a device where that service is already
resident, and the GPU manager restores it there (evicting the least recently used idle model) when
it is not. Scores are bit-identical however many times a model moved.

Runs on the CPU (devices are "cpu" with explicit budgets); on a CUDA machine pass
``devices={0: "cuda:0", 1: "cuda:1"}`` and drop the budget. Needs: pip install 'tangram-sdk[torch]'.
Run:  python examples/reward_model.py
"""

from __future__ import annotations

import asyncio

from tangram_sdk import ActionSpec, Pool, Tangram
from tangram_sdk._optional import require_or_exit

# without torch: one line naming the extra (and the CPU-only index), not a bare ImportError
torch = require_or_exit("torch", needed_by="examples/reward_model.py")
from tangram_sdk import TorchGpuManager  # noqa: E402  (needs torch)

SERVICES = ("rm-math", "rm-code", "rm-chat")


def build(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))


async def main() -> None:
    model_bytes = sum(p.numel() * p.element_size() for p in build(0).parameters())
    gpu = TorchGpuManager(devices={0: "cpu", 1: "cpu"}, memory_budget=int(model_bytes * 1.5))
    for i, name in enumerate(SERVICES):
        gpu.register(name, factory=lambda i=i: build(i))
    batch = torch.randn(8, 256, generator=torch.Generator().manual_seed(7))
    first: dict[str, torch.Tensor] = {}
    async with Tangram(Pool(gpus=2), managers=[gpu]) as tangram:
        async def score(name: str, k: int) -> None:
            async with tangram.acquire(ActionSpec(kind="score", gpus=1, service=name, duration=0.01)) as lease:
                out = await lease.call(batch)
                ref = first.setdefault(name, out)
                same = torch.equal(out, ref)
                print(f"call {k:2d} {name}: on GPU {lease.gpus[0]}, bit-identical to first call: {same}")
                assert same

        calls = [SERVICES[k % 3] if k % 4 else SERVICES[0] for k in range(12)]  # rm-math is hot
        for k in range(0, len(calls), 3):
            await asyncio.gather(*(score(n, k + j) for j, n in enumerate(calls[k:k + 3])))
        st = gpu.statistics()
        print(f"restores: {st['restores']}, evictions: {st['evictions']}, warm hits: {st['hits']}")
        stats = tangram.statistics()
        print(f"completed: {stats['completed']}, failed: {stats['failed']}")


if __name__ == "__main__":
    asyncio.run(main())
