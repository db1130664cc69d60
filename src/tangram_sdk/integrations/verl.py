"""veRL adapter: run each tool call, non-tool agent action and GPU reward call inside ``tangram.acquire``.

Matches veRL's interfaces as of verl 0.9.1 (``verl/tools/base_tool.py``: ``BaseTool(config,
tool_schema)`` with async ``create``/``execute``/``calc_reward``/``release``, ``execute`` returning
``(ToolResponse, reward, metrics)``; ``verl/tools/tool_registry.py`` building each tool as
``cls(config=<the tool's `config:` mapping>, tool_schema=...)``; reward managers awaiting a
``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **kw)`` when it is a
coroutine function). Everything tangram needs lives under the ``tangram:`` key of a tool's
``config:`` mapping, because that mapping is the one part of the tool YAML veRL hands the tool.

Three entry points:

* ``TangramTool`` -- a ``BaseTool`` whose ``execute`` derives an ActionSpec from the call,
  acquires, then runs the wrapped tool (``tangram.wraps`` in YAML) or ``execute_with_lease``.
* ``tangram_tool(ToolClass)`` -- the same behaviour added to an existing tool class in code.
* ``tangram_reward(spec)`` -- wraps a reward function so each call holds e.g. a GPU + service.
  ``TangramAgentLoopMixin``/``action`` cover agent-loop actions that are not tools.

A call whose arguments cannot be mapped to a spec (or asks for more than the pool can ever give)
returns an error *to the agent* as the tool result, and the rollout goes on; the failure is logged
once per tool name. Infrastructure failures (closed/broken runtime, timeouts, manager errors)
raise, and veRL's ``ToolAgentLoop`` turns them into an error message for that call as it does for
any tool exception.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from .._deadline import check_timeout
from ..errors import SpecError, TangramError
from ..lease import Lease
from ..spec import ActionSpec
from ._config import (SpecFor, SpecMapper, SpecMappingError, advice, group_of, hint_or_none, import_object,
                      name_of_object, spec_from_mapping)
from .._protocol import is_tangram
from ._host import RuntimeSource, action, check_spec_fits, current_lease, run_holding, runtime_source
from ._lazy import require

__all__ = [
    "TangramAgentLoopMixin",
    "TangramToolMixin",
    "action",
    "current_lease",
    "tangram_reward",
    "tangram_tool",
]

INSTALL = ("pip install verl cachetools fastapi uvicorn  (veRL's agent-loop modules import the last three, "
           "which `pip install verl` leaves out; the CPU build of torch is enough)")
_TANGRAM_KEYS = {"spec", "spec_for", "from_parameters", "timeout", "runtime", "pool", "options", "wraps", "group",
                 "group_for", "hint_for"}

T = TypeVar("T")

#: ``hint_for(tool_name, instance_id, parameters, agent_data) -> seconds | None``: one call's
#: length hint (``expected_s``: its seconds at the minimum units, e.g. the last run of the same
#: task's tests); ``agent_data`` is what veRL's ToolAgentLoop passes to ``execute`` (its
#: ``tools_kwargs`` hold the sample's data), or None.
HintFor = Callable[[str, str, Mapping[str, Any], Any], "float | None"]

#: ``group_for(tool_name, instance_id, parameters, agent_data) -> name | None``: what a call is one
#: of for length learning when that is not its trajectory: the task (GRPO samples one prompt
#: several times, all on one repository), e.g. ``agent_data.tools_kwargs[...]["create_kwargs"]
#: ["repo"]``; None falls back to ``group``.
GroupFor = Callable[[str, str, Mapping[str, Any], Any], object]


def _group_mode(value: Any, where: str) -> str | None:
    """``group:`` of a tool's tangram config: "trajectory" (the default) or off (null/false/"none")."""
    if value is None or value is False or value == "none":
        return None
    if value == "trajectory":
        return "trajectory"
    raise SpecError(f"{where}: `group` must be \"trajectory\" (learn lengths per trajectory) or \"none\", "
                    f"got {value!r}")


def _function(cfg: Mapping[str, Any], key: str, default: Any, where: str) -> Any:
    """A callable option of the tangram config (an import path in YAML), or None; checked now."""
    fn = cfg.get(key, default)
    if isinstance(fn, str):
        fn = import_object(fn)
    if fn is not None and not callable(fn):
        raise SpecError(f"{where}: `{key}` must be callable (or an import path), got {fn!r}")
    return fn


def _trajectory_of(instance_id: str, kwargs: Mapping[str, Any]) -> str:
    """A name of the trajectory a call belongs to. veRL's ToolAgentLoop makes a tool instance per
    *call* and passes the trajectory's ``agent_data`` to ``execute``, so the trajectory is that
    object (named once, on first sight: its ``request_id`` is not unique under full determinism);
    a caller that passes none (an older rollout, one instance per trajectory) is grouped by
    ``instance_id``."""
    data = kwargs.get("agent_data")
    name = None if data is None else name_of_object(data)
    if name is not None:
        return name
    return group_of(instance_id)


def _verl_schemas() -> Any:
    return require("verl.tools.schemas", framework="verl", install=INSTALL)


def _error_result(tool_name: str, exc: BaseException) -> tuple[Any, float, dict[str, Any]]:
    text = f"Error: tool '{tool_name}' was not run: {exc}"
    return _verl_schemas().ToolResponse(text=text), 0.0, {"tangram_error": type(exc).__name__}


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class TangramToolMixin:
    """Adds acquire-around-execute to a veRL tool. Put it *first* in the bases.

    Reads ``config["tangram"]`` (keys in ``docs/integrations/verl.md``); code may instead set the
    class attributes ``tangram_spec``/``tangram_spec_for``/``tangram_runtime``/``tangram_timeout``.
    """

    tangram_spec: ActionSpec | None = None
    tangram_spec_for: SpecFor | None = None
    tangram_runtime: RuntimeSource | None = None
    tangram_timeout: float | None = None
    tangram_group: str | None = "trajectory"
    tangram_hint_for: HintFor | None = None
    tangram_group_for: GroupFor | None = None

    name: str
    config: dict[str, Any]

    def _tangram_setup(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        """Validate the ``tangram:`` mapping now, so a bad YAML fails at tool construction."""
        cfg = dict((config or {}).get("tangram") or {})
        unknown = sorted(set(cfg) - _TANGRAM_KEYS)
        if unknown:
            raise SpecError(f"tool config `tangram:` has unknown key(s) {unknown}; allowed: {sorted(_TANGRAM_KEYS)}")
        spec_for = cfg.get("spec_for", self.tangram_spec_for)
        if isinstance(spec_for, str):
            spec_for = import_object(spec_for)
        spec = self.tangram_spec
        if cfg.get("spec") is not None:
            spec = spec_from_mapping(cfg["spec"], default_kind=getattr(self, "name", None))
        if spec is None and spec_for is None:
            raise SpecError(
                f"tool {getattr(self, 'name', type(self).__name__)!r}: set `tangram.spec` (a static spec) or "
                f"`tangram.spec_for` (an import path) in its config, or pass spec=/spec_for= to tangram_tool()"
            )
        self._tangram_mapper = SpecMapper(spec=spec, spec_for=spec_for, from_parameters=cfg.get("from_parameters"))
        where = f"tool {getattr(self, 'name', type(self).__name__)!r} tangram config"
        self._tangram_source: RuntimeSource | None = _config_source(cfg, self.tangram_runtime, where)
        check_spec_fits(spec if spec_for is None and not cfg.get("from_parameters") else None, self._tangram_source, where)
        timeout = cfg.get("timeout", self.tangram_timeout)
        self._tangram_timeout = check_timeout(timeout)  # at build: a typo fails at start-up, not per call
        self._tangram_group = _group_mode(cfg.get("group", self.tangram_group), where)
        self._tangram_hint_for: HintFor | None = _function(cfg, "hint_for", self.tangram_hint_for, where)
        self._tangram_group_for: GroupFor | None = _function(cfg, "group_for", self.tangram_group_for, where)
        return cfg

    def tangram_spec_of(self, parameters: Mapping[str, Any]) -> ActionSpec:
        """The spec of one call; raises SpecMappingError when the arguments do not map."""
        return self._tangram_mapper(self.name, parameters)

    def tangram_expected_s(self, instance_id: str, parameters: Mapping[str, Any],
                           agent_data: Any = None) -> float | None:
        """One call's length hint (``expected_s``), or None: ``hint_for``'s answer by default.
        Override it to read what your tool knows (the size of the task's suite, its last run)."""
        fn = self._tangram_hint_for
        return None if fn is None else fn(self.name, instance_id, parameters, agent_data)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
        """Map the call to a spec, wait for the resources, run the tool body holding them."""
        if not hasattr(self, "_tangram_mapper"):
            self._tangram_setup(getattr(self, "config", None))
        params = parameters if isinstance(parameters, Mapping) else {}
        try:
            spec = self.tangram_spec_of(params)
        except SpecMappingError as exc:
            SpecMapper.report(self.name, exc)
            return _error_result(self.name, exc)
        if spec.group is None and spec.elastic_resource == "cpu":
            # one task's (or else one trajectory's) calls are alike in length: learned together
            task = advice(f"tool {self.name!r}", "group_for", self._tangram_group_for, self.name, instance_id,
                          params, kwargs.get("agent_data"))
            if task is not None:
                spec = attrs.evolve(spec, group=group_of(task))
            elif self._tangram_group is not None:
                spec = attrs.evolve(spec, group=_trajectory_of(instance_id, kwargs))
        hint = hint_or_none(f"tool {self.name!r}", advice(f"tool {self.name!r}", "hint_for", self.tangram_expected_s,
                                                          instance_id, params, kwargs.get("agent_data")))

        async def body(lease: Lease) -> Any:
            return _with_metrics(await self.execute_with_lease(instance_id, parameters, lease, **kwargs), lease)

        def refused(exc: TangramError) -> Any:  # argument-dependent: e.g. too big for this pool
            SpecMapper.report(self.name, exc)
            return _error_result(self.name, exc)

        return await run_holding(spec, body, refused, runtime=self._tangram_source, timeout=self._tangram_timeout,
                                 expected_s=hint)

    async def execute_with_lease(
        self, instance_id: str, parameters: dict[str, Any], lease: Lease, **kwargs: Any
    ) -> Any:
        """The tool body. Default: the next class's ``execute`` (the tool this mixin wraps)."""
        parent: Callable[..., Awaitable[Any]] = super().execute  # type: ignore[misc]
        if _accepts(parent, "lease") and "lease" not in kwargs and _wants_lease(self):
            kwargs["lease"] = lease
        return await parent(instance_id, parameters, **kwargs)


def _config_source(cfg: Mapping[str, Any], code: Any, where: str) -> RuntimeSource | None:
    """The runtime a ``tangram:`` mapping names, parsed now (a bad pool fails at construction).

    A Tangram object given in code is explicit and always used; otherwise the config's ``runtime``
    (import path) or ``pool`` (a definition or a name) replaces a description given in code."""
    if is_tangram(code):
        return code  # type: ignore[no-any-return]
    if cfg.get("runtime") is not None and cfg.get("pool") is not None:
        raise SpecError(f"{where}: give `runtime` (a factory's import path) or `pool`, not both")
    if cfg.get("options") and cfg.get("pool") is None:  # it would be dropped without a word
        raise SpecError(f"{where}: `options` configure a pool defined here; give `pool:` too (a runtime "
                        "factory sets its own options)")
    source: Any = cfg.get("runtime")
    if source is None and cfg.get("pool") is not None:
        source = {"pool": cfg["pool"], "options": cfg.get("options") or {}}
    return runtime_source(code if source is None else source, where=where)


def _wants_lease(tool: Any) -> bool:
    return bool(getattr(tool, "tangram_pass_lease", False))


def _with_metrics(result: Any, lease: Lease) -> Any:
    """Add queueing/units to the tool metrics dict veRL returns (shown in rollout traces)."""
    if isinstance(result, tuple) and len(result) == 3 and isinstance(result[2], dict):
        metrics = {**result[2], "tangram_queued_s": lease.queued_s, "tangram_units": lease.units}
        return result[0], result[1], metrics
    return result


def _not_wrapped_twice(cls: Any, where: str) -> None:
    """A tool that already acquires per call, wrapped again, took the resources twice per call,
    one acquire inside the other: on a busy pool every call held its outer units and waited for
    inner ones that only other such calls held (a deadlock, found by an audit)."""
    if isinstance(cls, type) and issubclass(cls, TangramToolMixin):
        raise SpecError(f"{where}: {cls.__name__} already runs each call inside tangram.acquire; wrap the "
                        f"plain tool once (wrapping it again holds the resources twice per call and can deadlock)")


def tangram_tool(
    tool_cls: type[T],
    *,
    spec: ActionSpec | None = None,
    spec_for: SpecFor | None = None,
    runtime: RuntimeSource | None = None,
    timeout: float | None = None,
    pass_lease: bool = False,
    hint_for: HintFor | None = None,
    group: str | None = "trajectory",
    group_for: GroupFor | None = None,
) -> type[T]:
    """Return a subclass of ``tool_cls`` whose ``execute`` runs inside ``tangram.acquire``.

    ``spec``/``spec_for``/``runtime``/``timeout``/``hint_for``/``group`` are defaults; the tool's
    ``config.tangram`` mapping overrides them. ``pass_lease=True`` also passes ``lease=`` to
    ``execute`` (tools that accept ``**kwargs`` may ignore it; :func:`current_lease` works either
    way). ``hint_for(tool_name, instance_id, parameters, agent_data)``: a call's length hint in
    seconds, or None. ``group="trajectory"``: an elastic CPU call's spec gets a ``group`` naming
    its trajectory (veRL's ``agent_data``, else the tool instance), so the core learns lengths
    per trajectory; None turns it off. ``group_for(tool_name, instance_id, parameters, agent_data)``:
    the call's task instead (a repository, a prompt id: GRPO's samples of one prompt are alike),
    or None for ``group``'s choice.
    """
    if not isinstance(tool_cls, type):
        raise SpecError(f"tangram_tool() needs a tool class, got {tool_cls!r}")
    _not_wrapped_twice(tool_cls, "tangram_tool()")
    attrs_: dict[str, Any] = {
        "tangram_spec": spec,
        "tangram_spec_for": staticmethod(spec_for) if spec_for is not None else None,
        "tangram_runtime": runtime,
        "tangram_timeout": timeout,
        "tangram_pass_lease": pass_lease,
        "tangram_hint_for": staticmethod(hint_for) if hint_for is not None else None,
        "tangram_group": _group_mode(group, "tangram_tool(group=)"),
        "tangram_group_for": staticmethod(group_for) if group_for is not None else None,
        "__module__": tool_cls.__module__,
        "__doc__": f"{tool_cls.__name__} with each call run inside tangram.acquire (tangram_tool).",
    }
    init = tool_cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._tangram_setup(getattr(self, "config", None))

    attrs_["__init__"] = __init__
    return type(f"Tangram{tool_cls.__name__}", (TangramToolMixin, tool_cls), attrs_)


def _make_tangram_tool() -> type:
    base_tool = require("verl.tools.base_tool", framework="verl", install=INSTALL).BaseTool

    class TangramTool(TangramToolMixin, base_tool):  # type: ignore[misc, valid-type]
        """A veRL ``BaseTool`` whose calls run inside ``tangram.acquire``.

        Use it straight from the tool YAML with ``tangram.wraps: pkg.mod.ToolClass`` (the wrapped
        tool gets the same ``config`` minus ``tangram``, and the same schema), or subclass it and
        implement ``execute_with_lease``.
        """

        def __init__(self, config: dict[str, Any], tool_schema: Any = None) -> None:
            config = dict(config or {})
            self._inner: Any = None
            wraps = dict(config.get("tangram") or {}).get("wraps")
            if wraps is not None:
                inner_cls = import_object(wraps) if isinstance(wraps, str) else wraps
                _not_wrapped_twice(inner_cls, "tangram.wraps")
                inner_config = {k: v for k, v in config.items() if k != "tangram"}
                self._inner = inner_cls(config=inner_config, tool_schema=tool_schema)
                tool_schema = tool_schema or self._inner.tool_schema
            super().__init__(config, tool_schema)  # sets self.name from the schema
            self._tangram_setup(config)

        def get_openai_tool_schema(self) -> Any:
            return self._inner.get_openai_tool_schema() if self._inner is not None else self.tool_schema

        async def create(self, instance_id: str | None = None, **kwargs: Any) -> Any:
            if self._inner is not None:
                return await self._inner.create(instance_id, **kwargs)
            return await super().create(instance_id, **kwargs)

        async def execute_with_lease(
            self, instance_id: str, parameters: dict[str, Any], lease: Lease, **kwargs: Any
        ) -> Any:
            if self._inner is not None:
                if _wants_lease(self) and _accepts(self._inner.execute, "lease"):
                    kwargs.setdefault("lease", lease)
                return await self._inner.execute(instance_id, parameters, **kwargs)
            # a configuration error, raised where the tool is called (veRL builds tools lazily)
            raise SpecError(
                f"{type(self).__name__}: set `tangram.wraps` in the tool config or implement execute_with_lease"
            )

        async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
            if self._inner is not None:
                return float(await self._inner.calc_reward(instance_id, **kwargs))
            return float(await super().calc_reward(instance_id, **kwargs))

        async def release(self, instance_id: str, **kwargs: Any) -> None:
            if self._inner is not None:
                await self._inner.release(instance_id, **kwargs)
            else:
                await super().release(instance_id, **kwargs)

    TangramTool.__module__ = __name__
    TangramTool.__qualname__ = "TangramTool"
    return TangramTool


_lazy_classes: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    """``TangramTool`` subclasses veRL's BaseTool, so it is built on first access (PEP 562)."""
    if name == "TangramTool":
        if name not in _lazy_classes:
            _lazy_classes[name] = _make_tangram_tool()
        return _lazy_classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    TangramTool = TangramToolMixin


class TangramAgentLoopMixin:
    """For custom veRL agent loops: ``async with self.tangram_action(spec) as lease:`` around any
    action that is not a tool (an interaction, an environment step, a sandbox reset).

    The agent loop YAML (``agent_loop_config_path``) passes extra keys to the constructor, so
    ``tangram: {runtime: pkg.mod:make}`` (or ``{pool: {...}}``) there configures the runtime;
    put the mixin first in the bases, before ``AgentLoopBase``.
    """

    def __init__(self, *args: Any, tangram: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = dict(tangram or {})
        unknown = sorted(set(cfg) - {"runtime", "pool", "options", "timeout"})
        if unknown:
            raise SpecError(f"agent loop `tangram:` has unknown key(s) {unknown}; allowed: options, pool, runtime, timeout")
        self.tangram_runtime: RuntimeSource | None = _config_source(cfg, None, "agent loop tangram config")
        self.tangram_timeout: float | None = check_timeout(cfg.get("timeout"))

    def tangram_action(self, spec: ActionSpec, *, timeout: float | None = None) -> Any:
        return action(spec, timeout=self.tangram_timeout if timeout is None else timeout,
                      runtime=self.tangram_runtime)


def tangram_reward(
    spec: ActionSpec | Callable[..., ActionSpec],
    *,
    runtime: RuntimeSource | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]:
    """Decorate a veRL ``compute_score`` so every call holds ``spec`` (e.g. ``gpus=1, service="rm"``).

    The result is an ``async def``, so veRL's reward managers await it on their loop instead of
    sending it to a thread. ``spec`` may be a function of the call's keyword arguments
    (``data_source``, ``solution_str``...). The wrapped function gets ``lease=`` when it accepts it
    (call the GPU service with ``await lease.call(...)``); a sync function runs in a worker thread
    while the lease is held.
    """
    if not isinstance(spec, ActionSpec) and not callable(spec):
        raise SpecError(f"tangram_reward needs an ActionSpec or a callable returning one, got {spec!r}")
    runtime = runtime_source(runtime, where="tangram_reward(runtime=)")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        takes_lease = _accepts(fn, "lease")
        is_async = inspect.iscoroutinefunction(fn)

        @functools.wraps(fn)
        async def compute_score(*args: Any, **kwargs: Any) -> Any:
            the_spec = spec if isinstance(spec, ActionSpec) else spec(*args, **kwargs)
            async with action(the_spec, timeout=timeout, runtime=runtime) as lease:
                if takes_lease:
                    kwargs["lease"] = lease
                if is_async:
                    return await fn(*args, **kwargs)
                import anyio.to_thread

                return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

        return compute_score

    return decorate
