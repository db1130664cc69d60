"""Optional dependencies: import them when a feature needs them, and name the extra that installs them.

Why one helper: a bare ``No module named 'torch'`` leaves the user to guess, and the obvious guess
can be wrong (``pip install openrlhf`` pulls a CUDA stack; a bare ``pip install torch`` pulls the
CUDA build on Linux). Every lazy import and example goes through :func:`require`, so the message
always says which extra of ``tangram-sdk`` to install, and for torch how to get the CPU build.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import IntegrationUnavailable

__all__ = ["EXTRAS", "TORCH_CPU_INDEX", "install_hint", "require", "require_or_exit"]

#: top-level module -> the ``tangram-sdk`` extra that installs it
EXTRAS = {
    "torch": "torch",
    "matplotlib": "plot",
    "aiodocker": "docker",
    "ray": "ray",
    "prometheus_client": "prometheus",
}
#: the PyTorch index that serves CPU-only wheels on every platform
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install_hint(module: str) -> str:
    """The pip command that provides ``module`` (``"torch.nn"`` -> the torch extra)."""
    top = module.split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return f"pip install {top.replace('_', '-')}"
    hint = f"pip install 'tangram-sdk[{extra}]'"
    if top == "torch":
        hint += f" (for the CPU-only build, first: pip install torch --index-url {TORCH_CPU_INDEX})"
    return hint


def require(module: str, *, needed_by: str) -> ModuleType:
    """Import ``module`` or raise :class:`IntegrationUnavailable` (an ImportError) whose message
    names what needed it and the install command for the module that is really missing (which
    may be a dependency of ``module``, e.g. torch under openrlhf)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or module
        top = missing.split(".")[0]
        hint = install_hint(top)
        raise IntegrationUnavailable(f"{needed_by} needs {top!r} ({exc}). Install it with: {hint}",
                                     framework=top, install=hint) from exc


def require_or_exit(module: str, *, needed_by: str) -> ModuleType:
    """For scripts and examples: :func:`require`, but a missing module ends the program with the
    one-line message (exit status 1) instead of a traceback."""
    try:
        return require(module, needed_by=needed_by)
    except IntegrationUnavailable as exc:
        raise SystemExit(str(exc)) from None
