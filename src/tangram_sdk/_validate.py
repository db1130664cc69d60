"""Checks shared by everything that validates user input (specs, pools, GPU service names):
the name patterns, an error-message ``repr`` that cannot fail, and number conversions that raise
SpecError instead of TypeError/OverflowError. One private module, so ``pool.py`` and the managers
do not reach into ``spec.py``'s privates."""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import SpecError

__all__ = ["CONTAINER_RE", "NAME_RE", "check_tokens_used", "is_finite", "show", "to_float"]

# Container ids/names as Docker accepts them; validated here so nothing odd reaches a path or an URL.
CONTAINER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/@+-]{0,127}$")


def show(value: Any, limit: int = 200) -> str:
    """``repr`` for error messages that cannot itself fail: ``repr(10**5000)`` raises ValueError
    (the 4300-digit limit) and a hostile ``__repr__`` may raise anything, which would replace the
    SpecError being built; long values are cut so a message stays one readable line."""
    try:
        text = repr(value)
    except Exception:
        text = f"<unprintable {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def to_float(what: str, value: Any) -> float:
    """``float(value)`` or SpecError naming ``what``: specs come from configs and traces, so a bad
    value must surface as the documented SpecError, not a TypeError/ValueError/OverflowError
    (``float(10**400)``) from the conversion."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise SpecError(f"{what} must be a number, got {show(value)}") from None


def is_finite(value: float) -> bool:
    """``math.isfinite`` that treats an int too large for a float (``10**400``) as not finite
    instead of raising OverflowError: no duration or rate that big is meaningful."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_tokens_used(tokens: Any, kind: str, quota: str, used: object) -> int:
    """``report_tokens``' arguments (``tokens``: the spec's ``(quota, tokens)`` pairs): the tokens
    the spec stated for ``quota``; SpecError when it states none or ``used`` is not an int >= 0."""
    stated = dict(tokens).get(quota)
    if stated is None:
        raise SpecError(f"{kind}: its spec draws no tokens of quota {show(quota)}")
    if isinstance(used, bool) or not isinstance(used, int) or used < 0:
        raise SpecError(f"tokens used must be an int >= 0, got {show(used)}")
    return int(stated)
