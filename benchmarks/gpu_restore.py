"""Evict-on-execution benchmark: restore/evict bandwidth vs a raw pinned copy, and scoring throughput.

Part 1 - for each size: a module of that many bytes (64 weight tensors + 64 small biases, so the
per-tensor overhead is in the number) is registered once; we time (a) a raw pinned host->device
copy of the same bytes (allocate + copy_(non_blocking) + sync), (b) HostStore.restore / evict, and
(c) a cold restore through TorchGpuManager.apply (thread hop and accounting included). Target:
restore GB/s >= 80% of raw.

Part 2 - 9 scoring services on 2 devices under evict-on-execution (memory budget for
``--resident-per-device`` services per device, LRU eviction, warm-first pick) vs one dedicated,
always-warm device per service. Reports req/s and req/s per device occupied.

On a machine without CUDA every "device" is ``cpu``: restores are host-to-host copies and all
"devices" share the same cores. The output says so.

    python benchmarks/gpu_restore.py --sizes-mb 16,64            # CPU, small
    python benchmarks/gpu_restore.py                             # CUDA: 512..8192 MB
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from tangram_sdk.lease import Lease
from tangram_sdk.managers import _torch_store as ts
from tangram_sdk.managers.base import ManagerContext
from tangram_sdk.managers.gpu import TorchGpuManager
from tangram_sdk.pool import Pool
from tangram_sdk.scheduler.decisions import Grant
from tangram_sdk.scheduler.events import ServiceResidency
from tangram_sdk.spec import ActionSpec

MB = 1 << 20


class Blob(torch.nn.Module):
    """``nbytes`` of fp16 weights in 64 tensors plus 64 tiny biases (a model-like tensor count)."""

    def __init__(self, nbytes: int, n: int = 64) -> None:
        super().__init__()
        per = max(1, nbytes // 2 // n)
        self.w = torch.nn.ParameterList(torch.nn.Parameter(torch.empty(per, dtype=torch.float16)) for _ in range(n))
        self.b = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(64, dtype=torch.float16)) for _ in range(n))


class Scorer(torch.nn.Module):
    def __init__(self, d: int, layers: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(*[torch.nn.Linear(d, d, dtype=dtype) for _ in range(layers)])
        self.head = torch.nn.Linear(d, 1, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.body:
            x = torch.tanh(layer(x))
        return self.head(x).squeeze(-1)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


_ids = iter(range(1, 1 << 40))


def grant_lease(service: str, gpus: tuple[int, ...]) -> tuple[Grant, Lease]:
    aid = next(_ids)
    spec = ActionSpec(kind="score", gpus=len(gpus), service=service)
    return (Grant(aid, gpus=gpus, restore=True),
            Lease(aid, spec, cpus=(), gpus=gpus, units=0, memory=0, quotas=(), queued_s=0.0, granted_at=0.0))


async def bandwidth(sizes_mb: list[int], repeats: int, device: str) -> list[dict[str, Any]]:
    rows = []
    pinned = device.startswith("cuda")
    for size in sizes_mb:
        store = ts.HostStore(Blob(size * MB))
        rep = store.make_replica(device)
        nbytes = store.footprint  # the raw copy moves exactly the bytes a restore moves
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)

        def raw(nbytes: int = nbytes, src: torch.Tensor = src) -> None:
            dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
            dst.copy_(src, non_blocking=pinned)
            if pinned:
                torch.cuda.current_stream(torch.device(device)).synchronize()
            del dst

        raw()  # warm-up: first touch of the memory, allocator growth
        store.restore([rep])
        store.evict([rep])
        raws, restores, evicts = [], [], []
        for _ in range(repeats):  # interleaved, so drift hits both alike
            sync(device)
            t0 = time.perf_counter()
            raw()
            raws.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.restore([rep])
            restores.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.evict([rep])
            sync(device)
            evicts.append(time.perf_counter() - t0)
        del src
        t_raw, t_restore, t_evict = (statistics.median(x) for x in (raws, restores, evicts))
        # through the manager: cold applies alternating two services with a one-service budget
        events: list[Any] = []
        mgr = TorchGpuManager(devices={0: device}, memory_budget=store.footprint)
        del store, rep
        mgr.register("x", module=Blob(size * MB))
        mgr.register("y", module=Blob(size * MB))
        await mgr.start(ManagerContext(Pool(gpus=1), events.append))
        for i in range(repeats + 2):
            g, lease = grant_lease("xy"[i % 2], (0,))
            await mgr.apply(g, lease)
            await mgr.release(g, lease)
        await mgr.aclose()
        mgr_s = [e.restore_s for e in events if isinstance(e, ServiceResidency) and e.restore_s][2:]
        t_mgr = statistics.median(mgr_s)
        gb = nbytes / 1e9
        rows.append({"MB": size, "raw ms": t_raw * 1e3, "raw GB/s": gb / t_raw, "restore ms": t_restore * 1e3,
                     "restore GB/s": gb / t_restore, "% of raw": 100 * t_raw / t_restore,
                     "evict ms": t_evict * 1e3, "mgr restore ms": t_mgr * 1e3,
                     "mgr % of raw": 100 * t_raw / t_mgr})
    return rows


async def scoring(args: argparse.Namespace, device: str) -> list[dict[str, Any]]:
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    d = args.dim
    per_layer = d * d * (2 if dtype == torch.float16 else 4)
    layers = max(1, args.service_mb * MB // per_layer)
    names = [f"rm{i}" for i in range(args.services)]
    modules = {}
    for i, n in enumerate(names):
        torch.manual_seed(i)
        modules[n] = Scorer(d, layers, dtype)
    rng = random.Random(0)
    work = [rng.choice(names) for _ in range(args.requests)]
    x = torch.randn(args.batch, d, dtype=dtype)
    rows = []
    for mode, ndev in (("evict-on-execution", args.eoe_devices), ("dedicated", args.services)):
        rows.append(await run_mode(mode, ndev, modules, work, x, args))
    return rows


async def run_mode(mode: str, ndev: int, modules: dict[str, torch.nn.Module], work: list[str],
                   x: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """One worker per device pulls requests: EOE prefers a request whose service is warm on its
    device (the scheduler does this with ServiceResidency); dedicated serves only its own service."""
    names = list(modules)
    device = args.device
    first = modules[names[0]]
    tensors = {id(t): t for t in [*first.parameters(), *first.buffers()]}.values()
    fp = sum(-(-t.numel() * t.element_size() // ts.ALIGN) * ts.ALIGN for t in tensors)
    budget = fp if mode == "dedicated" else fp * args.resident_per_device
    mgr = TorchGpuManager(devices={i: device for i in range(ndev)}, memory_budget=budget)
    for n in names:
        mgr.register(n, module=modules[n])
    await mgr.start(ManagerContext(Pool(gpus=ndev), lambda e: None))
    if mode == "dedicated":  # warm everything first: dedicated devices never restore
        for i, n in enumerate(names):
            g, lease = grant_lease(n, (i,))
            await mgr.apply(g, lease)
            await mgr.release(g, lease)
    queue = collections.deque(work)
    done = 0

    def pick(dev: int) -> str | None:
        if not queue:
            return None
        if mode == "dedicated":
            for k, n in enumerate(queue):
                if names.index(n) == dev:
                    del queue[k]
                    return n
            return None
        warm = set(mgr.statistics()["devices"][dev]["resident"])
        for k, n in enumerate(list(queue)[: args.window]):
            if n in warm:
                del queue[k]
                return n
        return queue.popleft()

    async def worker(dev: int) -> None:
        nonlocal done
        while (n := pick(dev)) is not None:
            g, lease = grant_lease(n, (dev,))
            await mgr.apply(g, lease)
            try:
                await lease.call(x)
            finally:
                await mgr.release(g, lease)
            done += 1

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for dev in range(ndev):
            tg.start_soon(worker, dev)
    wall = time.perf_counter() - t0
    st = mgr.statistics()
    await mgr.aclose()
    return {"mode": mode, "devices": ndev, "requests": done, "wall s": wall, "req/s": done / wall,
            "req/s/device": done / wall / ndev, "restores": st["restores"],
            "evictions": st["evictions"], "warm hits %": 100 * st["hits"] / max(1, done)}


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    fmt = [[f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    w = [max(len(c), *(len(f[i]) for f in fmt)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w[i]) for i, c in enumerate(cols)), "  ".join("-" * x for x in w)]
    lines += ["  ".join(v.rjust(w[i]) for i, v in enumerate(f)) for f in fmt]
    return "\n".join(lines)


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes-mb", default="512,1024,2048,4096,8192" if cuda else "16,64,256")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--device", default="cuda:0" if cuda else "cpu")
    p.add_argument("--services", type=int, default=9)
    p.add_argument("--eoe-devices", type=int, default=2)
    p.add_argument("--resident-per-device", type=int, default=3)
    p.add_argument("--service-mb", type=int, default=1024 if cuda else 16)
    p.add_argument("--dim", type=int, default=4096 if cuda else 1024)
    p.add_argument("--batch", type=int, default=256 if cuda else 64)
    p.add_argument("--requests", type=int, default=360 if cuda else 180)
    p.add_argument("--window", type=int, default=16, help="EOE: look this far down the queue for a warm service")
    p.add_argument("--skip-scoring", action="store_true")
    args = p.parse_args()
    dev = args.device
    if dev.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name(torch.device(dev))} ({dev}); host buffers pinned")
    else:
        print("device: cpu - NO CUDA: 'device' copies are host-to-host memcpy and all devices share the "
              f"same {torch.get_num_threads()} CPU threads; numbers show overhead, not PCIe bandwidth")
    print(f"torch {torch.__version__}\n")
    sizes = [int(s) for s in args.sizes_mb.split(",") if s]
    print("restore / evict (median of", args.repeats, "runs)")
    print(table(anyio.run(bandwidth, sizes, args.repeats, dev)))
    if not args.skip_scoring:
        print(f"\nscoring: {args.services} services x {args.service_mb} MB, {args.requests} requests of batch "
              f"{args.batch}; EOE budget = {args.resident_per_device} services per device")
        print(table(anyio.run(scoring, args, dev)))


if __name__ == "__main__":
    main()
