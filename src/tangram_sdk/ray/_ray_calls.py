"""The driver's blocking calls into Ray, bounded and with project errors: connecting to the cluster
(once per process), ``ray.get``, and killing an actor until its name is free; with the check of
the seconds that bound them.

Kept apart because :mod:`._deploy` (driver code) and :class:`~tangram_sdk.ray.client.RemoteTangram`
(which connects to Ray off its loop) both make these calls, and a frozen actor or an unreachable
cluster must end each in SchedulerBrokenError rather than a hang or one of Ray's own errors.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from .._deadline import check_timeout
from ..errors import SchedulerBrokenError, SpecError, TangramError
from ._ray import require


def _seconds(name: str, value: Any, *, positive: bool = True) -> float:
    """A finite number of seconds (> 0) or SpecError naming the argument."""
    out = check_timeout(value, name)
    if out is None or (positive and out <= 0):
        raise SpecError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return out


def _ray_get(ref: Any, timeout: float, what: str) -> Any:
    """``ray.get(ref)`` bounded by ``timeout``; Ray's errors become project errors: a timeout or a
    dead actor -> SchedulerBrokenError naming ``what``; an error raised inside the actor/agent ->
    that error when it is a TangramError (SpecError for a bad pool...), else SchedulerBrokenError."""
    ray = require()
    exc_mod = require("ray.exceptions")
    try:
        return ray.get(ref, timeout=timeout)
    except exc_mod.GetTimeoutError:
        raise SchedulerBrokenError(f"{what}: no answer within {timeout:g} s (the actor is frozen, "
                                   f"overloaded or its node is unreachable)") from None
    except exc_mod.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        while True:  # an agent's error re-raised by the actor, Ray's own wrapper: report the original
            if isinstance(cause, exc_mod.RayTaskError) and getattr(cause, "cause", None) is not None:
                cause = cause.cause
            elif isinstance(cause, exc_mod.RaySystemError) and isinstance(getattr(cause, "client_exc", None),
                                                                          BaseException):
                cause = cause.client_exc
            else:
                break
        if isinstance(cause, TangramError):
            raise cause from None
        if isinstance(cause, ImportError):  # an argument the actor/agent could not unpickle
            raise SpecError(f"{what}: {type(cause).__name__}: {cause}; what deploy() sends there (pool, managers) "
                            f"must be importable on every node or picklable by value (define it in a function)") from None
        raise SchedulerBrokenError(f"{what} failed: {type(cause or exc).__name__}: {cause or exc}") from None
    except exc_mod.RayError as exc:  # actor died, object lost, ...
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise SchedulerBrokenError(f"{what}: {type(exc).__name__}: {first}") from None


_INIT_LOCK = threading.Lock()


def _ensure_ray(namespace: str) -> Any:
    """Ray, connected to the cluster (``RAY_ADDRESS``, else the local one); not reaching one is a
    SchedulerBrokenError naming the address (Ray raises a bare ConnectionError)."""
    ray = require()
    with _INIT_LOCK:  # a connect that timed out may still be in ray.init in its thread: one at a time
        if ray.is_initialized():
            return ray
        address = os.environ.get("RAY_ADDRESS", "auto")
        try:
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        except (ConnectionError, TimeoutError) as exc:
            raise SchedulerBrokenError(f"could not connect to the Ray cluster at {address!r}: "
                                       f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return ray


def _kill(actor: Any, name: str, namespace: str, timeout: float) -> bool:
    """Kill ``actor`` and wait (at most ``timeout`` s) until its name is free again.

    ``ray.kill`` only sends the request: for a moment after it ``ray.get_actor`` still returns
    the dying actor, and a ``deploy()`` with ``get_if_exists`` would attach to it and fail. True
    once the name is free or held by another actor (a later deploy's), False at the deadline."""
    ray = require()
    ray.kill(actor)
    mine = actor._ray_actor_id
    end = time.monotonic() + timeout
    while True:
        try:
            if ray.get_actor(name, namespace=namespace)._ray_actor_id != mine:
                return True
        except ValueError:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)
