"""Turn framework config (YAML mappings) into ActionSpecs and Pools, and map tool calls to specs.

Why here: veRL and OpenRLHF both describe tools and environments in YAML/dicts, and a bad key must
fail where the config is read (a SpecError naming the key), not halfway through a rollout. The
mapping from one *call* to a spec is different: the arguments come from the policy model, so a
call that cannot be mapped is the agent's mistake, reported back to it (see :class:`SpecMapper`).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import math
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs

from ..errors import SpecError, SpecMappingError
from ..pool import Pool, Quota
from ..resources import Counted
from .._validate import NAME_RE
from ..spec import ActionSpec, Amdahl, Elasticity

__all__ = [
    "SpecFor",
    "SpecMapper",
    "SpecMappingError",
    "group_of",
    "hint_or_none",
    "name_of_object",
    "import_object",
    "pool_from_mapping",
    "spec_from_mapping",
]

log = logging.getLogger("tangram_sdk.integrations")

#: ``spec_for(tool_name, parameters) -> ActionSpec``: derive one call's demand from its arguments.
SpecFor = Callable[[str, Mapping[str, Any]], ActionSpec]

_SPEC_KEYS = {"kind", "cpus", "gpus", "memory", "needs", "quotas", "elastic", "duration", "priority", "container",
              "service", "group"}
_ELASTIC_KEYS = {"resource", "max_units", "parallel", "efficiency", "malleable", "restartable"}
_FROM_PARAM_KEYS = {"cpus", "gpus", "memory", "duration", "priority", "max_units"}


def import_object(path: str) -> Any:
    """Import ``"pkg.mod:attr"`` (or ``"pkg.mod.attr"``), the way veRL names ``class_name``."""
    if not isinstance(path, str) or not path.strip():
        raise SpecError(f"expected an import path like 'pkg.module:name', got {path!r}")
    mod, sep, attr = path.partition(":")
    if not sep:
        mod, _, attr = path.rpartition(".")
    if not mod or not attr:
        raise SpecError(f"expected an import path like 'pkg.module:name', got {path!r}")
    try:
        obj = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"could not import {path!r}: {exc}") from exc
    return obj


def _plain(value: Any) -> Any:
    """OmegaConf DictConfig/ListConfig -> plain containers (duck-typed: no omegaconf import)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def _check_keys(where: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _elastic(data: Any) -> Elasticity:
    if not isinstance(data, Mapping):
        raise SpecError(f"spec.elastic must be a mapping, got {data!r}")
    _check_keys("spec.elastic", data, _ELASTIC_KEYS)
    if "parallel" in data and "efficiency" in data:
        raise SpecError("spec.elastic: give either parallel (Amdahl) or efficiency (a table), not both")
    eff: Any = Amdahl(0.9)
    if "parallel" in data:
        eff = Amdahl(data["parallel"])
    elif "efficiency" in data:
        table = data["efficiency"]
        if not isinstance(table, Mapping):
            raise SpecError(f"spec.elastic.efficiency must map units to E(units), got {table!r}")
        try:
            eff = {int(k): float(v) for k, v in table.items()}
        except (TypeError, ValueError) as exc:
            raise SpecError(f"spec.elastic.efficiency: {exc}") from exc
    return Elasticity(resource=data.get("resource", "cpu"), max_units=data.get("max_units", 1), efficiency=eff,
                      malleable=data.get("malleable", False), restartable=data.get("restartable", False))


def spec_from_mapping(data: Mapping[str, Any], *, default_kind: str | None = None) -> ActionSpec:
    """Build an ActionSpec from YAML: the ActionSpec fields, with ``elastic`` as
    ``{resource, max_units, parallel | efficiency, malleable, restartable}``. Unknown keys are a SpecError (typos would
    otherwise silently give an action no resources)."""
    data = _plain(data)
    if not isinstance(data, Mapping):
        raise SpecError(f"a spec must be a mapping, got {data!r}")
    _check_keys("spec", data, _SPEC_KEYS)
    fields = dict(data)
    fields.setdefault("kind", default_kind)
    if fields["kind"] is None:
        raise SpecError("spec.kind is required")
    if fields.get("elastic") is not None:
        fields["elastic"] = _elastic(fields["elastic"])
    return ActionSpec(**fields)


def group_of(identity: object) -> str:
    """The spec ``group`` for a framework's per-trajectory identity (veRL's tool instance id, an
    OpenRLHF agent instance's): the id itself when it is a valid name, else a stable digest of it,
    so any id the framework makes names one group and never fails a call."""
    text = str(identity)
    if NAME_RE.fullmatch(text):
        return text
    return "g" + hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def name_of_object(obj: object) -> str | None:
    """A group name for one framework object that stands for a trajectory (veRL's ``agent_data``,
    an OpenRLHF agent instance), kept on the object so all its calls share it; None when the
    object takes no attributes (``__slots__``). A fresh uuid, not ``id(obj)``: ids are reused once
    an object is freed, and a trajectory must not inherit a dead one's lengths."""
    try:
        own = vars(obj)
    except TypeError:
        return None
    name = own.get("_tangram_group")
    if name is None:
        name = own["_tangram_group"] = "t" + uuid.uuid4().hex
    return str(name)


_bad_hints: set[str] = set()


def hint_or_none(label: str, value: object) -> float | None:
    """A length hint from user code (``hint_for``), or None. A hint is advice: one that is not a
    finite number of seconds > 0 is dropped (logged at WARNING once per label) rather than
    failing the call it was meant to speed up."""
    if value is None:
        return None
    if not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 < value < math.inf:
        return float(value)
    if label not in _bad_hints:
        _bad_hints.add(label)
        log.warning("%s: hint_for returned %r, not seconds > 0 or None; the hint is ignored "
                    "(further bad hints of %s are not logged)", label, value, label)
    return None


def advice(label: str, what: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
    """``fn(*args)`` for advice (a ``hint_for`` or ``group_for``: what lengths to expect, what to
    learn them by), or None. One that raises is logged at WARNING once per label and ignored: it
    must not fail the call it was meant to help (a KeyError in a hint once made the tool fail)."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - user code; the call goes on without the advice
        key = f"{label}:{what}"
        if key not in _bad_hints:
            _bad_hints.add(key)
            log.warning("%s: %s raised %s: %s; it is ignored for this call (further failures of %s are not logged)",
                        label, what, type(exc).__name__, exc, what)
        return None


def pool_from_mapping(data: Mapping[str, Any]) -> Pool:
    """Build a Pool from YAML: ``cpus``, ``numa``, ``gpus``, ``gpu_cells``, ``memory``,
    ``resources: {name: capacity | {capacity, unit}}`` and ``quotas: {name: {concurrency, rate, burst}}``."""
    data = _plain(data)
    if not isinstance(data, Mapping):
        raise SpecError(f"a pool must be a mapping, got {data!r}")
    _check_keys("pool", data, {"cpus", "numa", "gpus", "gpu_cells", "memory", "resources", "quotas"})
    fields = dict(data)
    res = fields.pop("resources", None) or {}
    if not isinstance(res, Mapping):
        raise SpecError(f"pool.resources must map names to a capacity or {{capacity, unit}}, got {res!r}")
    resources: dict[str, int | Counted] = {}
    for name, r in res.items():
        if isinstance(r, Mapping):
            _check_keys(f"pool.resources.{name}", r, {"capacity", "unit"})
            if "capacity" not in r:
                raise SpecError(f"pool.resources.{name} needs a capacity, got {r!r}")
            resources[name] = Counted(**r)
        else:
            resources[name] = r
    quotas = fields.pop("quotas", None) or {}
    if not isinstance(quotas, Mapping):
        raise SpecError(f"pool.quotas must map names to {{concurrency, rate, burst}}, got {quotas!r}")
    built: dict[str, Quota] = {}
    for name, q in quotas.items():
        if not isinstance(q, Mapping):
            raise SpecError(f"pool.quotas.{name} must be a mapping, got {q!r}")
        _check_keys(f"pool.quotas.{name}", q, {"concurrency", "rate", "burst"})
        built[str(name)] = Quota(**q)
    return Pool(quotas=built, resources=resources, **fields)


class SpecMapper:
    """Maps one tool call ``(tool_name, parameters)`` to an ActionSpec.

    Sources, first match wins: ``spec_for`` (code or an import path in YAML); a static ``spec``
    plus ``from_parameters`` (``{spec_field: parameter_name}``, each an int/float argument). Any
    failure becomes :class:`SpecMappingError`; it is logged at WARNING the first time per tool
    name (with the reason) and at DEBUG after that, so a policy that keeps producing bad
    arguments cannot flood the log.
    """

    _warned: ClassVar[set[str]] = set()
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        *,
        spec: ActionSpec | None = None,
        spec_for: SpecFor | None = None,
        from_parameters: Mapping[str, str] | None = None,
    ) -> None:
        if spec is None and spec_for is None:
            raise SpecError("give a static spec or a spec_for(tool_name, parameters) callable")
        if spec is not None and not isinstance(spec, ActionSpec):
            raise SpecError(f"spec must be an ActionSpec, got {spec!r}")
        if spec_for is not None and not callable(spec_for):
            raise SpecError(f"spec_for must be callable, got {spec_for!r}")
        fp = dict(_plain(from_parameters) or {})
        _check_keys("from_parameters", fp, _FROM_PARAM_KEYS)
        if fp and spec is None:
            raise SpecError("from_parameters adjusts a static spec; give spec too")
        if fp and spec_for is not None:  # spec_for wins: from_parameters would never apply
            raise SpecError("from_parameters adjusts the static spec, but spec_for maps every call; give one of them")
        self.spec = spec
        self.spec_for = spec_for
        self.from_parameters: dict[str, str] = {str(k): str(v) for k, v in fp.items()}

    def __call__(self, tool_name: str, parameters: Mapping[str, Any]) -> ActionSpec:
        try:
            return self._map(tool_name, parameters)
        except SpecMappingError:
            raise
        except Exception as exc:  # the model's arguments reach user code: any error there is the call's
            raise SpecMappingError(f"{type(exc).__name__}: {exc}") from exc

    def _map(self, tool_name: str, parameters: Mapping[str, Any]) -> ActionSpec:
        if self.spec_for is not None:
            spec = self.spec_for(tool_name, parameters)
            if not isinstance(spec, ActionSpec):
                raise SpecMappingError(f"spec_for returned {type(spec).__name__}, not an ActionSpec")
            return spec
        assert self.spec is not None
        if not self.from_parameters:
            return self.spec
        changes: dict[str, Any] = {}
        for field, pname in self.from_parameters.items():
            if pname not in parameters:
                raise SpecMappingError(f"missing argument {pname!r} (it sets {field})")
            value = parameters[pname]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise SpecMappingError(f"argument {pname!r} must be a finite number, got {value!r}")
            changes[field] = value if field == "duration" else int(value)
        max_units = changes.pop("max_units", None)
        spec = attrs.evolve(self.spec, **changes)
        if max_units is not None:
            if spec.elastic is None:
                raise SpecMappingError("from_parameters.max_units needs spec.elastic")
            spec = attrs.evolve(spec, elastic=attrs.evolve(spec.elastic, max_units=max_units))
        return spec

    @classmethod
    def report(cls, tool_name: str, exc: BaseException) -> None:
        """Log a mapping failure: once per tool name at WARNING, then at DEBUG."""
        with cls._lock:
            first = tool_name not in cls._warned
            cls._warned.add(tool_name)
        if first:
            log.warning(
                "tool %r: arguments could not be mapped to an ActionSpec (%s); the call returns an "
                "error to the agent. Further failures of this tool are logged at DEBUG.", tool_name, exc,
            )
        else:
            log.debug("tool %r: arguments could not be mapped to an ActionSpec (%s)", tool_name, exc)
