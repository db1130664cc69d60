"""Specs as the scheduler actor takes them in: unpickled from a client's request, re-validated, and
with a user efficiency model replaced by the table of its values.

Kept apart from :mod:`.actor` because it is the one place where user code (a client's pickled spec,
its efficiency callable) runs inside the shared actor: whatever it raises must fail that one request
with SpecError, never the actor or the connection.
"""

from __future__ import annotations

import pickle

import attrs

from ..errors import SpecError
from ..spec import ActionSpec, Amdahl, Custom, Elasticity, Table


_FROZEN_MAX_UNITS = 4096  # efficiency values kept per spec; beyond, the speedup is held flat
_SPEC_CACHE = 1024  # decoded specs kept by their bytes (rollouts send the same few specs again)


@attrs.frozen
class _Frozen:
    """A user efficiency model's values ``E(1..n)``, taken once at submit: the scheduler actor's
    planning then only indexes a tuple (no user code can raise inside the shared core)."""

    values: tuple[float, ...]

    def __call__(self, m: int) -> float:
        v = self.values
        n = len(v)
        if 1 <= m <= n:
            return v[int(m) - 1]
        return v[-1] * n / m if m > n else v[0]


def _freeze(spec: ActionSpec) -> ActionSpec:
    """Re-validate a spec that arrived pickled (unpickling skips the attrs validators) and replace a
    user efficiency callable by the table of its values. A model that raises or leaves (0, 1] here
    fails this spec only, with SpecError to its caller."""
    el = spec.elastic
    eff = None if el is None else el.efficiency
    try:
        if el is not None and type(eff) not in (Amdahl, Table) and not (
                isinstance(eff, Custom) and isinstance(eff.fn, _Frozen)):
            values = []
            for m in range(1, min(el.max_units, _FROZEN_MAX_UNITS) + 1):
                try:
                    e = float(el.efficiency.efficiency(m))
                except Exception as exc:  # noqa: BLE001 - user code: anything may come out
                    raise SpecError(
                        f"{spec.kind}: the efficiency model raised at m={m} inside the scheduler actor "
                        f"({type(exc).__name__}: {exc}); this spec was refused, nothing else was affected"
                    ) from None
                if not (0.0 < e <= 1.0 + 1e-9):
                    raise SpecError(f"{spec.kind}: the efficiency model gave E({m}) = {e!r} inside the "
                                    f"scheduler actor; it must be in (0, 1]")
                values.append(min(e, 1.0))
            el = Elasticity(el.resource, el.max_units, _Frozen(tuple(values)))
        return attrs.evolve(spec, elastic=el)  # runs every validator again
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - a tampered or half-built spec
        raise SpecError(f"{getattr(spec, 'kind', '?')}: invalid spec ({type(exc).__name__}: {exc})") from None


def _decode_spec(specs: dict[bytes, ActionSpec], kind: str, blob: bytes) -> ActionSpec:
    """The request's spec, unpickled, re-validated and with its efficiency model frozen; any
    failure is a SpecError for this request only (the connection and its leases stay). ``specs``
    keeps the decoded ones by their bytes (cleared when it holds ``_SPEC_CACHE``)."""
    hit = specs.get(blob)
    if hit is not None:
        return hit
    try:
        spec = pickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - a class the actor cannot import, a raising __reduce__...
        raise SpecError(
            f"{kind}: the spec could not be unpickled by the scheduler actor ({type(exc).__name__}: {exc}); "
            f"the classes and callables in it must be importable there or picklable by value") from None
    if not isinstance(spec, ActionSpec):
        raise SpecError(f"{kind}: acquire() needs an ActionSpec, got {type(spec).__name__}")
    spec = _freeze(spec)
    if len(specs) >= _SPEC_CACHE:
        specs.clear()
    specs[blob] = spec
    return spec
