"""OpenRLHF adapter: every environment ``step`` of an agent runs inside ``tangram.acquire``.

Matches OpenRLHF's agent interface as of openrlhf 0.11.2 (``openrlhf/utils/agent.py``):
``AgentInstanceBase`` with ``async reset(states, **kwargs)`` and ``async step(states, **kwargs)``
returning a dict with ``rewards`` (a tensor: the executor calls ``.item()``), ``scores``,
``environment_feedback``, ``done`` and optional ``sampling_params``/``extra_logs``;
``MultiTurnAgentExecutor(agent_instance_cls)`` builds one instance per prompt with no arguments.
OpenRLHF loads ``AgentExecutor`` from ``--train.agent_func_path`` and instantiates it without
arguments, so the runtime is named by ``runtime=`` (an import path or pool mapping) or installed
with :func:`tangram_sdk.integrations.install`.

Why wrap ``step`` and not ``execute``: generation is the LLM engine's business; the step is the
environment action (run tests, call a search API, score with a model) whose resources vary per
action, which is what tangram schedules.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from .._deadline import check_timeout
from ..errors import SpecError, TangramError
from ..lease import Lease
from ..spec import ActionSpec
from ._config import SpecMapper, SpecMappingError, advice, group_of, hint_or_none, name_of_object
from ._host import RuntimeSource, check_spec_fits, current_lease, run_holding, runtime_source
from ._lazy import require

__all__ = ["current_lease", "with_tangram"]

INSTALL = "pip install openrlhf  (its agent interface needs openrlhf, torch, transformers, aiohttp)"

T = TypeVar("T")

#: ``spec_for(states) -> ActionSpec``: the demand of one step, from the step's ``states`` dict
#: (``observation_text``, ``action_text``, ``label``, ``sampling_params``).
StepSpecFor = Callable[[Mapping[str, Any]], ActionSpec]

#: ``hint_for(states) -> seconds | None``: one step's length hint (``expected_s``).
StepHintFor = Callable[[Mapping[str, Any]], "float | None"]


def _error_step(states: Mapping[str, Any], exc: BaseException) -> dict[str, Any]:
    """A step result that tells the agent its action could not run; the episode goes on."""
    torch = require("torch", framework="openrlhf", install=INSTALL)
    zero = torch.tensor(0.0)
    return {
        "rewards": zero,
        "scores": zero,
        "environment_feedback": f"\n[environment error: the action was not run: {exc}]\n",
        "done": False,
        "sampling_params": states.get("sampling_params"),
        "extra_logs": {"tangram_error": 1.0},
    }


def with_tangram(
    instance_cls: type[T],
    *,
    spec: ActionSpec | None = None,
    spec_for: StepSpecFor | None = None,
    runtime: RuntimeSource | None = None,
    timeout: float | None = None,
    pass_lease: bool = True,
    hint_for: StepHintFor | None = None,
    group: bool = True,
    group_for: Callable[[Mapping[str, Any]], object] | None = None,
) -> type[T]:
    """Return a subclass of the OpenRLHF agent instance class whose ``step`` holds a lease.

    ``spec`` is a fixed demand per step, ``spec_for(states)`` derives one per step (e.g. parse the
    tool call in ``states["action_text"]``). When the mapping fails, or the spec can never fit
    the pool, the step returns an error as ``environment_feedback`` with reward 0 and
    ``done=False`` instead of raising (logged once per agent class). ``pass_lease`` passes
    ``lease=`` to ``step`` when its signature takes it or ``**kwargs`` (OpenRLHF's base does);
    :func:`current_lease` works either way. ``reset`` is not wrapped: it builds the episode state.
    ``hint_for(states)``: the step's length hint in seconds (``expected_s``), or None. ``group``:
    an elastic CPU step's spec gets ``group=`` a name of its agent instance (one per episode: one
    trajectory), so the core learns lengths per trajectory. ``group_for(states)``: the step's task
    instead (the ``label``, a prompt id: samples of one prompt are alike), or None for ``group``'s.
    """
    base = require("openrlhf.utils.agent", framework="openrlhf", install=INSTALL).AgentInstanceBase
    if not (isinstance(instance_cls, type) and issubclass(instance_cls, base)):
        raise SpecError(f"with_tangram() needs a subclass of openrlhf AgentInstanceBase, got {instance_cls!r}")
    if getattr(instance_cls, "__tangram_wrapped__", False):
        raise SpecError(f"with_tangram(): {instance_cls.__name__} already runs each step inside tangram.acquire; "
                        f"wrap the plain class once (wrapping it again holds the resources twice per step and "
                        f"can deadlock)")
    if spec is None and spec_for is None:
        raise SpecError("with_tangram() needs spec= or spec_for=")
    if spec_for is not None and not callable(spec_for):
        raise SpecError(f"with_tangram() spec_for must be callable, got {spec_for!r}")
    timeout = check_timeout(timeout)  # a config mistake fails here, not as every step's error
    label = instance_cls.__name__
    runtime = runtime_source(runtime, where=f"with_tangram({label}, runtime=)")
    check_spec_fits(spec if spec_for is None else None, runtime, f"with_tangram({label})")
    mapper = SpecMapper(spec=spec, spec_for=(lambda _n, states: spec_for(states)) if spec_for else None)
    original_step = instance_cls.step  # type: ignore[attr-defined]
    sig_params = inspect.signature(original_step).parameters.values()
    takes_lease = pass_lease and any(
        p.name == "lease" or p.kind is inspect.Parameter.VAR_KEYWORD for p in sig_params
    )

    if hint_for is not None and not callable(hint_for):
        raise SpecError(f"with_tangram() hint_for must be callable, got {hint_for!r}")
    if group_for is not None and not callable(group_for):
        raise SpecError(f"with_tangram() group_for must be callable, got {group_for!r}")

    async def step(self: Any, states: dict[str, Any], **kwargs: Any) -> Any:
        st = states if isinstance(states, Mapping) else {}
        try:
            the_spec = mapper(label, st)
        except SpecMappingError as exc:
            SpecMapper.report(label, exc)
            return _error_step(states, exc)
        if the_spec.group is None and the_spec.elastic_resource == "cpu":
            task = advice(label, "group_for", group_for, st)
            name = group_of(task) if task is not None else name_of_object(self) if group else None
            if name is not None:  # the task, else the instance (the episode: named on its first step)
                the_spec = attrs.evolve(the_spec, group=name)
        hint = hint_or_none(label, advice(label, "hint_for", hint_for, st))

        async def body(lease: Lease) -> Any:
            if takes_lease:
                kwargs.setdefault("lease", lease)
            return await original_step(self, states, **kwargs)

        def refused(exc: TangramError) -> Any:
            SpecMapper.report(label, exc)
            return _error_step(states, exc)

        return await run_holding(the_spec, body, refused, runtime=runtime, timeout=timeout, expected_s=hint)

    step.__doc__ = original_step.__doc__
    return type(label, (instance_cls,), {"step": step, "__module__": instance_cls.__module__,
                                         "__doc__": instance_cls.__doc__, "__tangram_wrapped__": True})
