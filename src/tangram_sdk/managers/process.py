"""Moved to :mod:`tangram_sdk.process` (pinning a subprocess is not a manager); this name
re-exports it for one release."""

from ..process import ExecResult, MemoryScope, check_argv, memory_enforcement, run_pinned

__all__ = ["ExecResult", "MemoryScope", "check_argv", "memory_enforcement", "run_pinned"]
