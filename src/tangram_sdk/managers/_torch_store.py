"""Host-memory store for torch services: pack once, restore by one big copy, evict by dropping it.

This is the ONLY module of tangram_sdk that imports torch, and it does so lazily inside functions, so
``import tangram_sdk`` (and ``tangram_sdk.managers.gpu``) never pays for or requires torch.

Why a flat buffer: a model is hundreds of tensors, and hundreds of small host-to-device copies run well
below the link's bandwidth. At registration every unique parameter and buffer is copied once into ONE
contiguous host buffer (pinned when CUDA exists, so copies can be asynchronous DMA) and the host
module's tensors become views into it. A restore is then one device allocation plus one
``copy_(non_blocking=True)`` and a stream sync - the same operation as a raw pinned copy of the same
bytes - and the device replica's tensors are views into the device buffer. An eviction points the
replica's slots at meta placeholders and drops the device buffer, so the memory is freed even if
user code still holds the module object (calling it then fails loudly instead of keeping weights
alive).

Every function here is synchronous and may block; the manager runs them with
``anyio.to_thread.run_sync`` so the event loop keeps scheduling other actions.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..errors import SpecError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "ALIGN",
    "DeviceReplica",
    "HostStore",
    "cuda_available",
    "device_count",
    "device_total_memory",
    "gather",
    "is_oom",
    "run_replica",
    "split_batch",
]

# Offsets in the flat buffer are multiples of this: enough for any dtype view and for the 128-bit
# vector loads kernels like; the padding costs at most ALIGN-1 bytes per tensor.
ALIGN = 256

# One lock per device string, taken (in sorted order) around a restore/evict so the
# torch.cuda.memory_allocated delta we measure is ours alone and not a concurrent restore's.
_DEVICE_LOCKS: dict[str, threading.Lock] = {}
_DEVICE_LOCKS_GUARD = threading.Lock()


def _lock_for(device: str) -> threading.Lock:
    with _DEVICE_LOCKS_GUARD:
        return _DEVICE_LOCKS.setdefault(device, threading.Lock())


def cuda_available() -> bool:
    """True when torch is importable and sees at least one CUDA device."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is an optional extra
        return False
    return bool(torch.cuda.is_available())


def device_count() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def device_total_memory(device: str) -> int:
    """Total memory of a CUDA device in bytes (used for the default budget)."""
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` means "not enough device memory" (worth evicting more and retrying once)."""
    if isinstance(exc, MemoryError):
        return True
    import sys

    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return oom is not None and isinstance(exc, oom)


def _is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@attrs.define(eq=False)
class _Slot:
    """One place a tensor hangs in a module: ``module._parameters[name]`` or ``module._buffers[name]``."""

    module: Any
    table: str  # "_parameters" or "_buffers"
    name: str
    index: int  # index of the unique tensor (tied weights share one)


@attrs.define(eq=False)
class DeviceReplica:
    """A service's module structure bound to one device. The structure (``module``) is built once per
    instance and reused across restores; only ``buffer`` comes and goes."""

    device: str
    module: Any
    slots: list[_Slot]
    placeholders: list[Any]  # meta tensors, one per slot, put back on eviction
    rnn_modules: list[Any]  # modules caching parameter lists (nn.RNNBase) to refresh after a swap
    buffer: Any = None  # the device flat buffer while resident
    measured: int = 0  # bytes this replica was charged on its device at the last restore

    @property
    def resident(self) -> bool:
        return self.buffer is not None


class HostStore:
    """A module materialised once, its unique parameters and buffers packed into one host buffer.

    ``nbytes`` is the sum of the unique tensors' ``nbytes`` as materialised; ``footprint`` is the
    flat buffer size (``nbytes`` plus alignment padding) - what one device replica allocates.
    """

    def __init__(self, module: Any, *, pin: bool | None = None, inference: bool = True) -> None:
        import torch

        if not isinstance(module, torch.nn.Module):
            raise SpecError(f"a torch service must be a torch.nn.Module, got {type(module).__name__}")
        if inference:
            module.eval()
        self.pinned = cuda_available() if pin is None else pin
        uniques: list[torch.Tensor] = []
        seen: dict[int, int] = {}
        for owner, _table, name, t in _walk(module):
            if id(t) in seen:
                continue
            if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
                raise SpecError(
                    f"tensor {name!r} of {type(owner).__name__} ({t.layout}, device {t.device}) cannot be"
                    " stored: only materialised"
                    " dense tensors are supported"
                )
            seen[id(t)] = len(uniques)
            uniques.append(t)
        self.specs: list[tuple[int, torch.dtype, torch.Size, int]] = []  # (offset, dtype, shape, nbytes)
        offset = 0
        nbytes = 0
        for t in uniques:
            n = t.numel() * t.element_size()
            self.specs.append((offset, t.dtype, t.shape, n))
            offset += _align(n)
            nbytes += n
        self.nbytes = nbytes
        self.footprint = offset
        # Allocated once for the service's lifetime and reused by every restore of every instance.
        self.buffer = torch.empty(self.footprint, dtype=torch.uint8, pin_memory=self.pinned)
        with torch.no_grad():
            views = _views(self.buffer, self.specs)
            for t, v in zip(uniques, views):
                v.copy_(t.detach().reshape(v.shape))
            # Point the host module at the packed copy so the original tensors can be freed.
            for t, v in zip(uniques, views):
                t.data = v
        self.module = module
        self.inference = inference

    # -- replicas -------------------------------------------------------------------------------
    def make_replica(self, device: str) -> DeviceReplica:
        """Build the module structure for ``device`` once: a deep copy whose tensors are meta
        placeholders (no memory), with every slot recorded so restores only re-point slots."""
        import torch

        memo: dict[int, Any] = {}
        index_of: dict[int, int] = {}
        uniques: list[Any] = []
        for _owner, _table, _name, t in _walk(self.module):
            if id(t) in memo:
                continue
            meta = torch.empty_like(t, device="meta")
            if isinstance(t, torch.nn.Parameter):
                meta = torch.nn.Parameter(meta, requires_grad=t.requires_grad)
            memo[id(t)] = meta
            index_of[id(meta)] = len(uniques)
            uniques.append(meta)
        shell = copy.deepcopy(self.module, memo)
        slots = [_Slot(owner, table, name, index_of[id(t)]) for owner, table, name, t in _walk(shell)]
        placeholders = [getattr(s.module, s.table)[s.name] for s in slots]
        rnns = [m for m in shell.modules() if hasattr(m, "_init_flat_weights")]
        return DeviceReplica(device, shell, slots, placeholders, rnns)

    def restore(self, replicas: Sequence[DeviceReplica], hook: Callable[[], None] | None = None) -> None:
        """Copy the host buffer to every replica's device and bind the replicas' tensors to it.

        Copies to all devices are issued first (non-blocking, from pinned memory) and synchronised
        after, so an n-GPU instance restores over n links at once. On failure nothing stays
        allocated. Sets ``replica.measured`` to the bytes charged per device: the
        ``torch.cuda.memory_allocated`` delta on CUDA (at least ``footprint``), else ``footprint``.
        """
        import torch

        locks = [_lock_for(d) for d in sorted({r.device for r in replicas})]
        for lk in locks:
            lk.acquire()
        try:
            if hook is not None:
                hook()
            before = {r.device: _allocated(r.device) for r in replicas}
            try:
                for r in replicas:
                    buf = torch.empty(self.footprint, dtype=torch.uint8, device=torch.device(r.device))
                    buf.copy_(self.buffer, non_blocking=self.pinned and _is_cuda(r.device))
                    # Building the views needs no data: on CUDA it overlaps the DMA still in flight.
                    self._bind(r, buf)
                for r in replicas:
                    if _is_cuda(r.device):
                        torch.cuda.current_stream(torch.device(r.device)).synchronize()
            except BaseException:
                self._unbind(replicas)
                raise
            for r in replicas:
                delta = _allocated(r.device) - before[r.device] if _is_cuda(r.device) else 0
                r.measured = max(self.footprint, delta)
        finally:
            for lk in reversed(locks):
                lk.release()

    def evict(self, replicas: Sequence[DeviceReplica], *, empty_cache: bool = False) -> int:
        """Unbind and free every replica's device buffer; returns bytes freed as measured on CUDA
        (the sum of ``measured`` on other devices). A shortfall means user code kept tensors alive."""
        import torch

        freed = 0
        for r in replicas:
            if r.buffer is None:
                continue
            with _lock_for(r.device):
                before = _allocated(r.device)
                self._unbind([r])
                if _is_cuda(r.device):
                    freed += before - _allocated(r.device)
                    if empty_cache:
                        with torch.cuda.device(torch.device(r.device)):
                            torch.cuda.empty_cache()
                else:
                    freed += r.measured
        return freed

    @staticmethod
    def _unbind(replicas: Sequence[DeviceReplica]) -> None:
        for r in replicas:
            if r.buffer is None:
                continue
            for s, ph in zip(r.slots, r.placeholders):
                getattr(s.module, s.table)[s.name] = ph
            for m in r.rnn_modules:
                m._init_flat_weights()
            r.buffer = None

    def _bind(self, replica: DeviceReplica, buf: Any) -> None:
        import torch

        views = _views(buf, self.specs)
        objs: dict[int, Any] = {}
        for s, ph in zip(replica.slots, replica.placeholders):
            obj = objs.get(s.index)
            if obj is None:
                v = views[s.index]
                obj = torch.nn.Parameter(v, requires_grad=ph.requires_grad) if isinstance(
                    ph, torch.nn.Parameter
                ) else v
                objs[s.index] = obj
            getattr(s.module, s.table)[s.name] = obj
        for m in replica.rnn_modules:
            m._init_flat_weights()
        replica.buffer = buf


def _walk(module: Any) -> list[tuple[Any, str, str, Any]]:
    """Every (owner, table, local name, tensor) slot, shared modules and tied tensors included."""
    out: list[tuple[Any, str, str, Any]] = []
    for _prefix, m in module.named_modules(remove_duplicate=False):
        for table in ("_parameters", "_buffers"):
            for name, t in getattr(m, table).items():
                if t is not None:
                    out.append((m, table, name, t))
    return out


def _views(buf: Any, specs: Sequence[tuple[int, Any, Any, int]]) -> list[Any]:
    out = []
    for offset, dtype, shape, n in specs:
        out.append(buf[offset : offset + n].view(dtype).view(shape))
    return out


def _allocated(device: str) -> int:
    if not _is_cuda(device):
        return 0
    import torch

    return int(torch.cuda.memory_allocated(torch.device(device)))


# -- running a (possibly multi-replica) instance ---------------------------------------------------
def _to_device(obj: Any, device: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, tuple):
        return tuple(_to_device(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to_device(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def run_replica(replica: DeviceReplica, inference: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one replica on its device (blocking): inputs moved there, result synchronised."""
    import torch

    if replica.buffer is None:
        raise RuntimeError(f"service replica on {replica.device} is not resident (evicted)")
    dev = torch.device(replica.device)
    ctx = torch.inference_mode() if inference else torch.no_grad()
    with ctx:
        if dev.type == "cuda":
            with torch.cuda.device(dev):
                out = replica.module(*_to_device(args, dev), **_to_device(kwargs, dev))
                torch.cuda.current_stream(dev).synchronize()
        else:
            out = replica.module(*_to_device(args, dev), **_to_device(kwargs, dev))
    return out


def split_batch(n: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Split every tensor argument along dim 0 into at most ``n`` chunks (data parallel); other
    arguments are passed to every chunk as they are. Returns fewer chunks for a small batch."""
    import torch

    sizes = [a.shape[0] for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.dim() > 0]
    if not sizes or n <= 1:
        return [(args, kwargs)]
    batch = min(sizes)
    k = max(1, min(n, batch))

    def part(a: Any, i: int) -> Any:
        if isinstance(a, torch.Tensor) and a.dim() > 0:
            return torch.tensor_split(a, k, dim=0)[i]
        return a

    return [(tuple(part(a, i) for a in args), {key: part(v, i) for key, v in kwargs.items()}) for i in range(k)]


def gather(outputs: list[Any], device: str) -> Any:
    """Concatenate per-replica outputs along dim 0 on ``device`` (tensors, tuples/lists, dicts)."""
    import torch

    if len(outputs) == 1:
        return outputs[0]
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([o.to(device) for o in outputs], dim=0)
    if isinstance(first, (tuple, list)):
        return type(first)(gather([o[i] for o in outputs], device) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: gather([o[k] for o in outputs], device) for k in first}
    return outputs

