"""What the core learns per kind at both ends of an action's life: on arrival, a new kind's
:class:`.KindStats` made (the map bounded) and the length hint observed;
on completion, its duration, efficiency and sandbox length; and what it expects from them
(:meth:`KindLearning.estimated_duration`).

Why apart from the core: the round only reads what is learned (through the shared ``kinds`` map
and each action's ``stats``); which sample is learned from, at which speedup, and when it is not
(a declared duration, a resized run) are the learning rules, not the scheduling ones.
"""

from __future__ import annotations

from ..spec import ActionSpec
from .action import Action, spec_dur_min
from .learn import KindStats
from .lengths import SandboxLengths
from .moldable import RISK_MIN_RATIO, RISK_Z

__all__ = ["MAX_KINDS", "KindLearning"]

MAX_KINDS = 4096  # learned per-kind state kept (least recently seen forgotten beyond it)


class KindLearning:
    __slots__ = ("kinds", "default_duration", "duration_alpha", "learn_efficiency")

    def __init__(self, kinds: dict[str, KindStats], *, default_duration: float, duration_alpha: float,
                 learn_efficiency: bool) -> None:
        self.kinds = kinds  # shared: the sizing, placement and GPU market read it
        self.default_duration = default_duration
        self.duration_alpha = duration_alpha
        self.learn_efficiency = learn_efficiency

    def new_kind(self, kind: str) -> KindStats:
        """The stats of a kind not seen yet (or forgotten), at the prior; the map kept bounded.
        The core observes each arrival on them itself (``observe_arrival``: a call fewer per
        acquire)."""
        if len(self.kinds) >= MAX_KINDS:
            self._forget()
        st = self.kinds[kind] = KindStats(self.default_duration)
        return st

    def hint(self, a: Action, box: str | None, expected: float | None) -> None:
        """The elastic CPU action ``a`` arrived in sandbox (or group) ``box`` with length hint
        ``expected`` (else the sandbox's learned length): a step risk when the hint is its kind's
        one-in-a-thousand (``moldable.CpuSizing.units``)."""
        st = a.stats
        if box is not None:
            a.box = box
            if expected is None and st.sandboxes is not None:
                expected = st.sandboxes.predict(box)  # learned from the sandbox's earlier runs
        if expected is not None:
            a.hint = float(expected)
            a.risk = (st.observe_hint(a.hint) >= RISK_Z
                      and a.hint >= RISK_MIN_RATIO * st.hint_mean())

    def completion(self, a: Action, units: int, exec_s: float, msp: float | None,
                   rerun: tuple[float, float] | None, parallelism: float | None) -> None:
        """``a`` completed after ``exec_s`` at ``units``; ``msp``: its time-weighted speedup when
        malleable and resized, ``rerun``: ``(seconds, units)`` of the completed run when restarted.
        A declared duration learns nothing but the spread of its lengths (``observe_declared``)."""
        if rerun is not None:  # restarted: the kind learns from the run that completed
            exec_s = rerun[0]
        if a.spec.duration is not None:  # only how spread the lengths are (moldable, fragments)
            if a.eres and msp is None:
                a.stats.observe_declared(exec_s, a.spec.relative_duration(units))
        else:
            sp = (a.spec.speedup(units) if msp is None else msp) if a.eres else 1.0
            a.stats.observe_exec(exec_s, sp, self.duration_alpha,
                                 learn_beta=self.learn_efficiency and a.eres is not None,
                                 parallelism=parallelism, units=units if msp is None else 0)
            if a.box is not None and msp is None:
                # the sandbox's length at the minimum units, under the efficiency learned so far
                sb = a.stats.sandboxes
                if sb is None:
                    sb = a.stats.sandboxes = SandboxLengths()
                ran_at = units if rerun is None else int(rerun[1])
                sb.observe(a.box, exec_s / a.stats.rel(a.spec, ran_at))

    def estimated_duration(self, spec: ActionSpec, units: int | None = None) -> float:
        """Seconds ``spec`` is expected to run at ``units`` (its minimum when None)."""
        st = self.kinds.get(spec.kind)
        d_min = spec_dur_min(spec, st, self.default_duration)
        if units is None or spec.elastic is None:
            return d_min
        return d_min * (st.rel(spec, units) if st is not None else spec.relative_duration(units))

    def _forget(self) -> None:
        """Bound what is learned per kind: a job naming kinds per task (``f"pytest-{repo}"``) must
        not grow memory and planning cost forever. The least recently seen quarter is forgotten
        (actions in flight keep their own reference to their kind's stats)."""
        by_age = sorted(self.kinds, key=lambda k: self.kinds[k].last_arrival or 0.0)
        for k in by_age[: len(by_age) // 4]:
            del self.kinds[k]
