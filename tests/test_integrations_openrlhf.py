"""The OpenRLHF adapter against OpenRLHF's real agent classes when installed, else the missing path.

With openrlhf importable, the wrapped ``AgentInstanceBase`` subclass is driven by OpenRLHF's own
``MultiTurnAgentExecutor.execute`` (with a stand-in LLM engine and tokenizer, the only parts that
need a GPU model), so the step contract (``rewards.item()``, ``environment_feedback``, ``done``)
is the real one. Without openrlhf, ``with_tangram`` must raise IntegrationUnavailable; that path is
also simulated when openrlhf is installed.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tangram_sdk.errors import SpecError
from tangram_sdk.integrations import IntegrationUnavailable, current_lease
from tangram_sdk.integrations import openrlhf as torlhf
from tangram_sdk.runtime import Tangram
from tangram_sdk.spec import ActionSpec, Amdahl, Elasticity


def _openrlhf_importable() -> bool:
    try:
        importlib.import_module("openrlhf.utils.agent")
    except ImportError:
        return False
    return True


HAVE_OPENRLHF = _openrlhf_importable()
needs_openrlhf = pytest.mark.skipif(not HAVE_OPENRLHF, reason="openrlhf not installed: IntegrationUnavailable tested")


class FakeTokenizer:
    """What the executor calls: ``tok(text=..., return_tensors="pt")["input_ids"][0]`` and decode."""

    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str = "pt") -> dict[str, Any]:
        import torch

        return {"input_ids": torch.tensor([[ord(c) % 97 for c in text]])}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


class FakeEngine:
    """A stand-in for the vLLM engine: answers each turn with a fixed action text."""

    def __init__(self, actions: list[str]) -> None:
        self.actions = actions
        self.calls = 0

    async def generate(self, prompt_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> Any:
        text = self.actions[min(self.calls, len(self.actions) - 1)]
        self.calls += 1
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1, 2, 3], text=text, logprobs=None,
                                                        finish_reason="stop")])


def make_instance_cls() -> tuple[type, dict[str, Any]]:
    from openrlhf.utils.agent import AgentInstanceBase

    seen: dict[str, Any] = {"leases": [], "kw_leases": [], "peak": 0, "now": 0}

    class Env(AgentInstanceBase):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.turn = 0

        async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
            return {"observation": states["observation"]}

        async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
            import torch

            seen["now"] += 1
            seen["peak"] = max(seen["peak"], seen["now"])
            try:
                await asyncio.sleep(0.02)
                seen["leases"].append(current_lease())
                seen["kw_leases"].append(kwargs.get("lease"))
                self.turn += 1
                done = self.turn >= 2
                return {"rewards": torch.tensor(1.0 if done else 0.0), "scores": torch.tensor(1.0),
                        "environment_feedback": "ok" if done else "again", "done": done,
                        "sampling_params": states.get("sampling_params"), "extra_logs": {}}
            finally:
                seen["now"] -= 1

    return Env, seen


async def run_episode(instance_cls: type, actions: list[str]) -> dict[str, Any]:
    from openrlhf.utils.agent import MultiTurnAgentExecutor

    executor = MultiTurnAgentExecutor(instance_cls)
    params = SimpleNamespace(max_tokens=None, logprobs=None)
    out: dict[str, Any] = await executor.execute("prompt", "label", params, 512, FakeTokenizer(), FakeEngine(actions))
    return out


@needs_openrlhf
async def test_each_step_runs_inside_acquire(tangram: Tangram) -> None:
    Env, seen = make_instance_cls()
    Wrapped = torlhf.with_tangram(Env, spec=ActionSpec(kind="env", cpus=1))
    assert Wrapped.__name__ == "Env" and issubclass(Wrapped, Env)
    outs = await asyncio.gather(*(run_episode(Wrapped, ["act"]) for _ in range(4)))
    assert all(o["reward"] == 1.0 and len(o["action_ranges"]) == 2 for o in outs)
    assert len(seen["leases"]) == 8 and all(lease is not None and len(lease.cpus) == 1 for lease in seen["leases"])
    assert seen["kw_leases"] == seen["leases"]  # step takes **kwargs, so it also got lease=
    assert seen["peak"] == 2
    await asyncio.sleep(0.02)
    assert tangram.statistics()["completed"] == 8


@needs_openrlhf
async def test_steps_name_their_episode_and_carry_the_hint(tangram: Tangram) -> None:
    """OpenRLHF builds one agent instance per episode: its elastic steps share a ``group``, so
    the core learns lengths per trajectory, and ``hint_for(states)`` becomes ``expected_s``."""
    from tangram_sdk.scheduler import Submitted

    seen: list[Submitted] = []
    tangram.observers.append(lambda evs, now, ds: seen.extend(e for e in evs if isinstance(e, Submitted)))
    Env, _ = make_instance_cls()
    spec = ActionSpec(kind="tests", cpus=1, elastic=Elasticity("cpu", max_units=2, efficiency=Amdahl(0.9)))
    Wrapped = torlhf.with_tangram(Env, spec=spec, hint_for=lambda st: 12.5 if st["action_text"] == "long" else None)
    await asyncio.gather(run_episode(Wrapped, ["long"]), run_episode(Wrapped, ["short"]))
    by_group: dict[str | None, list[float | None]] = {}
    for e in seen:
        by_group.setdefault(e.spec.group, []).append(e.expected)
    assert None not in by_group and sorted(by_group.values(), key=str) == [[12.5, 12.5], [None, None]]
    seen.clear()
    Off = torlhf.with_tangram(Env, spec=spec, group=False)
    await run_episode(Off, ["x"])
    assert [e.spec.group for e in seen] == [None, None]
    with pytest.raises(SpecError, match="hint_for"):
        torlhf.with_tangram(Env, spec=spec, hint_for=3.0)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="already runs each step inside tangram.acquire"):
        torlhf.with_tangram(Wrapped, spec=spec)  # twice: two acquires per step, a deadlock on a busy pool
    seen.clear()  # group_for: episodes of one task (here the label) share a group
    ByTask = torlhf.with_tangram(Env, spec=spec, group_for=lambda st: st["label"])
    await asyncio.gather(run_episode(ByTask, ["a"]), run_episode(ByTask, ["b"]))
    assert {e.spec.group for e in seen} == {"label"}
    seen.clear()  # advice that raises is ignored (logged once): the step still runs, ungrouped, unhinted
    Raising = torlhf.with_tangram(Env, spec=spec, group_for=lambda st: st["no-such-key"],
                                  hint_for=lambda st: st["no-such-key"])
    await run_episode(Raising, ["c"])
    assert seen and all(e.expected is None for e in seen) and len({e.spec.group for e in seen}) == 1


@needs_openrlhf
async def test_spec_for_failure_is_feedback_and_the_episode_goes_on(tangram: Tangram) -> None:
    Env, seen = make_instance_cls()

    def spec_for(states: Any) -> ActionSpec:
        text = states["action_text"]
        if text == "search":
            return ActionSpec(kind="search", quotas={"search": 1})
        if text == "huge":
            return ActionSpec(kind="huge", cpus=99)
        raise ValueError(f"cannot tell what {text!r} needs")

    Wrapped = torlhf.with_tangram(Env, spec_for=spec_for, pass_lease=False)
    out = await run_episode(Wrapped, ["gibberish", "huge", "search", "search"])
    assert len(out["action_ranges"]) == 4  # two rejected steps, then two real ones
    assert out["extra_logs"] == {}  # from the last, real step
    assert [lease.quotas for lease in seen["leases"]] == [{"search": 1}, {"search": 1}]
    assert seen["kw_leases"] == [None, None]
    bad = await Wrapped().step({"action_text": "?", "sampling_params": None})
    assert bad["done"] is False and bad["rewards"].item() == 0.0 and "environment error" in bad["environment_feedback"]


@needs_openrlhf
async def test_step_errors_propagate_and_release(tangram: Tangram) -> None:
    from openrlhf.utils.agent import AgentInstanceBase

    class Broken(AgentInstanceBase):
        def __init__(self) -> None:
            pass

        async def step(self, states: dict[str, Any], **kwargs: Any) -> Any:
            raise RuntimeError("env crashed")

    Wrapped = torlhf.with_tangram(Broken, spec=ActionSpec(kind="env", cpus=2))
    with pytest.raises(RuntimeError, match="env crashed"):
        await Wrapped().step({})
    await asyncio.sleep(0.02)
    assert tangram.statistics()["cpus_free"] == 2
    with pytest.raises(SpecError):
        torlhf.with_tangram(dict, spec=ActionSpec(kind="x"))
    with pytest.raises(SpecError):
        torlhf.with_tangram(Broken)


def test_missing_openrlhf_raises_integration_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openrlhf.utils.agent", None)
    with pytest.raises(IntegrationUnavailable, match="pip install openrlhf") as info:
        torlhf.with_tangram(object, spec=ActionSpec(kind="x"))
    assert info.value.framework == "openrlhf"
