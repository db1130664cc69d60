"""Errors of the Ray layer; they live in :mod:`tangram_sdk.errors` (the one tree) and are
re-exported here and from :mod:`tangram_sdk.ray`."""

from __future__ import annotations

from ..errors import LeaseLostError, NodeLostError, RayNotInstalledError

__all__ = ["LeaseLostError", "NodeLostError", "RayNotInstalledError"]
