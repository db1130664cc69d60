"""Restartable CPU actions: run a straggler again, from the start, on cores that sit idle.

Why: moldable sizing decides an action's cores once, at admission, without knowing its length.
During an opening backlog every test starts at its minimum, and the rare very long one keeps its
one core long after the backlog has cleared, ending the RL step alone (seed 2 of the contended
matrix cells: one test of 331 core-seconds, step up to 1.90x fifo4's). Malleability fixes that
for work that can use cores added mid-run; a fixed-worker runner (``pytest -n N``) cannot. But
most sandbox commands are *idempotent*: running the test suite again gives the same answer. An
action declared ``Elasticity(restartable=True)`` may be killed and started over on more cores
(MapReduce's backup tasks, without the duplicate: the cores it held are reused).

A restart throws work away, so it is decided on the only evidence there is, the action's age
and its kind's learned lengths. Lengths are heavy tailed (lognormal, with the log-spread the kind
has learned): the longer an action has run, the longer it is expected to run on, though more
slowly than its age grows. At age ``tau`` on ``m`` cores its expected total is
``M = E[L | L > tau]``; kept, it needs ``M - tau`` more; restarted on ``m'`` cores,
``M * T(m') / T(m)`` from now. It is restarted when

* nothing that needs cores waits, and its NUMA node has idle cores;
* it has run ``AGE`` (4) times its kind's expected length at its size: the matrix's contended
  cells restarted hundreds of tests a step with 1x, and lost 5 % of mean ACT for it;
* the restart, priced like any grant (``T * (1 + mu * m)`` at the clearing price now, which
  counts the arrivals expected soon), is expected to end sooner. At price zero the cores would
  idle and only the action itself is at risk: any expected gain will do. Above zero, others may
  want the cores: the restart must cost at most ``restart_gain`` (default ``GAIN``, 0.5) of
  keeping it, a margin for a length model that is only right on average.

``m'`` is the size its kind would be granted at that price (the idle cores of its node plus its
own). An action restarts at most once: the rule's worst case (it was about to finish) is bounded
by one run at ``m'``, ``T(m')/T(m)`` of what it had done, and it never gives cores back (that
would be a second restart). The decision is a :class:`~.decisions.Resize` of a restartable
action: the runtime kills its ``lease.run``/``lease.exec`` commands and runs them again on the
new cores; the simulator starts its work over. What the kind learns from it is the second run.

:class:`Restarts` is a collaborator the core owns: it holds the running restartable actions and
touches only the ledger it is given.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from ..spec import ActionSpec
from .action import Action, dur_min
from .decisions import Decision, Grant, Resize
from .ledger import Ledger

__all__ = ["Restarts", "expected_length"]

GAIN = 0.5  # the default restart_gain: restart when it costs at most this share of keeping the run
AGE = 4.0  # a restart is considered only past this many times its kind's expected length
_MIN_VAR = 1e-4  # below this the kind's lengths are taken as fixed: past its estimate it is about to end
_SQRT2 = math.sqrt(2.0)


def expected_length(mean: float, var: float, age: float) -> float:
    """``E[L | L > age]`` for a lognormal length ``L`` of mean ``mean`` and log-space variance
    ``var``: what an action of that kind that has already run ``age`` seconds is expected to run
    in all. Pure arithmetic; the far tail uses the Mills-ratio limit ``age * z / (z - s)``."""
    if age <= 0.0 or mean <= 0.0:
        return mean
    if var < _MIN_VAR:
        return max(mean, age)
    s = math.sqrt(var)
    mu = math.log(mean) - 0.5 * var
    z = (math.log(age) - mu) / s
    tail = 0.5 * math.erfc(z / _SQRT2)  # P(L > age)
    if tail > 1e-250:
        part = 0.5 * math.erfc((z - s) / _SQRT2)  # E[L; L > age] / mean
        return max(age, mean * part / tail)
    return age * z / (z - s) if z > s + 1.0 else age * 2.0


class Restarts:
    """The running restartable actions: when each is next worth a look (``look``, and a heap of
    ``(time, id)`` over it whose stale entries are skipped), which were restarted and when (what
    the kind learns from), and how many."""

    __slots__ = ("ledger", "gain", "running", "look", "due", "restarted", "count")

    def __init__(self, ledger: Ledger, gain: float = GAIN) -> None:
        self.ledger = ledger
        self.gain = gain
        self.running: dict[int, Action] = {}
        self.look: dict[int, float] = {}  # id -> when it is next worth a look (first: its expected end)
        self.due: list[tuple[float, int]] = []  # (time, id) over look; an entry look disagrees with is stale
        self.restarted: dict[int, tuple[float, int]] = {}  # id -> (restarted at, units then)
        self.count = 0

    def admitted(self, a: Action) -> None:
        """``a`` was just granted: track it if its spec is restartable (and restarts are on)."""
        el = a.spec.elastic
        if a.eres == "cpu" and el is not None and el.restartable and self.gain > 0.0:
            self.running[a.id] = a
            self._schedule(a.id, a.started + AGE * (a.est_end - a.started))

    def _schedule(self, aid: int, t: float) -> None:
        self.look[aid] = t
        due = self.due
        if len(due) > 2 * len(self.look) + 64:  # mostly stale (released while nothing was idle): rebuild
            due[:] = [(w, i) for i, w in self.look.items()]
            heapq.heapify(due)
        else:
            heapq.heappush(due, (t, aid))

    def released(self, a: Action, now: float) -> tuple[float, float] | None:
        """Forget ``a``; for a restarted one, ``(seconds, units)`` of the run that completed (what
        its kind should learn from), else None."""
        self.running.pop(a.id, None)
        self.look.pop(a.id, None)
        hit = self.restarted.pop(a.id, None)
        if hit is None:
            return None
        t, units = hit
        return now - t, units

    def restart_idle(self, out: list[Decision], now: float, size_of: Callable[[Action], tuple[int, float]],
                     most: Callable[[ActionSpec], int]) -> float | None:
        """Restart the actions whose restart now pays (see the module docstring), the oldest of
        those due first. ``size_of(a)``: the size ``a``'s kind would be granted now and the price per
        core-second then; ``most(spec)``: the size at price zero, a bound on it that is cheap to
        ask. Returns when the next one becomes due (None: none left)."""
        due = self.due
        running = self.running
        L = self.ledger
        sizes: dict[object, tuple[int, float]] = {}  # per spec, until a restart changes the supply

        def sized(a: Action) -> tuple[int, float]:
            hit = sizes.get(a.spec)
            if hit is None:
                hit = sizes[a.spec] = size_of(a)
            return hit

        look = self.look
        ready: list[Action] = []
        while due and due[0][0] <= now:
            t, aid = heapq.heappop(due)
            if look.get(aid) == t:  # else stale: released, restarted, or looked at again since
                ready.append(running[aid])
        # oldest first: the longest-running is the likeliest straggler, and a restart takes the
        # idle cores it would need
        for a in sorted(ready, key=lambda x: x.started):
            aid = a.id
            g = a.grant
            assert g is not None
            free = L.node_free[L.node_of[g.cpus[0]]] if g.cpus else None
            if g.units >= a.emax:
                del look[aid]  # it holds all it may ever get: nothing to restart it onto
            elif free and self._consider(a, g, free, out, now, sized, most(a.spec)):
                sizes.clear()
                del look[aid]  # restarted: never again
            else:
                # not now (no idle core on its node, or not worth it yet): look again a twentieth
                # of its age from now (the expected remainder only grows with the age)
                self._schedule(aid, now + max(0.05 * (now - a.started), 1e-3))
        while due and look.get(due[0][1]) != due[0][0]:
            heapq.heappop(due)
        return due[0][0] if due else None

    def next_due(self) -> float | None:
        """When the next restart check is due (None: none)."""
        due, look = self.due, self.look
        while due and look.get(due[0][1]) != due[0][0]:
            heapq.heappop(due)
        return due[0][0] if due else None

    def _consider(self, a: Action, g: Grant, free: set[int], out: list[Decision], now: float,
                  size_of: Callable[[Action], tuple[int, float]], most: int) -> bool:
        """Restart ``a`` now if that pays (see the module docstring); True if it was. ``most``:
        its kind's size at price zero (the best case, checked before the price is asked)."""
        m = g.units
        best = min(most, m + len(free))
        if best <= m:
            return False
        st = a.stats
        spec = a.spec
        rel_m = st.rel(spec, m)
        d = dur_min(a) * rel_m  # its expected length at its size
        tau = now - a.started
        if tau < AGE * d:
            return False
        total = expected_length(d, st.log_var, tau)
        if total * st.rel(spec, best) / rel_m > total - tau:
            return False  # not even on every idle core at price zero
        want, mu = size_of(a)
        m_new = min(want, m + len(free))
        if m_new <= m or math.isinf(mu):
            return False
        keep = (total - tau) * (1.0 + mu * m)
        ratio = st.rel(spec, m_new) / rel_m
        again = total * ratio * (1.0 + mu * m_new)
        # at price zero the cores would idle: the restart risks only the action itself, and must
        # only be expected to end sooner; when others may want them, by the margin ``gain``
        if again > (self.gain if mu > 0.0 else 1.0) * keep:
            return False
        more = tuple(sorted(free)[: m_new - m])
        self.ledger.take(Grant(a.id, more))
        cpus = tuple(sorted(g.cpus + more))
        a.grant = g._replace(cpus=cpus, units=m_new)
        a.est_end = now + total * ratio
        self.restarted[a.id] = (now, m_new)
        self.count += 1
        out.append(Resize(a.id, cpus, m_new))
        return True
