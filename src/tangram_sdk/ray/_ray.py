"""The one place that imports Ray (lazily: the core never needs it)."""

from __future__ import annotations

import importlib
from typing import Any

from ._errors import RayNotInstalledError


def require(module: str = "ray") -> Any:
    """Return ``ray`` (or one of its submodules) or raise :class:`RayNotInstalledError`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RayNotInstalledError(
            "tangram_sdk.ray needs Ray: pip install 'tangram-sdk[ray]' (or pip install 'ray>=2.9')"
        ) from exc


async def awaited(ref: Any) -> Any:
    """A coroutine over a Ray ObjectRef: what ``within`` and ``asyncio.create_task`` take (an
    ObjectRef is awaitable but not a coroutine)."""
    return await ref
