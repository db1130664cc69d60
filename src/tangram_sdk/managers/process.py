"""The process backend: run an argv as a local subprocess pinned to the lease's cores.

For users without Docker. Pinning happens in a tiny Python shim *before* ``exec``, so the command
never runs one instruction outside its cores (``sched_setaffinity`` after spawn would race).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence

from .._deadline import check_timeout
from ..errors import SpecError
from ..lease import ExecResult

__all__ = ["check_argv", "run_pinned"]

_SHIM = (
    "import os,sys\n"
    "c=[int(x) for x in sys.argv[1].split(',') if x]\n"
    "c and hasattr(os,'sched_setaffinity') and os.sched_setaffinity(0,c)\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)


def check_argv(cmd: Sequence[str]) -> list[str]:
    """Refuse shell strings and NUL bytes: commands are argv lists, here and in containers."""
    if isinstance(cmd, (str, bytes)) or not cmd:
        raise SpecError("cmd must be a non-empty argv list such as ['sh', '-c', '...'], not a shell string")
    argv = list(cmd)
    for a in argv:
        if not isinstance(a, str) or "\x00" in a:
            raise SpecError(f"argv elements must be strings without NUL bytes, got {a!r}")
    return argv


_DRAIN_S = 5.0  # after a kill: how long the output may take to end (a detached grandchild may hold it)


async def _read_bounded(stream: asyncio.StreamReader | None, limit: int, kept: bytearray) -> bool:
    """Read everything into ``kept``, keeping at most ``limit`` bytes (a chatty command cannot
    exhaust memory); return whether output was cut. ``kept`` holds what came even if cancelled."""
    if stream is None:
        return False
    truncated = False
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return truncated
        room = limit - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True


async def run_pinned(
    cmd: Sequence[str],
    cpus: Sequence[int],
    *,
    timeout: float | None = None,
    max_output: int = 1 << 20,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin: bytes | None = None,
) -> ExecResult:
    """Run ``cmd`` pinned to ``cpus`` (all cores when empty); kill its process group on timeout or
    cancellation; keep at most ``max_output`` bytes of each of stdout/stderr."""
    argv = check_argv(cmd)
    limit = check_timeout(timeout)
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SHIM, ",".join(str(c) for c in cpus), *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=None if env is None else dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    timed_out = False
    out, err = bytearray(), bytearray()
    truncated = False
    try:
        if stdin is not None and proc.stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()
        readers = asyncio.gather(_read_bounded(proc.stdout, max_output, out),
                                 _read_bounded(proc.stderr, max_output, err))
        # asyncio.wait, not wait_for: it never returns a result in place of a cancel
        done, _ = await asyncio.wait([readers], timeout=limit)
        if not done:
            timed_out = True
            _kill_group(proc)
            done, _ = await asyncio.wait([readers], timeout=_DRAIN_S)
        if done:
            t1, t2 = readers.result()
            truncated = t1 or t2
        else:  # a detached grandchild still holds the pipes: keep what came
            readers.cancel()
            truncated = True
        code = await proc.wait()
    except BaseException:
        _kill_group(proc)
        raise
    return ExecResult(
        exit_code=code, stdout=bytes(out), stderr=bytes(err), duration_s=time.monotonic() - started,
        truncated=truncated, timed_out=timed_out,
    )


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
