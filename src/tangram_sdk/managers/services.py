"""GPU services that are not torch modules in this process: an external server (vLLM, SGLang, a
custom inference process) that can release and re-acquire its GPU memory on request.

:class:`OffloadableService` is the protocol :class:`~tangram_sdk.managers.gpu.TorchGpuManager`
manages such a server through (``register(name, offloadable=...)``: restore = wake, evict = sleep, in
the same memory ledger and LRU as torch modules); :class:`HttpSleepWake` implements it for servers
with vLLM-style ``/sleep`` and ``/wake_up`` endpoints. Both are also importable from
``tangram_sdk.managers.gpu``.
"""

from __future__ import annotations

import json
import math
import logging
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import anyio

from ..errors import DeviceError, SpecError

__all__ = ["HttpSleepWake", "OffloadableService"]

log = logging.getLogger(__name__)


@runtime_checkable
class OffloadableService(Protocol):
    """An external server that can release and re-acquire its GPU memory (vLLM sleep/wake style).

    ``footprint``: bytes it occupies on each device while awake. ``wake(devices)`` must return only
    once the server is ready to serve; ``sleep()`` only once the memory is free. A server is a single
    process, so it has at most one awake instance at a time. If it defines ``async call(...)``, that
    becomes ``lease.call``; ``lease.service`` is the adapter itself.
    """

    footprint: int

    async def wake(self, devices: tuple[str, ...]) -> None: ...

    async def sleep(self) -> None: ...


class HttpSleepWake:
    """OffloadableService for vLLM-style servers: ``POST /sleep?level=N`` and ``POST /wake_up``
    (vLLM exposes them with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``). The server owns
    its GPUs; ``devices`` is only logged. Uses the stdlib in a worker thread, so no extra dependency;
    every request has ``timeout`` seconds in all (a server that trickles its reply a byte at a
    time included) and a failure is a :class:`DeviceError` naming the URL (a cancel or the bound
    leaves the worker thread to finish on its own). ``call(path, payload)`` POSTs JSON (e.g.
    ``/v1/completions``) and returns the decoded reply."""

    def __init__(self, base_url: str, footprint: int, *, level: int = 1, timeout: float = 60.0) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise SpecError(f"base_url must be an http(s) URL, got {base_url!r}")
        if isinstance(footprint, bool) or not isinstance(footprint, int) or footprint < 0:
            raise SpecError(f"footprint must be bytes >= 0, got {footprint!r}")
        if isinstance(level, bool) or not isinstance(level, int) or level < 0:
            raise SpecError(f"level must be an int >= 0 (vLLM: 1 or 2), got {level!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise SpecError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.base_url = base_url.rstrip("/")
        self.footprint = footprint
        self.level = level
        self.timeout = timeout

    async def wake(self, devices: tuple[str, ...]) -> None:
        log.debug("waking %s for %s", self.base_url, devices)
        await self._post("/wake_up", None)

    async def sleep(self) -> None:
        await self._post(f"/sleep?level={self.level}", None)

    async def call(self, path: str, payload: Mapping[str, Any]) -> Any:
        return await self._post(path, payload)

    async def _post(self, path: str, payload: Mapping[str, Any] | None) -> Any:
        data = b"" if payload is None else json.dumps(payload).encode()

        def do() -> Any:
            req = urllib.request.Request(self.base_url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # scheme checked in __init__
                body = resp.read()
            return json.loads(body) if body.strip() else None

        try:
            # the socket timeout bounds each read, not the reply: bound the whole request here
            with anyio.fail_after(self.timeout):
                return await anyio.to_thread.run_sync(do, abandon_on_cancel=True)
        except TimeoutError as exc:
            raise DeviceError(f"{self.base_url}{path} did not answer within {self.timeout:g} s",
                              resource=self.base_url) from exc
        except OSError as exc:
            raise DeviceError(f"{self.base_url}{path} failed: {exc!r}", resource=self.base_url) from exc
        except ValueError as exc:  # a reply that is not JSON
            raise DeviceError(f"{self.base_url}{path} answered with something that is not JSON: {exc}",
                              resource=self.base_url) from exc

    def __repr__(self) -> str:
        return f"<HttpSleepWake {self.base_url} {self.footprint / 1e9:.1f}GB>"
