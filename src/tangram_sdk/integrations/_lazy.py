"""Import an RL framework only when its adapter is used, and say how to install it when it is missing.

Why lazy: veRL and OpenRLHF pull in Ray, transformers and (by default) CUDA stacks. ``import
tangram_sdk`` must stay cheap and must work on a laptop without them, so the adapters import the
framework at the moment a framework class is first needed, and turn a failed import into one
clear error instead of a ``ModuleNotFoundError`` from deep inside the framework.

``IntegrationUnavailable`` lives in :mod:`tangram_sdk.errors`; it is re-exported here and from
``tangram_sdk``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import IntegrationUnavailable

__all__ = ["IntegrationUnavailable", "require"]


def require(module: str, *, framework: str, install: str) -> ModuleType:
    """Import ``module`` or raise :class:`IntegrationUnavailable` naming ``install``.

    A module that exists but fails on one of *its* imports (veRL's interface modules import
    torch, ray, tensordict...) is reported the same way, with the missing name, because the fix
    is the same: install the framework with its dependencies. When what is missing is one of
    tangram-sdk's own extras (torch under OpenRLHF, say), the hint names that extra instead: ``pip
    install openrlhf`` would pull OpenRLHF's CUDA stack to fix a missing CPU torch.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        from .._optional import EXTRAS, install_hint

        missing = getattr(exc, "name", None)
        what = f"{module!r}" if missing in (None, module) else f"{module!r} (it needs {missing!r})"
        if missing and missing.split(".")[0] in EXTRAS:
            install = install_hint(missing)
        raise IntegrationUnavailable(
            f"the {framework} integration could not import {what}: {exc}. Install it with: {install}",
            framework=framework,
            install=install,
        ) from exc
