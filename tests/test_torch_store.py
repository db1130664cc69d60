"""HostStore: pack once into one host buffer, restore by one copy, evict by re-pointing at meta."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tangram_sdk.errors import SpecError
from tangram_sdk.managers import _torch_store as ts

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Tied(torch.nn.Module):
    """Tied weights, a shared submodule, a 0-dim buffer and BatchNorm running stats."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(16, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.b = torch.nn.Linear(32, 16)
        self.head = torch.nn.Linear(16, 3)
        self.head_again = self.head  # shared module
        self.b.weight = torch.nn.Parameter(torch.randn(16, 32))
        self.tail = torch.nn.Linear(32, 16)
        self.tail.weight = self.b.weight  # tied parameter
        self.register_buffer("scale", torch.tensor(1.5))
        self.bn.running_mean.normal_()
        self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.a(x)))
        return (self.head_again(self.b(h)) + self.head(self.tail(h))) * self.scale


def test_pack_counts_unique_tensors_and_aligns() -> None:
    m = Tied()
    uniques = {id(t): t for t in [*m.parameters(), *m.buffers()]}
    expected = sum(t.numel() * t.element_size() for t in uniques.values())
    store = ts.HostStore(m)
    assert store.nbytes == expected
    assert store.footprint == sum(-(-t.numel() * t.element_size() // ts.ALIGN) * ts.ALIGN for t in uniques.values())
    assert store.buffer.numel() == store.footprint  # exact size: no power-of-two rounding
    assert store.charge == ts.charge(store.footprint) and store.charge % ts.BLOCK == 0
    # the host module now lives in the flat buffer (allocated once; original tensors released)
    base = store.buffer.data_ptr()
    for t in [*m.parameters(), *m.buffers()]:
        assert base <= t.data_ptr() < base + store.footprint
    assert m.tail.weight is m.b.weight
    assert not m.training  # inference=True puts it in eval mode


def test_restore_evict_cycles_are_bit_identical() -> None:
    m = Tied().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        ref = m(x)
    store = ts.HostStore(m)
    rep = store.make_replica("cpu")
    host_ptr = store.buffer.data_ptr()
    for _ in range(5):
        store.restore([rep])
        assert rep.resident and rep.measured == ts.charge(store.footprint)
        with torch.no_grad():
            assert torch.equal(rep.module(x), ref)
        # tied and shared structure survives in the replica
        assert rep.module.tail.weight is rep.module.b.weight
        assert rep.module.head_again is rep.module.head
        assert store.evict([rep]) == []  # nothing held back: the whole buffer was freed
        assert not rep.resident
        assert store.buffer.data_ptr() == host_ptr  # host memory reused, never reallocated


def test_evicted_replica_holds_no_memory_and_fails_loudly() -> None:
    m = Tied().eval()
    store = ts.HostStore(m)
    rep = store.make_replica("cpu")
    store.restore([rep])
    module = rep.module  # user code keeps a reference past eviction
    store.evict([rep])
    assert all(p.device.type == "meta" for p in module.parameters())
    with pytest.raises(RuntimeError):
        module(torch.randn(2, 16))
    with pytest.raises(RuntimeError, match="not resident"):
        ts.run_replica(rep, True, (torch.randn(2, 16),), {})


def test_replica_copies_are_independent_of_host() -> None:
    m = Tied().eval()
    store = ts.HostStore(m)
    rep = store.make_replica("cpu")
    store.restore([rep])
    assert rep.module.a.weight.data_ptr() != m.a.weight.data_ptr()
    assert torch.equal(rep.module.a.weight, m.a.weight)


def test_rnn_flat_weights_are_rebound() -> None:
    torch.manual_seed(1)
    lstm = torch.nn.LSTM(4, 8, batch_first=True)
    x = torch.randn(2, 3, 4)
    with torch.no_grad():
        ref = lstm(x)[0]
    store = ts.HostStore(lstm)
    rep = store.make_replica("cpu")
    for _ in range(2):
        store.restore([rep])
        with torch.no_grad():
            assert torch.equal(rep.module(x)[0], ref)
        store.evict([rep])


def test_failed_restore_leaves_nothing_bound() -> None:
    store = ts.HostStore(Tied())
    rep = store.make_replica("cpu")

    def boom() -> None:
        raise torch.OutOfMemoryError("injected")

    with pytest.raises(torch.OutOfMemoryError):
        store.restore([rep], hook=boom)
    assert not rep.resident
    store.restore([rep])
    assert rep.resident


def test_rejects_non_modules_and_meta_tensors() -> None:
    with pytest.raises(SpecError, match="nn.Module"):
        ts.HostStore(object())
    with torch.device("meta"):
        lazy = torch.nn.Linear(4, 4)
    with pytest.raises(SpecError, match="materialised"):
        ts.HostStore(lazy)


def test_split_and_gather_data_parallel() -> None:
    x = torch.arange(10.0).reshape(5, 2)
    chunks = ts.split_batch(3, (x, "tag"), {"mask": torch.ones(5)})
    assert len(chunks) == 3
    assert [c[0][0].shape[0] for c in chunks] == [2, 2, 1]
    assert all(c[0][1] == "tag" for c in chunks)
    assert torch.equal(ts.gather([c[0][0] for c in chunks], "cpu"), x)
    assert len(ts.split_batch(4, (torch.ones(2, 3),), {})) == 2  # never more chunks than rows
    assert len(ts.split_batch(4, ("no tensors",), {})) == 1
    outs = [(torch.ones(1), {"k": torch.zeros(1)}), (torch.ones(2), {"k": torch.zeros(2)})]
    g = ts.gather(outs, "cpu")
    assert g[0].shape == (3,) and g[1]["k"].shape == (3,)


def test_is_oom() -> None:
    assert ts.is_oom(torch.OutOfMemoryError("x"))
    assert ts.is_oom(MemoryError())
    assert not ts.is_oom(ValueError())


def test_importing_the_sdk_does_not_import_torch() -> None:
    code = (
        "import sys, tangram_sdk, tangram_sdk.managers.gpu, tangram_sdk.managers._torch_store;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.cuda
@cuda
def test_cuda_restore_is_pinned_bit_identical_and_charged_what_the_allocator_holds() -> None:
    m = Tied().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        ref = m(x)
    store = ts.HostStore(m)
    assert store.pinned and store.buffer.is_pinned()
    rep = store.make_replica("cuda:0")
    # Warm-up: the first forward creates the cuBLAS handle and its workspace (tens of MiB that stay
    # allocated for the process), so the base is taken after it, with the output dropped.
    store.restore([rep])
    out = ts.run_replica(rep, True, (x,), {})
    first = out.cpu()
    del out
    assert store.evict([rep]) == []
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(0)
    for _ in range(3):
        store.restore([rep])
        assert rep.measured == ts.charge(store.footprint)
        delta = torch.cuda.memory_allocated(0) - base
        assert store.footprint <= delta <= rep.measured  # the charge bounds what the allocator hands out
        out = ts.run_replica(rep, True, (x,), {})
        assert out.device.type == "cuda"
        assert torch.equal(out.cpu(), first)  # bit-identical across evict/restore cycles
        del out  # the caller's output is not the service's memory
        assert store.evict([rep]) == []
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated(0) == base
    assert torch.allclose(first, ref, atol=1e-4)


@pytest.mark.cuda
@cuda
def test_cuda_weights_kept_past_eviction_are_reported_held() -> None:
    store = ts.HostStore(Tied().eval())
    rep = store.make_replica("cuda:0")
    store.restore([rep])
    kept = rep.module.a.weight.detach()
    (held,) = store.evict([rep])
    assert held.alive and held.nbytes == rep.measured and held.device == "cuda:0"
    del kept
    assert not held.alive
