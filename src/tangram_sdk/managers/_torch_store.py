"""Host-memory store for torch services: pack once, restore by one big copy, evict by dropping it.

This is the ONLY module of tangram_sdk that imports torch, and it does so lazily inside functions, so
``import tangram_sdk`` (and ``tangram_sdk.managers.gpu``) never pays for or requires torch.

Why a flat buffer: a model is hundreds of tensors, and hundreds of small host-to-device copies run well
below the link's bandwidth. At registration every unique parameter and buffer is copied once into ONE
contiguous host buffer and the host module's tensors become views into it (each original is released
as soon as it is copied). A restore is then one device allocation plus one ``copy_(non_blocking=True)``
- the same operation as a raw pinned copy of the same bytes - and the device replica's tensors are
views into the device buffer. An eviction points the replica's slots at meta placeholders and drops
the device buffer, so the memory is freed even if user code still holds the module object (calling it
then fails loudly instead of keeping weights alive).

Host memory is allocated at exactly the packed size and, where CUDA exists, page-locked in place with
``cudaHostRegister`` (as torch's checkpoint stager does), not taken from torch's caching host
allocator, which rounds every block up to a power of two and keeps it: a 15 GiB model would pin 16.
The registration is undone when the last view of the buffer goes away.

What a restore is charged on its device: the restored tensors' storage sizes rounded as the CUDA
caching allocator rounds them (:func:`charge`), the same on every device so the CPU path emulates it.

Every function here is synchronous and may block; the manager runs them with
``anyio.to_thread.run_sync`` so the event loop keeps scheduling other actions.
"""

from __future__ import annotations

import copy
import gc
import inspect
import logging
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..errors import SpecError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

__all__ = [
    "ALIGN",
    "BLOCK",
    "SEGMENT",
    "SMALL",
    "DeviceReplica",
    "HeldBuffer",
    "HostStore",
    "charge",
    "clear_frames",
    "cuda_available",
    "device_count",
    "device_free_memory",
    "device_total_memory",
    "gather",
    "host_memory",
    "is_oom",
    "release_cached",
    "replica_charge",
    "run_replica",
    "split_batch",
]

log = logging.getLogger(__name__)

# Offsets in the flat buffer are multiples of this: enough for any dtype view and for the 128-bit
# vector loads kernels like; the padding costs at most ALIGN-1 bytes per tensor.
ALIGN = 256

# The CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp): every block is a multiple of
# kMinBlockSize (512 B); requests up to kSmallSize (1 MiB) share 2 MiB segments; a larger request
# gets a block carved from a segment that is a multiple of kRoundLarge (2 MiB), and a remainder of
# 1 MiB or less is not split off, so the block can hold up to the next 2 MiB boundary.
BLOCK = 512
SMALL = 1 << 20
SEGMENT = 2 << 20


def charge(nbytes: int) -> int:
    """Device bytes one allocation of ``nbytes`` is charged: rounded up to 512 B up to 1 MiB, and to
    whole 2 MiB segments above (what a fresh large segment reserves, and an upper bound on the block
    a large request holds from one). Upper bound on the ``memory_allocated`` growth it causes."""
    if nbytes <= 0:
        return 0
    if nbytes <= SMALL:
        return -(-nbytes // BLOCK) * BLOCK
    return -(-nbytes // SEGMENT) * SEGMENT


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
    """Total memory of a CUDA device in bytes."""
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def device_free_memory(device: str) -> int:
    """Bytes this process can still allocate on a CUDA device: the driver's free memory
    (``torch.cuda.mem_get_info``) plus what torch's caching allocator holds but does not use."""
    import torch

    dev = torch.device(device)
    free, _total = torch.cuda.mem_get_info(dev)
    cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    return int(free) + max(0, int(cached))


_OOM_TEXT = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
             "CUDA_ERROR_OUT_OF_MEMORY")


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` means "not enough device memory" (worth evicting more and retrying once):
    ``MemoryError``, ``torch.OutOfMemoryError`` (torch >= 2.5), ``torch.cuda.OutOfMemoryError``
    (1.13-2.4), or a ``RuntimeError`` with the allocator's or cuBLAS/cuDNN's out-of-memory text."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None:
        for cls in (getattr(torch, "OutOfMemoryError", None),
                    getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)):
            if isinstance(cls, type) and isinstance(exc, cls):
                return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _OOM_TEXT)


def _is_cuda(device: str) -> bool:
    return device.startswith("cuda")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


# -- host buffers: exact size, page-locked in place ------------------------------------------------
_HOST_LOCK = threading.Lock()
_HOST = {"buffers": 0, "bytes": 0, "pinned_bytes": 0}


def host_memory() -> dict[str, int]:
    """Live host buffers of every HostStore in this process: count, bytes, of which page-locked."""
    with _HOST_LOCK:
        return dict(_HOST)


def _host_register(ptr: int, nbytes: int) -> None:
    """Page-lock ``nbytes`` at ``ptr`` for every CUDA context (cudaHostRegisterPortable)."""
    import torch

    cudart: Any = torch.cuda.cudart  # untyped in torch's stubs
    err = int(cudart().cudaHostRegister(ptr, nbytes, 1))
    if err != 0:
        raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed with cudaError {err} "
                           "(page-locked memory limit? see ulimit -l)")


def _host_unregister(ptr: int) -> None:
    import torch

    cudart: Any = torch.cuda.cudart
    err = int(cudart().cudaHostUnregister(ptr))
    if err != 0:
        log.warning("cudaHostUnregister failed with cudaError %d", err)


def _released(nbytes: int, pinned: bool, unregister: Callable[[int], None] | None, ptr: int) -> None:
    """Finalizer of a host buffer's storage: runs before its memory is freed."""
    if unregister is not None:
        try:
            unregister(ptr)
        except Exception:  # a finalizer must not raise; the memory is freed either way
            log.warning("unpinning a %d-byte host buffer failed", nbytes, exc_info=True)
    with _HOST_LOCK:
        _HOST["buffers"] -= 1
        _HOST["bytes"] -= nbytes
        if pinned:
            _HOST["pinned_bytes"] -= nbytes


def _host_buffer(nbytes: int) -> Any:
    """An uninitialised host byte tensor of exactly ``nbytes`` (pages are committed on first touch)."""
    import torch

    storage: Any = torch.UntypedStorage  # untyped constructor
    return torch.empty(0, dtype=torch.uint8).set_(storage(nbytes))


def _track(buffer: Any, pin: bool) -> None:
    """Count ``buffer`` in :func:`host_memory` and, with ``pin``, page-lock it until its storage dies."""
    nbytes = int(buffer.numel())
    storage = buffer.untyped_storage()
    unregister = None
    if pin and nbytes:
        register, unregister = _host_register, _host_unregister
        register(storage.data_ptr(), nbytes)
    fin = weakref.finalize(storage, _released, nbytes, unregister is not None, unregister, storage.data_ptr())
    fin.atexit = False  # never after the CUDA context is gone (torch's stager does the same)
    with _HOST_LOCK:
        _HOST["buffers"] += 1
        _HOST["bytes"] += nbytes
        if unregister is not None:
            _HOST["pinned_bytes"] += nbytes


def pinned_host_buffer(nbytes: int, pin: bool) -> Any:
    """An exact-size host byte tensor, page-locked when ``pin`` (the benchmark's raw-copy source)."""
    buf = _host_buffer(nbytes)
    _track(buf, pin)
    return buf


# -- the store -------------------------------------------------------------------------------------
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
    measured: int = 0  # bytes charged on its device at the last restore (see replica_charge)
    ready: Any = None  # CUDA event recorded after the copy (on the copy stream); None on CPU

    @property
    def resident(self) -> bool:
        return self.buffer is not None


@attrs.define(eq=False)
class HeldBuffer:
    """A device buffer that outlived its eviction because user code still references its tensors."""

    device: str
    nbytes: int  # its charge
    ref: Any  # StorageWeakRef

    @property
    def alive(self) -> bool:
        return not self.ref.expired()


_Spec = tuple[int, Any, Any, tuple[int, ...], int]  # (offset, dtype, shape, stride, nbytes)


class HostStore:
    """A module materialised once, its unique parameters and buffers packed into one host buffer.

    ``nbytes`` is the sum of the unique tensors' ``nbytes`` as materialised; ``footprint`` is the
    flat buffer size (``nbytes`` plus alignment padding) - what one device replica allocates - and
    ``charge`` what that allocation is charged on a device. ``name`` is used in error messages.
    """

    def __init__(self, module: Any, *, pin: bool | None = None, inference: bool = True,
                 name: str = "module") -> None:
        import torch

        if not isinstance(module, torch.nn.Module):
            raise SpecError(f"a torch service must be a torch.nn.Module, got {type(module).__name__}")
        self.name = name
        uniques: list[torch.Tensor] = []
        seen: set[int] = set()
        for qual, _owner, _table, _name, t in _walk_named(module):
            if id(t) in seen:
                continue
            _check_tensor(name, qual, t)
            seen.add(id(t))
            uniques.append(t)
        if inference:
            module.eval()
        self.pinned = cuda_available() if pin is None else pin
        self.specs: list[_Spec] = []
        offset = 0
        nbytes = 0
        for t in uniques:
            n = t.numel() * t.element_size()
            self.specs.append((offset, t.dtype, t.shape, _packed_stride(t), n))
            offset += _align(n)
            nbytes += n
        self.nbytes = nbytes
        self.footprint = offset
        self.charge = charge(offset)
        # Allocated once, at the exact size, for the service's lifetime; reused by every restore.
        self.buffer = _host_buffer(self.footprint)
        with torch.no_grad():
            for t, v in zip(uniques, _views(self.buffer, self.specs)):
                v.copy_(t.detach())
                t.data = v  # the original is released now, not after the whole model is copied
        del uniques
        # Page-lock after the copy: the originals are gone by then, so host memory never holds the
        # model twice, and registration touches pages that already hold the weights.
        _track(self.buffer, self.pinned)
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

        On CUDA each copy runs on a per-device side stream (so it does not queue behind other
        services' kernels on the default stream) and records ``replica.ready``, which
        :func:`run_replica` makes the compute stream wait on; copies to all devices are issued before
        any is awaited, so n devices copy over n links at once. Returns once the data has landed. On
        failure nothing stays allocated (not even through the exception's traceback). Sets
        ``replica.measured`` (:func:`replica_charge`).
        """
        try:
            if hook is not None:
                hook()
            for r in replicas:
                self._copy_in(r)
            for r in replicas:
                if r.ready is not None:
                    r.ready.synchronize()
        except BaseException as exc:
            self._unbind(replicas)
            if exc.__traceback__ is not None:  # frames below this one may still hold a device buffer
                clear_frames(exc.__traceback__.tb_next)
            raise
        for r in replicas:
            r.measured = replica_charge(r)

    def _copy_in(self, r: DeviceReplica) -> None:
        import torch

        dev = torch.device(r.device)
        if dev.type != "cuda":
            buf = torch.empty(self.footprint, dtype=torch.uint8, device=dev)
            buf.copy_(self.buffer)
            r.ready = None
            self._bind(r, buf)
            return
        side = _copy_stream(dev)
        with torch.cuda.device(dev), torch.cuda.stream(side):
            buf = torch.empty(self.footprint, dtype=torch.uint8, device=dev)
            buf.copy_(self.buffer, non_blocking=self.pinned)
            event: Any = torch.cuda.Event
            ready = event()
            ready.record(side)
        # The weights are read on the compute stream: the allocator must not hand the block to the
        # next restore on the side stream before the kernels queued there have finished with it.
        buf.record_stream(torch.cuda.current_stream(dev))
        r.ready = ready
        self._bind(r, buf)

    def evict(self, replicas: Sequence[DeviceReplica], *, empty_cache: bool = False) -> list[HeldBuffer]:
        """Unbind and drop every replica's device buffer. Returns the buffers that are NOT freed
        because user code still references their tensors (one kept weight keeps the whole buffer):
        the caller keeps charging them until they die."""
        from torch.multiprocessing import reductions

        weak: Any = reductions.StorageWeakRef  # untyped
        held: list[HeldBuffer] = []
        for r in replicas:
            if r.buffer is None:
                continue
            ref: Any = weak(r.buffer.untyped_storage())
            self._unbind([r])
            if not ref.expired():
                gc.collect()  # a reference cycle (an exception's traceback) may be all that holds it
            if not ref.expired():
                held.append(HeldBuffer(r.device, r.measured, ref))
        if empty_cache:
            release_cached(r.device for r in replicas)
        return held

    @staticmethod
    def _unbind(replicas: Sequence[DeviceReplica]) -> None:
        for r in replicas:
            if r.buffer is None:
                continue
            for s, ph in zip(r.slots, r.placeholders):
                getattr(s.module, s.table)[s.name] = ph
            for m in r.rnn_modules:
                _refresh_rnn(m)
            r.buffer = None
            r.ready = None

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
            _refresh_rnn(m)
        replica.buffer = buf


_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def clear_frames(tb: types.TracebackType | None) -> None:
    """Drop the locals (device buffers, activations) of the finished plain-function frames in a
    traceback. Unlike ``traceback.clear_frames`` it never touches generator or coroutine frames: an
    exception object raised twice carries frames of its first trip, and clearing a suspended
    coroutine's frame would close that coroutine under its task."""
    while tb is not None:
        frame = tb.tb_frame
        if not frame.f_code.co_flags & _SUSPENDABLE:
            try:
                frame.clear()
            except RuntimeError:  # still executing
                pass
        tb = tb.tb_next


def _refresh_rnn(m: Any) -> None:
    """Point an ``nn.RNNBase``'s cached weight list at the slots just re-pointed, like its
    ``_init_flat_weights`` but without ``flatten_parameters``: on CUDA that copies the weights into a
    new cuDNN buffer and re-points them there, so the replica would hold them twice (the second copy
    outside the charge). cuDNN then compacts them per call into a temporary workspace instead."""
    m._flat_weights = [getattr(m, wn) if hasattr(m, wn) else None for wn in m._flat_weights_names]
    m._flat_weight_refs = [weakref.ref(w) if w is not None else None for w in m._flat_weights]


def _check_tensor(service: str, qual: str, t: Any) -> None:
    """Only plain dense materialised tensors survive packing into bytes; anything else would lose
    state silently (a quantised weight's scales, a DTensor's placement), so it is refused here."""
    import torch

    kind = type(t)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        raise SpecError(
            f"GPU service {service!r}: tensor {qual!r} is a {kind.__module__}.{kind.__qualname__}, a tensor "
            "subclass (quantised weights, DTensor, ...) whose extra state a flat byte buffer cannot keep; "
            "dequantise or gather it to a plain tensor, or serve the model behind an OffloadableService")
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        raise SpecError(
            f"GPU service {service!r}: tensor {qual!r} ({t.layout}, device {t.device}) cannot be stored: "
            "only materialised dense tensors are supported")


def _packed_stride(t: Any) -> tuple[int, ...]:
    """Strides of the packed copy: channels-last (3d) kept where the tensor has it, else row-major."""
    import torch

    fmt = torch.contiguous_format
    if not t.is_contiguous():
        if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            fmt = torch.channels_last
        elif t.dim() == 5 and t.is_contiguous(memory_format=torch.channels_last_3d):
            fmt = torch.channels_last_3d
    return tuple(torch.empty(t.shape, device="meta", memory_format=fmt).stride())


def _walk(module: Any) -> list[tuple[Any, str, str, Any]]:
    """Every (owner, table, local name, tensor) slot, shared modules and tied tensors included."""
    return [(m, table, name, t) for _q, m, table, name, t in _walk_named(module)]


def _walk_named(module: Any) -> list[tuple[str, Any, str, str, Any]]:
    """Like :func:`_walk`, each slot led by its qualified name (``layers.0.weight``) for messages."""
    out: list[tuple[str, Any, str, str, Any]] = []
    for prefix, m in module.named_modules(remove_duplicate=False):
        for table in ("_parameters", "_buffers"):
            for name, t in getattr(m, table).items():
                if t is not None:
                    out.append((f"{prefix}.{name}" if prefix else name, m, table, name, t))
    return out


def _views(buf: Any, specs: Sequence[_Spec]) -> list[Any]:
    out = []
    for offset, dtype, shape, stride, n in specs:
        out.append(buf[offset : offset + n].view(dtype).as_strided(shape, stride))
    return out


def replica_charge(replica: DeviceReplica) -> int:
    """What a restored replica holds on its device: its tensors' distinct storages, each rounded as
    the caching allocator rounds it (measured from the tensors bound, not a device-wide counter that
    other threads' activations and cuBLAS workspaces move too)."""
    sizes: dict[int, int] = {}
    for s in replica.slots:
        st = getattr(s.module, s.table)[s.name].untyped_storage()
        sizes[st.data_ptr()] = st.nbytes()
    return sum(charge(n) for n in sizes.values())


def release_cached(devices: Iterable[str]) -> None:
    """Return torch's cached free device blocks to the driver, once however many devices (the call
    synchronises and empties every device anyway)."""
    if any(_is_cuda(d) for d in devices):
        import torch

        torch.cuda.empty_cache()


_STREAMS: dict[int, Any] = {}
_STREAMS_LOCK = threading.Lock()


def _copy_stream(dev: Any) -> Any:
    import torch

    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with _STREAMS_LOCK:
        s = _STREAMS.get(index)
        if s is None:
            stream: Any = torch.cuda.Stream
            s = _STREAMS[index] = stream(device=torch.device("cuda", index))
        return s


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
                stream = torch.cuda.current_stream(dev)
                if replica.ready is not None:
                    stream.wait_event(replica.ready)
                out = replica.module(*_to_device(args, dev), **_to_device(kwargs, dev))
                stream.synchronize()
        else:
            out = replica.module(*_to_device(args, dev), **_to_device(kwargs, dev))
    return out


def split_batch(n: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Split the batch across at most ``n`` replicas (data parallel). The batch size is dim 0 of the
    first tensor argument (positional first); tensors with that leading size are split along dim 0,
    every other argument (a table, a mask of another length, a scalar) goes whole to every chunk.
    Returns fewer chunks for a small batch."""
    import torch

    if n <= 1:
        return [(args, kwargs)]
    batch = next((a.shape[0] for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.dim() > 0),
                 None)
    if not batch:
        return [(args, kwargs)]
    k = max(1, min(n, batch))

    def part(a: Any, i: int) -> Any:
        if isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == batch:
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
