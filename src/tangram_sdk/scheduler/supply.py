"""Cores the running actions are expected to give back within a window, counted by probability.

The price of cores compares demand with the cores free now plus those running actions release
within its window. Counting each running action at one end estimate (its kind's mean length at
its size) counts about half of what is really released there: with log-normal lengths of
log-sigma 1, 69 % of actions end before their mean, and none of them is counted before its
estimate (measured against the simulator's releases: 0.49 of the cores released within the
window on the medium and contended pools, 0.39-0.47 on a pool eight actions wide;
docs/evaluation.md). So each running action here counts its cores times its probability of ending
by the window's end given how long it has run: its length log-normal with the kind's learned
spread (``KindStats.log_var``) and its estimate as the mean. The price reads it with
``Scheduler(supply="expected")``; the default still reads the estimates' line (releases.py), whose
bias the default ``load_target`` of 1.5 was tuned against (docs/scheduler.md has both, measured).

Kept as arrays beside the release book (one slot per running action, filled when the book merges
its grants) so that a round's window sums are a few array operations, not a pass in Python.
Pure bookkeeping: no clock, no IO.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .action import Action

__all__ = ["ExpectedSupply"]

_SD_MIN = 0.05  # a kind with no spread learned yet is near-deterministic, not exactly (no 0/0)
_VAR_MAX = 4.0  # the spread is capped as the kind's mean is (learn.KindStats._fit)
_KINDS_KEPT = 64  # kinds indexed before the table is rebuilt from the running actions' kinds
# the log of the standard normal's survival function, tabulated at steps of 1e-3 over [-10, 40]
# (linear between steps: within 1e-6 of exact) and read at a computed index: numpy has no erfc,
# and a per-element one, or np.interp's search, cost several times the rest of a window sum. In
# logs, because an action long past the estimate of a kind with little spread has a survival far
# below any float's resolution, and it is the ratio of two such that says it will end soon
_ZLO, _ZHI, _ZSTEP = -10.0, 40.0, 1e-3
_ZN = int(round((_ZHI - _ZLO) / _ZSTEP))


def _log_sf_exact(z: float) -> float:
    if z < 30.0:
        return math.log(0.5 * math.erfc(z / math.sqrt(2.0)))
    # Mills ratio: SF(z) = pdf(z) / z * (1 - 1/z^2 + 3/z^4 - ...), erfc underflows past ~37
    return -0.5 * z * z - math.log(z) - 0.5 * math.log(2.0 * math.pi) + math.log1p(-1.0 / z**2 + 3.0 / z**4)


_LSF = np.array([_log_sf_exact(_ZLO + i * _ZSTEP) for i in range(_ZN + 2)])
_DLSF = np.diff(_LSF)


def _log_sf(z: np.ndarray) -> np.ndarray:
    """log SF(z) of the standard normal, ``z`` clamped below at -10 (SF 1 there, to 8e-24) and
    continued past 40 along its asymptote; overwrites ``z``."""
    far = z.max() > _ZHI if z.size else False
    zf = z.copy() if far else None
    z -= _ZLO
    z *= 1.0 / _ZSTEP
    np.maximum(z, 0.0, out=z)
    np.minimum(z, float(_ZN), out=z)
    i = z.astype(np.intp)
    z -= i
    z *= _DLSF[i]
    z += _LSF[i]
    if zf is not None:
        big = zf > _ZHI
        zb = zf[big]
        z[big] = -0.5 * zb * zb - np.log(zb) - 0.5 * math.log(2.0 * math.pi)
    return z


class ExpectedSupply:
    """Running CPU actions as arrays: start, cores, log of the estimated length, and their kind.
    :meth:`at` readies a round (each action's probability of having ended by now is what its age
    conditions on), :meth:`by` sums the cores expected back by a time."""

    __slots__ = ("_slot", "_ids", "_st", "_start", "_cores", "_lnm", "_kind", "_kinds", "_kind_ix",
                 "_kinds_max", "_n", "_round", "_w", "_ctot", "_mu", "_isd", "_t0", "_l0")

    def __init__(self) -> None:
        self._slot: dict[int, int] = {}  # action id -> its slot; slots 0.._n-1 are filled
        self._ids: list[int] = []  # per slot: the action's id and its kind's learned state
        self._st: list[Any] = []
        cap = 64
        self._start = np.zeros(cap)
        self._cores = np.zeros(cap)
        self._lnm = np.zeros(cap)
        self._kind = np.zeros(cap, dtype=np.intp)
        self._kinds: list[Any] = []  # KindStats per kind index (read for log_var each round)
        self._kind_ix: dict[int, int] = {}  # id(KindStats) -> kind index
        self._kinds_max = _KINDS_KEPT  # past this many, the table is rebuilt from the running
        self._n = 0
        self._round: int | None = None
        self._w = self._mu = self._isd = self._t0 = self._l0 = self._start[:0]
        self._ctot = 0.0

    def add(self, a: Action, cores: int) -> None:
        """``a`` holds ``cores`` now, expected back at ``a.est_end``."""
        i = self._n
        if i == len(self._start):
            for name in ("_start", "_cores", "_lnm", "_kind"):
                old = getattr(self, name)
                new = np.zeros(2 * len(old), dtype=old.dtype)
                new[:i] = old
                setattr(self, name, new)
        st = a.stats
        k = self._kind_ix.get(id(st))
        if k is None:
            k = self._new_kind(st)
        self._start[i] = a.started
        self._cores[i] = cores
        self._lnm[i] = math.log(max(a.est_end - a.started, 1e-9))
        self._kind[i] = k
        self._slot[a.id] = i
        if i == len(self._ids):
            self._ids.append(a.id)
            self._st.append(st)
        else:
            self._ids[i] = a.id
            self._st[i] = st
        self._n = i + 1

    def _new_kind(self, st: Any) -> int:
        """A kind index for ``st``. The table keeps the kinds of running actions: a job that
        churns through kinds (the core forgets all but kinds.MAX_KINDS) must not grow it forever,
        so past ``_kinds_max`` it is rebuilt from the slots."""
        if len(self._kinds) >= self._kinds_max:
            kinds: list[Any] = []
            ix: dict[int, int] = {}
            for j in range(self._n):
                sj = self._st[j]
                k = ix.get(id(sj))
                if k is None:
                    k = ix[id(sj)] = len(kinds)
                    kinds.append(sj)
                self._kind[j] = k
            self._kinds, self._kind_ix = kinds, ix
            self._kinds_max = max(_KINDS_KEPT, 2 * len(kinds))
        k = self._kind_ix[id(st)] = len(self._kinds)
        self._kinds.append(st)
        return k

    def drop(self, aid: int) -> None:
        """``aid`` gave its cores back: the last slot moves into its place."""
        i = self._slot.pop(aid)
        last = self._n - 1
        if i != last:
            for arr in (self._start, self._cores, self._lnm, self._kind):
                arr[i] = arr[last]
            moved = self._ids[last]
            self._ids[i] = moved
            self._st[i] = self._st[last]
            self._slot[moved] = i
        self._st[last] = None  # not kept alive by a slot that is gone
        self._n = last

    def clear(self) -> None:
        self._slot.clear()
        self._ids.clear()
        self._st.clear()
        self._kinds.clear()
        self._kind_ix.clear()
        self._kinds_max = _KINDS_KEPT
        self._n = 0
        self._round = None

    def kinds_held(self) -> int:
        """Kinds in the table (the leak check of tests/test_supply.py)."""
        return len(self._kinds)

    def entries(self) -> list[tuple[int, int]]:
        """``(id, cores)`` of every slot, for the invariant check."""
        return sorted((aid, int(self._cores[i])) for aid, i in self._slot.items())

    def ready(self, rnd: int) -> bool:
        """Whether round ``rnd`` is readied already (its view is kept as of its first ask, as the
        release line is: grants made later in the round are not in it)."""
        return self._round == rnd

    def at(self, now: float, rnd: int) -> None:
        """Ready round ``rnd`` at ``now``: a copy of the running actions' slots and each one's
        survival to its age so far."""
        self._round = rnd
        n = self._n
        if not n:
            self._ctot = 0.0
            self._t0 = self._start[:0]
            return
        sdk = np.array([max(math.sqrt(min(st.log_var, _VAR_MAX)), _SD_MIN) for st in self._kinds])
        sd = sdk[self._kind[:n]]
        mu = self._lnm[:n] - 0.5 * sd * sd  # the estimate is the mean: exp(mu + sd^2 / 2)
        age = np.maximum(now - self._start[:n], 1e-9)
        isd = 1.0 / sd
        z = np.log(age)
        z -= mu
        z *= isd
        cores = self._cores[:n]
        self._w = cores
        self._ctot = float(cores.sum())
        # columns: by_each reads them per time
        self._mu, self._isd, self._l0 = mu[:, None], isd[:, None], _log_sf(z)[:, None]
        self._t0 = self._start[:n, None].copy()

    def by(self, t: float) -> float:
        """Cores expected back by ``t`` (after the round's ``now``), each action's cores times its
        probability of ending by then, given it has not ended yet."""
        return self.by_each([t])[0]

    def by_each(self, ts: list[float]) -> list[float]:
        """:meth:`by` at each of ``ts``, in one pass (start-or-wait reads the supply at each
        awaited release: one pass per walk, not one per release)."""
        if not self._ctot:
            return [0.0] * len(ts)
        x = np.asarray(ts)[None, :] - self._t0
        np.maximum(x, 1e-9, out=x)
        np.log(x, out=x)
        x -= self._mu
        x *= self._isd
        x = _log_sf(x)
        x -= self._l0
        np.exp(x, out=x)  # the chance of still running at each time, given it runs now
        got = self._ctot - self._w @ x
        out: list[float] = np.maximum(got, 0.0, out=got).tolist()
        return out
