"""The data path between clients and the scheduler actor: length-prefixed pickled tuples over one TCP
connection per client process.

Why not plain Ray actor calls: a Ray call costs ~1.7 ms median on a loaded 2-core box, a framed
message on an established socket ~0.2 ms, and the connection doubles as the client's lifetime (a
killed process closes it at once). Ray still places the actor and hands out the endpoint and a
secret token; the first frame of every connection must be that token, checked before anything is
unpickled.

Client -> actor: ``("acq", key, kind, spec_bytes, timeout, node, caller_node)``, ``("rel", key, failed[, ack[, parallelism]])``,
``("cancel", key[, ack])``, ``("hb",)``, ``("stats", key)``.
Actor -> client: ``("welcome", config)``, ``("grant", key, fields)``, ``("err", key, exc)``,
``("lost", key, exc)``, ``("reply", key, value)``, ``("ack", key)``, ``("hb",)``,
``("rsz", key, cpus, units)``.

Frames evolve by appending fields (a reader takes the ones it knows and ignores the rest) and by
new operations, which an older reader ignores: ``rsz`` (a held malleable lease now has ``cpus``,
``units``, after the node's scheduler resized it and its agent applied that) is lost on an older
client, whose work then keeps its first cores, as before ``rsz`` existed.

A plain release is pipelined (nothing comes back). A cancelled, timed-out or failed action asks
for an ``ack``: the actor answers once the units are back in the pool, and the client raises only
then (bounded by one heartbeat), so a cancel never propagates while its units are still held.

The spec travels pickled *inside* the envelope (``spec_bytes``): the envelope holds only builtins
and always decodes, so a spec the actor cannot unpickle (a model class it cannot import, a
``__reduce__`` that raises) fails that one request with SpecError instead of the connection.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from collections.abc import Callable
from typing import Any

from ..errors import TangramError

_LEN = struct.Struct("!I")
MAX_FRAME = 64 << 20


def dumps(msg: Any) -> bytes:
    try:
        return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - lambdas in efficiency models and the like
        from ._ray import require

        data: bytes = require("ray.cloudpickle").dumps(msg)
        return data


def encode_spec(spec: Any) -> bytes:
    """The spec as bytes for an ``acq`` envelope; SpecError when it cannot be pickled at all (an
    efficiency callable holding a lock, a socket, a generator...)."""
    from ..errors import SpecError

    try:
        return dumps(spec)
    except Exception as exc:  # noqa: BLE001 - pickle/cloudpickle raise TypeError, PicklingError, ...
        kind = getattr(spec, "kind", "?")
        raise SpecError(f"{kind}: the spec cannot be pickled for the scheduler actor "
                        f"({type(exc).__name__}: {exc}); efficiency callables must be picklable "
                        f"(cloudpickle ships lambdas and local functions, not locks or sockets)") from exc


def frame(payload: bytes) -> bytes:
    return _LEN.pack(len(payload)) + payload


def portable_error(exc: BaseException) -> BaseException:
    """An exception that survives pickling (falls back to TangramError with the repr)."""
    try:
        pickle.loads(dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - anything unpicklable crosses as its text
        return TangramError(f"{type(exc).__name__}: {exc}")


class FrameProtocol(asyncio.Protocol):
    """Splits the byte stream into frames and hands each payload to ``on_frame``."""

    def __init__(self, on_frame: Callable[[bytes], None], on_lost: Callable[[Exception | None], None]) -> None:
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.max_frame = MAX_FRAME  # the actor lowers it until a connection has authenticated
        self._out: list[bytes] = []
        self._batching = False  # a frame went out this iteration: queue the rest until it ends

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if size > self.max_frame:
                assert self.transport is not None
                self.transport.abort()
                return
            if n - pos - 4 < size:
                break
            payload = bytes(buf[pos + 4:pos + 4 + size])
            pos += 4 + size
            self._on_frame(payload)
            if self.transport is None or self.transport.is_closing():
                break
        del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_lost(exc)

    def send(self, msg: Any) -> bool:
        """Send one message. The first of an event-loop iteration is written at once; those that
        follow in the same iteration are queued and go out in one write when it ends (a burst of
        hundreds of acquires/releases costs two syscalls, and a lone release is never held back
        by the loop being busy or blocked afterwards)."""
        t = self.transport
        if t is None or t.is_closing():
            return False
        payload = dumps(msg)
        if self._batching:
            self._out.append(_LEN.pack(len(payload)))
            self._out.append(payload)
        else:
            t.write(_LEN.pack(len(payload)) + payload)
            self._batching = True
            asyncio.get_running_loop().call_soon(self.flush)
        return True

    def flush(self) -> None:
        """Write what :meth:`send` queued (call it before closing the transport)."""
        self._batching = False
        out = self._out
        if not out:
            return
        self._out = []
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(b"".join(out))
