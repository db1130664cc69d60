"""tangram_sdk.ray without a cluster: lazy import, the clear error when Ray is missing, spec checks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tangram_sdk import ActionSpec, SpecError, TangramError


def test_importing_the_package_does_not_import_ray() -> None:
    code = "import sys, tangram_sdk, tangram_sdk.ray as r; r.LeaseLostError; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_error_tree() -> None:
    from tangram_sdk.ray import LeaseLostError, NodeLostError, RayNotInstalledError

    assert issubclass(RayNotInstalledError, TangramError) and issubclass(RayNotInstalledError, ImportError)
    assert issubclass(NodeLostError, LeaseLostError) and issubclass(LeaseLostError, TangramError)


async def test_missing_ray_raises_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tangram_sdk.ray import RayNotInstalledError, RemoteTangram, deploy

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(RayNotInstalledError, match=r"pip install 'tangram-sdk\[ray\]'"):
        await RemoteTangram.connect("t")
    with pytest.raises(RayNotInstalledError):
        deploy("t")


def test_acquire_checks_its_arguments_before_any_io() -> None:
    from tangram_sdk.ray import RemoteTangram

    rt = RemoteTangram("t")
    with pytest.raises(SpecError):
        rt.acquire("not a spec")  # type: ignore[arg-type]
    with pytest.raises(SpecError):
        rt.acquire(ActionSpec(kind="x", cpus=1), timeout=-1)
    # built-in exceptions used to escape here (TypeError, OverflowError, unhashable list)
    for bad in ("5", 10**400, float("nan"), True):
        with pytest.raises(SpecError, match="timeout"):
            rt.acquire(ActionSpec(kind="x", cpus=1), timeout=bad)  # type: ignore[arg-type]
    for node in (["a"], 5, ""):
        with pytest.raises(SpecError, match="node"):
            rt.acquire(ActionSpec(kind="x", cpus=1), node=node)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="connect_timeout"):
        RemoteTangram("t", connect_timeout="10")  # type: ignore[arg-type]
    assert "idle" in repr(rt)


def test_wire_frames_split_and_join() -> None:
    from tangram_sdk.ray import _wire

    got: list[object] = []
    proto = _wire.FrameProtocol(lambda p: got.append(__import__("pickle").loads(p)), lambda e: None)
    data = b"".join(_wire.frame(_wire.dumps(("m", i, "x" * i))) for i in range(50))
    for i in range(0, len(data), 7):  # arbitrary TCP segmentation
        proto.data_received(data[i:i + 7])
    assert got == [("m", i, "x" * i) for i in range(50)]
    # a spec with a lambda efficiency model still crosses the wire (cloudpickle fallback)
    pytest.importorskip("ray")
    from tangram_sdk import Elasticity

    spec = ActionSpec(kind="e", cpus=1, elastic=Elasticity("cpu", 4, lambda m: 1.0))
    back = __import__("pickle").loads(_wire.dumps(spec))
    assert back.elastic.efficiency.efficiency(3) == 1.0
