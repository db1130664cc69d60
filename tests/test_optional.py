"""Optional dependencies: a missing package is named with the install that fixes it."""

from __future__ import annotations

import sys

import pytest

from tangram_sdk import IntegrationUnavailable
from tangram_sdk._optional import install_hint, require
from tangram_sdk.integrations._lazy import require as require_framework


def test_hints_name_the_extra() -> None:
    assert install_hint("matplotlib.pyplot") == "pip install 'tangram-sdk[plot]'"
    assert install_hint("aiodocker") == "pip install 'tangram-sdk[docker]'"
    assert install_hint("prometheus_client") == "pip install 'tangram-sdk[prometheus]'"
    torch = install_hint("torch")
    assert torch.startswith("pip install 'tangram-sdk[torch]'")
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in torch
    assert install_hint("openrlhf") == "pip install openrlhf"  # not an extra of ours


def test_require_raises_an_import_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed (even if imported before)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(IntegrationUnavailable) as ei:
        require("matplotlib.pyplot", needed_by="--plot")
    assert isinstance(ei.value, ImportError)
    assert "--plot needs 'matplotlib'" in str(ei.value) and "tangram-sdk[plot]" in str(ei.value)
    assert ei.value.install == "pip install 'tangram-sdk[plot]'"


def test_a_framework_missing_torch_names_the_torch_extra_not_the_framework(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenRLHF's adapter needs torch: the fix for a missing torch is our torch extra (CPU build),
    not ``pip install openrlhf``, which would pull OpenRLHF's CUDA stack."""
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(IntegrationUnavailable) as ei:
        require_framework("torch", framework="openrlhf", install="pip install openrlhf")
    assert ei.value.install.startswith("pip install 'tangram-sdk[torch]'")
    assert "pip install openrlhf" not in str(ei.value)
    # a framework module that is itself missing keeps the framework's own command
    with pytest.raises(IntegrationUnavailable) as ei2:
        require_framework("no_such_framework_xyz", framework="xyz", install="pip install xyz")
    assert ei2.value.install == "pip install xyz"


def test_a_torch_service_without_torch_is_integration_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """README and api.md promise IntegrationUnavailable (with the pip command) when torch is
    missing; registering a torch service gave a ManagerError wrapping ModuleNotFoundError, and the
    user's factory ran first. Offloadable services (no torch) still register."""
    from tangram_sdk import TorchGpuManager
    from tangram_sdk.errors import IntegrationUnavailable

    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed
    m = TorchGpuManager({0: "cpu"})
    called = []
    with pytest.raises(IntegrationUnavailable, match=r"GPU service 'm'.*pip install 'tangram-sdk\[torch\]'") as ei:
        m.register("m", factory=lambda: called.append(1))
    assert ei.value.framework == "torch" and not called and isinstance(ei.value, ImportError)

    class Server:
        footprint = 0

        async def wake(self, devices: object) -> None: ...

        async def sleep(self) -> None: ...

    m.register("srv", offloadable=Server())
