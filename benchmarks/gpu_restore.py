"""Evict-on-execution benchmark: restore/evict bandwidth vs a raw pinned copy, and scoring throughput.

Part 1 - for each size: a module of that many bytes (64 weight tensors + 64 small biases, so the
per-tensor overhead is in the number) is registered once; we time (a) a raw host->device copy of the
same bytes from the same kind of host memory (exact-size, page-locked on CUDA: allocate + copy_(non_
blocking) + sync), (b) HostStore.restore / evict, and (c) a cold restore through TorchGpuManager.apply
(thread hop and accounting included). Target: restore GB/s >= 80% of raw. Every host and device
buffer of a size is freed before the next one ("host MB after" shows it); a size whose host copies
would not fit in the available host memory is skipped, not attempted.

Part 2 - 9 scoring services on 2 pool GPUs under evict-on-execution (memory budget for
``--resident-per-device`` services per device, LRU eviction, warm-first pick) vs one dedicated,
always-warm pool GPU per service. Pool GPUs map to distinct CUDA devices where there are enough
(``cuda:i % device_count``); the output says how many devices they really used. Budgets are whole
multiples of a service's charge (its buffer rounded as the caching allocator rounds it). It also
reports, per service, the charge estimated before the first restore, the charge measured from the
restored storage, and (on CUDA) the ``memory_allocated`` growth of that isolated restore.

On a machine without CUDA every "device" is ``cpu``: restores are host-to-host copies and all
"devices" share the same cores. The output says so.

    python benchmarks/gpu_restore.py --sizes-mb 16,64                 # CPU, small
    python benchmarks/gpu_restore.py                                  # CUDA: 512, 2048, 8192 MB
    python benchmarks/gpu_restore.py --sizes-mb 512 --skip-scoring --json out.json
    python benchmarks/gpu_restore.py --report out/*.json --pytest out/pytest.txt   # one table
    bash scripts/gpu-check.sh                                         # the whole device check
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
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
TARGET = 80.0  # restore as % of the raw copy


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


def allocated(device: str) -> int | None:
    return int(torch.cuda.memory_allocated(torch.device(device))) if device.startswith("cuda") else None


def host_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def host_stats() -> dict[str, Any]:
    """torch's caching host allocator (pin_memory=True) and this SDK's own page-locked buffers."""
    out: dict[str, Any] = {"sdk": ts.host_memory()}
    if torch.cuda.is_available():
        st = torch.cuda.host_memory_stats()  # empty until CUDA is initialised
        out["torch"] = {k: v for k, v in st.items()
                        if k.startswith(("allocated_bytes.", "num_host_alloc", "num_host_free"))
                        and not k.endswith(("peak", "allocated", "freed"))}
    return out


_ids = iter(range(1, 1 << 40))


def grant_lease(service: str, gpus: tuple[int, ...]) -> tuple[Grant, Lease]:
    aid = next(_ids)
    spec = ActionSpec(kind="score", gpus=len(gpus), service=service)
    return (Grant(aid, gpus=gpus, restore=True),
            Lease(aid, spec, cpus=(), gpus=gpus, units=0, memory=0, quotas=(), queued_s=0.0, granted_at=0.0))


def raw_copy(src: torch.Tensor, device: str) -> None:
    """The simplest thing a user could do: allocate on the device, one copy, wait."""
    dst = torch.empty(src.numel(), dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=src.is_pinned() if device.startswith("cuda") else False)
    sync(device)
    del dst


async def bandwidth_one(size: int, repeats: int, device: str) -> dict[str, Any]:
    need = 3 * size * MB  # the store, then the raw source; later two services (one at a time)
    avail = host_available()
    if avail is not None and need > 0.8 * avail:
        return {"MB": size, "skipped": f"needs ~{need / 1e9:.1f} GB host, {avail / 1e9:.1f} GB available"}
    host0 = ts.host_memory()["bytes"]
    store = ts.HostStore(Blob(size * MB), name="blob")
    rep = store.make_replica(device)
    nbytes = store.footprint  # the raw copy moves exactly the bytes a restore moves
    src = ts.pinned_host_buffer(nbytes, store.pinned)  # the same kind of host memory as the store's
    raw_copy(src, device)  # warm-up: first touch of the memory, allocator growth
    store.restore([rep])
    store.evict([rep])
    raws, restores, evicts = [], [], []
    for _ in range(repeats):  # interleaved, so drift hits both alike
        sync(device)
        t0 = time.perf_counter()
        raw_copy(src, device)
        raws.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.restore([rep])
        restores.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.evict([rep])
        sync(device)
        evicts.append(time.perf_counter() - t0)
    pinned = store.pinned
    del src, store, rep
    gc.collect()
    t_raw, t_restore, t_evict = (statistics.median(x) for x in (raws, restores, evicts))
    # through the manager: cold applies alternating two services with a one-service budget
    events: list[Any] = []
    mgr = TorchGpuManager(devices={0: device}, memory_budget=ts.charge(nbytes))
    mgr.register("x", module=Blob(size * MB))
    mgr.register("y", module=Blob(size * MB))
    assert mgr.footprint("x") == ts.charge(nbytes)
    await mgr.start(ManagerContext(Pool(gpus=1), events.append))
    for i in range(repeats + 2):
        g, lease = grant_lease("xy"[i % 2], (0,))
        await mgr.apply(g, lease)
        await mgr.release(g, lease)
    failures = mgr.statistics()["failures"]
    await mgr.aclose()
    del mgr, lease
    # a worker thread may still hold the last copy's frame for a moment on a loaded machine: a
    # buffer kept alive stays past this, one freed late does not
    for _ in range(40):
        gc.collect()
        if ts.host_memory()["bytes"] == host0:
            break
        await anyio.sleep(0.05)
    mgr_s = [e.restore_s for e in events if isinstance(e, ServiceResidency) and e.restore_s][2:]
    t_mgr = statistics.median(mgr_s)
    gb = nbytes / 1e9
    return {"MB": size, "raw ms": t_raw * 1e3, "raw GB/s": gb / t_raw, "restore ms": t_restore * 1e3,
            "restore GB/s": gb / t_restore, "% of raw": 100 * t_raw / t_restore,
            "evict ms": t_evict * 1e3, "mgr restore ms": t_mgr * 1e3, "mgr % of raw": 100 * t_raw / t_mgr,
            "failures": failures, "pinned": pinned,
            "host MB after": (ts.host_memory()["bytes"] - host0) / MB}


async def bandwidth(sizes_mb: list[int], repeats: int, device: str) -> list[dict[str, Any]]:
    return [await bandwidth_one(size, repeats, device) for size in sizes_mb]


def packed_charge(module: torch.nn.Module) -> int:
    """What one copy of ``module`` is charged on a device: its 256-byte-aligned flat buffer, rounded
    as the caching allocator rounds it (a budget of the bare size would be 256 B short)."""
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}.values()
    return ts.charge(sum(-(-t.numel() * t.element_size() // ts.ALIGN) * ts.ALIGN for t in tensors))


def pool_devices(n: int, device: str) -> dict[int, str]:
    """Pool GPU i -> a distinct CUDA device where there are enough (else they share, round robin)."""
    if not device.startswith("cuda"):
        return {i: device for i in range(n)}
    count = torch.cuda.device_count()
    return {i: f"cuda:{i % count}" for i in range(n)}


async def scoring(args: argparse.Namespace, device: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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
    rows, charges = [], []
    for mode, ndev in (("evict-on-execution", args.eoe_devices), ("dedicated", args.services)):
        rows.append(await run_mode(mode, ndev, modules, work, x, args, charges))
        gc.collect()
    return rows, charges


async def run_mode(mode: str, ndev: int, modules: dict[str, torch.nn.Module], work: list[str],
                   x: torch.Tensor, args: argparse.Namespace, charges: list[dict[str, Any]]) -> dict[str, Any]:
    """One worker per device pulls requests: EOE prefers a request whose service is warm on its
    device (the scheduler does this with ServiceResidency); dedicated serves only its own service."""
    names = list(modules)
    devices = pool_devices(ndev, args.device)
    one = packed_charge(modules[names[0]])
    budget = one if mode == "dedicated" else one * args.resident_per_device
    mgr = TorchGpuManager(devices=devices, memory_budget=budget)
    for n in names:
        mgr.register(n, module=modules[n])
        assert mgr.footprint(n) == one, (n, mgr.footprint(n), one)
    await mgr.start(ManagerContext(Pool(gpus=ndev), lambda e: None))
    if mode == "dedicated":  # warm everything first: dedicated devices never restore
        for i, n in enumerate(names):  # one at a time, so the allocator growth is this restore's alone
            dev = devices[i]
            estimated = mgr.footprint(n)
            sync(dev)
            a0 = allocated(dev)
            g, lease = grant_lease(n, (i,))
            await mgr.apply(g, lease)
            sync(dev)
            a1 = allocated(dev)
            charged = mgr.statistics()["devices"][i]["used"]
            charges.append({"service": n, "device": dev, "estimated": estimated, "charged": charged,
                            "allocator delta": None if a0 is None or a1 is None else a1 - a0})
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
    return {"mode": mode, "pool GPUs": ndev, "devices used": len(set(devices.values())), "requests": done,
            "wall s": wall, "req/s": done / wall, "req/s/pool GPU": done / wall / ndev,
            "restores": st["restores"], "evictions": st["evictions"], "failures": st["failures"],
            "warm hits %": 100 * st["hits"] / max(1, done)}


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols = list(dict.fromkeys(c for r in rows for c in r))
    fmt = [[f"{r[c]:.2f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols] for r in rows]
    w = [max(len(c), *(len(f[i]) for f in fmt)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w[i]) for i, c in enumerate(cols)), "  ".join("-" * x for x in w)]
    lines += ["  ".join(v.rjust(w[i]) for i, v in enumerate(f)) for f in fmt]
    return "\n".join(lines)


# -- the device check's single table (scripts/gpu-check.sh) ----------------------------------------
def soak_row(path: Path) -> tuple[str, str, str, str]:
    """The device check's soak line: faults on the real device, nothing left held or allocated."""
    try:
        r = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return "soak under faults", f"no result ({type(exc).__name__})", "a result", "FAIL (no result)"
    if "failed" in r:
        return "soak under faults", r["failed"], "a result", "FAIL (no result)"
    g, b = r["gpu"] or {}, r["device_bytes"]
    measured = (f"{r['actions']} actions on {r['gpu_device']}: {g.get('restores')} restores, "
                f"{g.get('evictions')} evictions, {r['cancels_delivered']} cancels; device bytes "
                f"{b['before']} -> {b['after']}")
    bad = r["leaks"] or r["unexpected"] or g.get("failures")
    return ("soak under faults", measured, "no leak, every cancel won, device bytes back",
            f"FAIL ({(r['leaks'] + r['unexpected'])[:2]})" if bad else "OK")


def report(paths: list[Path], pytest_log: Path | None, pytest_rc: int | None, elapsed: float | None,
           soak: Path | None = None) -> int:
    runs, failed = [], []
    for path in paths:  # a step that failed, timed out or never ran left a stub, or nothing
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            r = {"failed": f"no result ({type(exc).__name__})"}
        (failed.append((path.stem, r["failed"])) if "failed" in r else runs.append(r))
    cuda = any(r["device"].startswith("cuda") for r in runs)
    rows: list[dict[str, str]] = []
    bad = 0

    def row(check: str, measured: str, reference: str, result: str) -> None:
        nonlocal bad
        bad += result.startswith("FAIL")
        rows.append({"check": check, "measured": measured, "reference": reference, "result": result})

    for stem, why in failed:
        row(f"step {stem}", why, "a result", "FAIL (no result)")

    if pytest_log is not None:
        lines = [ln for ln in pytest_log.read_text().splitlines() if ln.strip()]
        summary = lines[-1].strip("= ") if lines else "no output"
        row("pytest (GPU files)", summary, "all pass" if cuda else "skipped without CUDA",
            "OK" if pytest_rc == 0 else f"FAIL (exit {pytest_rc})")
    bw = sorted((b for r in runs for b in r.get("bandwidth", [])), key=lambda b: b["MB"])
    for b in bw:
        if "skipped" in b:
            row(f"restore {b['MB']} MB", "skipped", b["skipped"], "FAIL (not measured)" if cuda else "skipped")
            continue
        ok = b["% of raw"] >= TARGET and b["pinned"]  # on CUDA the host copy must be page-locked
        verdict = ("OK" if ok else "FAIL" + ("" if b["pinned"] else " (host copy not pinned)")) if cuda \
            else "n/a (NO CUDA: host-to-host copies)"
        row(f"restore {b['MB']} MB", f"{b['restore GB/s']:.2f} restore GB/s", f"{b['raw GB/s']:.2f} raw GB/s",
            f"{b['% of raw']:.0f}% of raw (target >= {TARGET:.0f}%) {verdict}")
        row(f"  via manager {b['MB']} MB", f"{b['mgr restore ms']:.1f} ms", f"{b['raw ms']:.1f} ms raw",
            f"{b['mgr % of raw']:.0f}% of raw, {b['failures']} failures" + (" FAIL" if b["failures"] else ""))
        row(f"  evict {b['MB']} MB", f"{b['evict ms']:.2f} evict ms", "-", "-")
        row(f"  host memory after {b['MB']} MB", f"{b['host MB after']:.1f} MB", "0 MB",
            "OK" if b["host MB after"] == 0 else "FAIL (kept alive)")
    for c in (c for r in runs for c in r.get("charges", [])):
        delta = c["allocator delta"]
        ok = c["charged"] == c["estimated"] and (delta is None or delta <= c["charged"])
        row(f"charge {c['service']} on {c['device']}", f"{c['charged']} B charged",
            f"{c['estimated']} B estimated, allocator delta "
            + ("n/a" if delta is None else f"{delta} B"), "OK" if ok else "FAIL")
    for s in (s for r in runs for s in r.get("scoring", [])):
        ded = next((t for r in runs for t in r.get("scoring", []) if t["mode"] == "dedicated"), None)
        ref = f"dedicated {ded['req/s']:.1f} req/s on {ded['pool GPUs']} pool GPUs" if ded else "-"
        row(f"scoring {s['mode']}", f"{s['req/s']:.1f} req/s on {s['pool GPUs']} pool GPUs "
            f"({s['devices used']} devices)", ref,
            f"{s['warm hits %']:.0f}% warm, {s['failures']} failures" + (" FAIL" if s["failures"] else ""))
    first = next((r for r in runs), None)
    if first is not None:
        row("host_memory_stats before", json.dumps(first["host_before"]), "-", "-")
        after = runs[-1]["host_after"]
        leaked = any(r["host_after"]["sdk"]["bytes"] != r["host_before"]["sdk"]["bytes"] for r in runs)
        row("host_memory_stats after", json.dumps(after), "sdk bytes back to before",
            "FAIL (host buffers kept)" if leaked else "OK")
    if soak is not None:
        row(*soak_row(soak))
    if elapsed is not None:
        row("elapsed", f"{elapsed:.0f} s", "< 300 s", "OK" if elapsed < 300 or not cuda else "FAIL (too slow)")
    dev = first["device_name"] if first else "?"
    print(f"GPU check: {dev}, torch {first['torch'] if first else '?'}"
          + ("" if cuda else " - NO CUDA: CPU-only parts, sizes are tiny, bandwidth is not judged"))
    print(table(rows))
    print(f"\n{bad} check(s) failed" if bad else "\nall checks passed")
    return 1 if bad else 0


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes-mb", default="512,2048,8192" if cuda else "16,64,256")
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
    p.add_argument("--skip-bandwidth", action="store_true")
    p.add_argument("--json", type=Path, help="also write the rows here (for --report)")
    p.add_argument("--report", type=Path, nargs="+", help="print the device check's table from --json files")
    p.add_argument("--pytest", type=Path, help="with --report: the pytest log of the GPU test files")
    p.add_argument("--pytest-rc", type=int)
    p.add_argument("--soak", type=Path, help="with --report: the soak's --json report")
    p.add_argument("--elapsed", type=float)
    args = p.parse_args()
    if args.report:
        sys.exit(report(args.report, args.pytest, args.pytest_rc, args.elapsed, args.soak))
    dev = args.device
    before = host_stats()
    if dev.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(dev))
        print(f"device: {name} ({dev}, {torch.cuda.device_count()} visible); host buffers page-locked at "
              "their exact size")
    else:
        name = "cpu"
        print("device: cpu - NO CUDA: 'device' copies are host-to-host memcpy and all devices share the "
              f"same {torch.get_num_threads()} CPU threads; numbers show overhead, not PCIe bandwidth")
    print(f"torch {torch.__version__}\n")
    out: dict[str, Any] = {"device": dev, "device_name": name, "torch": torch.__version__, "host_before": before}
    if not args.skip_bandwidth:
        sizes = [int(s) for s in args.sizes_mb.split(",") if s]
        print("restore / evict (median of", args.repeats, "runs; each size freed before the next)")
        out["bandwidth"] = anyio.run(bandwidth, sizes, args.repeats, dev)
        print(table(out["bandwidth"]))
    if not args.skip_scoring:
        print(f"\nscoring: {args.services} services x {args.service_mb} MB, {args.requests} requests of batch "
              f"{args.batch}; EOE budget = {args.resident_per_device} services per device")
        out["scoring"], out["charges"] = anyio.run(scoring, args, dev)
        print(table(out["scoring"]))
        print("\ncharge per service (estimated before the restore, charged from the restored storage)")
        print(table(out["charges"]))
    gc.collect()
    out["host_after"] = host_stats()
    print(f"\nhost memory before: {json.dumps(before)}\nhost memory after:  {json.dumps(out['host_after'])}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
