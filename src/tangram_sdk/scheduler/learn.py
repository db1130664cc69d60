"""Online estimates per action kind: single-unit duration, efficiency and arrival rate.

All are decaying averages, so a workload that drifts (longer tests late in training, a machine
that gets busy) is followed within a few dozen actions, and all are pure arithmetic on given
times.
"""

from __future__ import annotations

import math
from typing import Any

from .lengths import HORIZON, SandboxLengths, add_sample

__all__ = ["ACT_ALPHA", "KindStats", "UP_MIN", "amdahl_speedup"]

RING = 32
SLOW = 512  # arrivals over which slow_rate averages (moldable.CpuSizing._heavy_dop)
# a kind whose last LONE arrivals each found none of its own in flight is one caller's loop (a
# notebook, a rollout worker stepping one trajectory): none of its arrivals comes while one of its
# actions runs, so its own forecast is left out of that action's price (moldable.CpuSizing._market)
LONE = RING
# the weight of one completion in KindStats.act (the last ~16 completions)
ACT_ALPHA = 1.0 / 16.0
_PRIOR_SD = 0.5  # how far from the declared efficiency (beta = 1) the prior lets beta move easily
_MIN_PER_SIZE = 32  # completions at a size before it counts as evidence about the slope
# ... or this many times the most of the kind ever in flight at once, if fewer: what biases the
# per-size means is the long runs still in flight when the short ones have completed, and a kind
# that never has more than a few in flight (a closed pool of a few callers: tiny_busy.py) has at
# most those few missing from a size's sample, where a burst of hundreds misses most of its long
# ones. A job of a few callers makes too few completions to ever reach 32 per size at two sizes
# (8 trajectories on 8 cores, tests declared Amdahl 0.95 and truly flat, durations only: 1.37x ->
# 1.26x the best fixed DoP's mean ACT; benchmarks/tiny_busy.py --durations --without censor)
_CENSOR = 2
# ... and on so few only a slope this many posterior sds from the declared one moves beta: in the
# open loop, where a peak of a handful in flight is common at light load, slopes fitted on 10-20
# completions a size moved its cells by up to 0.02 either way (lengths learned: 10 -> 13 of 54
# losing; heavy tails up to 0.06), and four trajectories on 4 cores with a true declaration went
# 1.006 -> 1.018x
_SIG_Z = 2.0
_BETA_MAX = 1.25
_PAIRED_VAR = 0.02  # variance of log(measured parallelism) around beta * log(declared speedup)
# least range of log declared speedup, over sizes with _MIN_PER_SIZE completions each, before
# durations alone may move beta (1.42x: 6 vs 16 cores at Amdahl 0.9 qualifies, 8 vs 16 does not):
# between close sizes the mix of lengths that completes at each (sizes granted in a burst vs in a
# quiet spell) moves the per-size means more than the declared speedups differ
_MIN_SPREAD = 0.35
# arrivals closer than this are simultaneous (a burst, not a rate): the same floor as rate()'s gap;
# a span of 5e-324 s gave a rate of inf and NaN in the GPU market (found by Hypothesis)
_SIMULTANEOUS = 1e-6
# measured parallelism above what the declaration can reach (an upgrade, see KindStats._fit): the
# decayed count of such completions before an Amdahl fit replaces the declared shape, and the
# least parallel fraction a flat declaration (Amdahl(0.0): one size for every price) is upgraded to
UP_MIN = 1.5  # two completions (their decayed weight: 1.97)
_UP_FLAT_P = 0.2
_UP_P_MAX = 0.999
# t1's mean over its geometric mean from the lengths themselves (_mean_excess): completions a
# kind's sizes must add up to, and how many standard errors below the log-normal's the plain
# average must be, before it replaces the log-normal formula
_SMEAR_N = 128.0
_SMEAR_Z = 3.0
_SMEAR_EVERY = 63  # re-checked at every 64th completion (a mask): the hot path's call budget
# a kind's log lengths are read by their right tail (right_spread) once this many have been seen and
# their skewness is this many standard errors below zero: exponential lengths (skew -1.14) are
# found in 64 % of samples of 64 and 95 % of 128, normal logs (log-normal lengths) in 0.6 %
_SKEW_MIN = 32.0
_SKEW_Z = 2.5


def amdahl_speedup(p: float, m: int) -> float:
    """Amdahl's speedup at ``m`` units for parallel fraction ``p`` (the shape an upgrade learns)."""
    return 1.0 / ((1.0 - p) + p / m)


def _spreads(bs: dict[tuple[float, int], list[float]], few: float) -> tuple[float, float]:
    """Range of log declared speedup over the sizes with ``_MIN_PER_SIZE`` completions each, and
    over those with ``few`` each (one pass, no builtins: it runs at every completion)."""
    lo = flo = math.inf
    hi = fhi = -math.inf
    for (x, _u), (w, _m, _v, _e, _h, _k) in bs.items():
        if w >= _MIN_PER_SIZE:
            if x < lo:
                lo = x
            if x > hi:
                hi = x
        if w >= few:
            if x < flo:
                flo = x
            if x > fhi:
                fhi = x
    return (hi - lo if hi > lo else 0.0), (fhi - flo if fhi > flo else 0.0)


def _mean_excess(var: float, n: float, smear: float) -> float | None:
    """log(mean / geometric mean) of a kind's lengths where the log-normal's ``var / 2`` is
    significantly too high, else None (keep it). ``smear``: the lengths' own mean over their
    geometric mean (Duan's smearing factor, averaged per size over the same ~500 completions).
    Lengths whose logs are skewed left, as exponential ones are, have a mean the log-normal
    formula puts 28 % too high. Only downward and only past ``_SMEAR_Z`` standard errors of that
    average (under the log-normal): a log-normal kind keeps the formula, a plain mean of heavy
    tails is noisy and early completions are the short ones (docs/scheduler.md: an EWMA jumped
    to 13.8 s)."""
    c = 0.5 * min(var, 4.0)
    if smear > 0.0 and n >= _SMEAR_N:
        low = math.log(smear)
        if low < c - _SMEAR_Z * math.sqrt(math.expm1(2.0 * c) / n):
            return low if low > 0.0 else 0.0
    return None


def right_spread(n: float, var: float, upper: float, third: float) -> float:
    """The spread of log lengths seen ``n`` times (or weight) with variance ``var``, mean squared
    deviation above their mean ``upper`` and mean cubed deviation ``third``: ``var``, unless they
    are skewed left past ``_SKEW_Z`` standard errors of a normal sample's skewness (``sqrt(6 /
    n)``, from ``_SKEW_MIN`` samples on), then ``2 * upper``: the log-normal whose right tail
    theirs is. Log-normal lengths (skew 0) keep their variance; exponential ones (skew -1.14)
    read 1.18 instead of 1.64."""
    if n >= _SKEW_MIN and var > 0.0 and third < -_SKEW_Z * math.sqrt(6.0 / n) * var * math.sqrt(var):
        return 2.0 * upper
    return var


class KindStats:
    """What the scheduler has learned about one ``kind`` of action.

    Durations and efficiency come from one regression. Each completion gives ``y = log(exec)`` at
    ``x = log S(m)``, the *declared* speedup at the units it ran on; the truth is taken to be
    ``y = a - beta * x + noise``: ``beta = 1`` is the declared model, ``beta = 0`` means more units
    do not help at all (a busy machine, a tool that ignores its cores). ``beta`` is fitted by
    weighted least squares with the declaration as a Gaussian prior (it moves only as far as the
    spread of granted sizes lets the data speak), ``a`` gives the single-unit duration
    ``t1 = exp(a + var / 2)`` (the mean of a lognormal: action lengths are heavy tailed, and a
    plain average of durations jumps by the size of the last outlier). Per-size averages decay by
    ``alpha`` per sample, so a drifting workload is followed.
    """

    __slots__ = ("t1", "t1_samples", "gap", "last_arrival", "arrivals", "spec", "ring", "ring_i",
                 "log_var", "_log_upper", "_log_skew", "_log_n", "beta", "buckets", "_rel", "_rel_shape", "_pxx", "_pxy", "hints", "sandboxes",
                 "up", "measured", "_avv", "_auv", "up_n", "inflight", "lone", "declared", "act", "peak",
                 "slow_gap", "_low")

    def __init__(self, prior_t1: float) -> None:
        self.t1 = prior_t1  # seconds at one unit of the elastic resource (or plain duration)
        self.t1_samples = 0
        self._low: float | None = None  # _mean_excess's verdict, re-checked every 64th completion
        self.gap = math.inf  # EWMA of inter-arrival gaps, seconds
        self.slow_gap = math.inf  # their mean over the last ~SLOW arrivals (see slow_rate)
        self.last_arrival: float | None = None
        self.arrivals = 0
        self.spec: Any = None  # the kind's latest ActionSpec: demand shape for arrival lookahead
        self.ring: list[float] = []  # the last RING arrival times (a windowed rate for pricing)
        self.ring_i = 0
        self.log_var = 0.0  # residual variance of log durations
        # ... its part above the mean, its third moment and their weight (the buckets'), pooled as
        # log_var is (spread(): how heavy the right tail is)
        self._log_upper = self._log_skew = self._log_n = 0.0
        self.beta = 1.0  # learned exponent on the declared speedup (quantised, see _fit)
        # (log declared speedup, units) -> [weight, mean, var, mean exec, upper var, third moment] of
        # the log lengths (observe_exec); units apart for a flat declaration
        self.buckets: dict[tuple[float, int], list[float]] = {}
        self._rel: dict[tuple[Any, int], float] = {}
        self._rel_shape = 1.0  # beta, or 10 + the upgraded fraction, that _rel was computed under
        self._pxx = 0.0  # measured parallelism: decaying sums of x * x and x * y (see observe_exec)
        self._pxy = 0.0
        self.hints: list[float] = [0.0, 0.0, 0.0]  # callers' length hints: count, mean and M2 of logs
        self.sandboxes: SandboxLengths | None = None  # lengths per container (learned hints), once one is named
        self.up: float | None = None  # upgraded: the Amdahl fraction that replaces the declared shape
        self.measured = False  # completions report their parallelism (lease.run / lease.exec)
        self._avv = self._auv = self.up_n = 0.0  # the Amdahl fit's decaying sums, and its count
        self.inflight = 0  # actions of the kind submitted and not yet released, cancelled or refused
        self.peak = 0  # the most of them ever in flight at once (see _CENSOR)
        self.lone = 0  # consecutive arrivals that found none of the kind in flight (see LONE)
        # a kind with a declared duration learns no lengths (log_var stays 0): the spread of its
        # runs' log lengths, scaled to its minimum under the declared shape, kept apart for what
        # only asks how spread they are (spread())
        # count, mean, M2 (lengths.add_sample), M2's part above the mean, M3 (see spread())
        self.declared: list[float] = [0.0, 0.0, 0.0, 0.0, 0.0]
        # completions' seconds from submission to release, a moving mean (0: none yet; the core
        # updates it at each release, weight ACT_ALPHA): with the arrival rate, how many of the
        # kind are in the system on average (Little), which is how a closed pool of a few callers
        # is told apart from an open stream (moldable.CpuSizing._closed_dop)
        self.act = 0.0

    @property
    def slope_measured(self) -> bool:
        """Some run reported its parallelism at a size the declaration says is faster: beta has
        paired evidence (a measured "no speedup" is an answer, not a reason to explore)."""
        return self._pxx > 0.0

    def observe_hint(self, seconds: float) -> float:
        """Record one caller's length hint; return its z-score among the hints seen before it
        (``-inf`` until 32 were seen). Hints are counted at arrival, so, unlike completed
        lengths early in a step (the short ones finish first), they are not biased short."""
        n, mean, m2 = self.hints
        x = math.log(seconds)
        z = (x - mean) / math.sqrt(m2 / (n - 1)) if n >= 32 and m2 > 0.0 else -math.inf
        add_sample(self.hints, x, HORIZON)  # the last HORIZON hints: a job's lengths drift
        return z

    def hint_mean(self) -> float:
        """The mean of the hints seen (lognormal: from the mean and spread of their logs)."""
        n, mean, m2 = self.hints
        return math.exp(mean + (0.5 * m2 / (n - 1) if n > 1 else 0.0))

    def observe_arrival(self, now: float, alpha: float) -> None:
        last = self.last_arrival
        if last is not None:
            g = now - last
            if g < 0.0:  # max(0, ...) and isinf(gap) as expressions: this runs per arrival
                g = 0.0
            self.gap = g if self.gap == math.inf else (1 - alpha) * self.gap + alpha * g
            n = self.arrivals  # gaps seen, this one included: their plain mean up to SLOW
            self.slow_gap = g if n == 1 else self.slow_gap + (g - self.slow_gap) / (n if n < SLOW else SLOW)
        self.last_arrival = now
        self.arrivals += 1
        if self.inflight:
            self.lone = 0
        else:
            self.lone += 1
        self.inflight += 1
        if self.inflight > self.peak:
            self.peak = self.inflight
        ring = self.ring
        if len(ring) < RING:
            ring.append(now)
        else:
            ring[self.ring_i] = now
            self.ring_i = (self.ring_i + 1) % RING

    def observe_declared(self, exec_s: float, rel: float) -> None:
        """One completion of a kind with a declared duration: ``exec_s`` at a size that runs
        ``rel`` times its minimum's time (declared shape)."""
        if exec_s > 0 and math.isfinite(exec_s) and rel > 0:
            acc = self.declared
            if acc[0] >= HORIZON:  # add_sample is about to scale M2 down: the others too
                f = (HORIZON - 2.0) / (HORIZON - 1.0)
                acc[3] *= f
                acc[4] *= f
            x = math.log(exec_s / rel)
            n = min(acc[0], HORIZON - 1.0) + 1.0
            d = (x - acc[1]) / n
            m2 = acc[2]
            inc = add_sample(acc, x, HORIZON)
            if d > 0.0:
                acc[3] += inc
            acc[4] += inc * d * (n - 2.0) - 3.0 * d * m2  # M3, one-pass (Pebay)

    def spread(self) -> float:
        """How heavy the kind's lengths are, as a log-normal's log-variance: learned (``log_var``)
        or, for a declared duration, from its runs (0 before two). The variance of the log
        lengths, unless they are significantly skewed left (:func:`right_spread`): then twice its
        part above the mean, the right tail's. What the rules that read it (a long run holding a
        narrow node, moldable; the fallback's block test) fear is long actions; very short ones,
        which skew the logs of exponential lengths left, block no one. The variance alone counts
        both: exponential lengths (log-variance 1.64, the right tail's 1.18) crossed 2.0 in 19 %
        of samples of 64, and near-linear work was sized as heavy tails, on one or two cores
        (docs/evaluation.md, "the right tail")."""
        n, _mean, m2, u2, m3 = self.declared
        d = right_spread(n, m2 / (n - 1.0), u2 / (n - 1.0), m3 / n) if n > 1 else 0.0
        if not self.buckets:
            return d
        return max(right_spread(self._log_n, self.log_var, self._log_upper, self._log_skew), d)

    def observe_exec(self, exec_s: float, speedup: float, alpha: float, *, learn_beta: bool,
                     parallelism: float | None = None, units: int = 0) -> None:
        """One completion: ``exec_s`` seconds at units whose declared speedup (vs one unit) is
        ``speedup`` (``units``: how many, when known; 0 for a resized run, whose speedup is a
        time-weighted mix). ``learn_beta=False`` keeps the declared efficiency (beta = 1).

        ``parallelism``: the cores' worth of work the action's commands really got (CPU seconds
        over wall seconds). For work that conserves its CPU time that *is* the speedup it ran at,
        paired with the size in one completion, so it is not confounded the way sizes and lengths
        are across completions: ``y = log(parallelism)`` against ``x = log(speedup)``, through the
        origin, is beta with no second size needed. A busy machine (two pinned processes getting
        one core's worth) or a tool that ignores its cores shows up after a few completions.

        Measured parallelism can also show *more* speedup than the declaration can express even
        at beta 1.25 (a user declared ``Amdahl(0.5)``, or ``Amdahl(0.0)``, for tests that scale
        at 0.99). A power of the declared speedup has the wrong shape for that (``S_0.2(m) ** 12``
        overshoots at small ``m``), so the kind is *upgraded*: Amdahl's law fitted to the
        measured pairs (``1 - 1/P = p (1 - 1/m)``, through the origin) replaces the declared
        shape (``up``, the fitted ``p``). Only then: while the power family fits, nothing moves.

        Samples are averaged per granted size first: completions arrive in an order that
        correlates size with length (a long action granted few units in a busy phase completes
        late, beside short ones granted many in a quiet phase), so one decaying regression over
        the completion stream would see a slope that is not there."""
        if not (exec_s > 0 and math.isfinite(exec_s) and speedup > 0):
            return
        y = math.log(exec_s)
        x = 0.0 if speedup == 1.0 else math.log(speedup)  # every fixed-size kind: log(1) exactly
        key = (x, units)
        b = self.buckets.get(key)
        if b is None:
            if len(self.buckets) >= 64:  # keep the most used sizes
                del self.buckets[min(self.buckets, key=lambda k: self.buckets[k][0])]
            # weight, mean y, its mean squared deviation, mean exec, that deviation's part above the
            # mean, and the mean cubed deviation (exponentially weighted central moments)
            b = self.buckets[key] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        n = b[0] + 1.0
        inv = 1.0 / n
        w = inv if inv > alpha else alpha  # max(alpha, 1/n) and min(n, 1/alpha) without the calls
        d = y - b[1]
        cap = 1.0 / alpha
        b[0] = cap if cap < n else n
        b[1] += w * d
        b[5] = (1 - w) * (b[5] + w * d * (d * d * (1 - 2 * w) - 3 * b[2]))  # before b[2] moves
        b[2] = (1 - w) * (b[2] + w * d * d)
        b[4] = (1 - w) * (b[4] + w * d * d) if d > 0.0 else (1 - w) * b[4]
        b[3] += w * (exec_s - b[3])
        self.t1_samples += 1
        if parallelism is not None and parallelism > 0 and math.isfinite(parallelism):
            self.measured = True
            keep = 1.0 - max(alpha, 1.0 / RING)  # forget old evidence: a machine gets busy and idle
            if x > 0.05:
                self._pxx = keep * self._pxx + x * x
                self._pxy = keep * self._pxy + x * math.log(min(parallelism, speedup * 1.5))
            if units > 1 and learn_beta:  # Amdahl through the origin: 1 - 1/P = p (1 - 1/m)
                v = 1.0 - 1.0 / units
                self._avv = keep * self._avv + v * v
                self._auv = keep * self._auv + v * (1.0 - 1.0 / min(max(parallelism, 1.0), float(units)))
                self.up_n = keep * self.up_n + 1.0
        self._fit(learn_beta)

    def _fit(self, learn_beta: bool) -> None:
        bs = self.buckets
        if len(bs) == 1 and not (learn_beta and (self._pxx > 0 or self.up_n > 0)):
            # one size (every fixed-size kind): beta stays 1 (no slope from one size, no measured
            # parallelism), the same arithmetic as the loop below, without it
            (((x, _u), (w, my, v, e, h, k)),) = bs.items()
            mx, my_all, var = (0.0 + w * x) / w, (0.0 + w * my) / w, (0.0 + w * v) / w
            self.beta = 1.0
            self.log_var = var
            self._log_upper, self._log_skew, self._log_n = h, k, w
            if not self.t1_samples & _SMEAR_EVERY:
                self._low = _mean_excess(var, w, e / math.exp(my) if e > 0.0 else 0.0)
            low = self._low
            self.t1 = math.exp(my_all + 1.0 * mx + (0.5 * min(var, 4.0) if low is None else low))
            return
        sw = sx = sy = 0.0
        within = upper = third = 0.0
        for (x, _u), (w, my, v, _e, h, k) in bs.items():
            sw += w
            sx += w * x
            sy += w * my
            within += w * v
            upper += w * h
            third += w * k
        mx, my_all = sx / sw, sy / sw
        var = within / sw  # pooled spread of log durations at a fixed size
        beta = 1.0
        # evidence first: two sizes with _MIN_PER_SIZE completions each, _MIN_SPREAD apart. Early
        # completions are the short actions whatever their size (the long ones are still
        # running), and sizes granted at different moments are cut off differently: a slope fitted
        # from a few early samples at two close sizes is noise (it learned "no speedup" from a
        # burst at 12 and 16 cores, then ran 300 tests on one core)
        if learn_beta and self._pxx > 0:
            # measured parallelism (observe_exec): residuals of log parallelism are small, so a
            # few completions move beta; the prior still holds one completion to a partial step
            prior = 1.0 / (_PRIOR_SD * _PRIOR_SD)
            v = _PAIRED_VAR
            beta = (self._pxy / v + prior) / (self._pxx / v + prior)
            self.up = self._upgrade(beta)
            beta = min(_BETA_MAX, max(0.0, round(beta * 20.0) / 20.0))
        elif learn_beta and self.up_n > 0:  # measured only where the declaration is flat
            self.up = self._upgrade(math.inf)
        elif learn_beta and (evidence := self._evidence(bs)):
            cxx = cxy = 0.0
            for (x, _u), (w, my, _v, _e, _h, _k) in bs.items():
                cxx += w * (x - mx) ** 2
                cxy += w * (x - mx) * (my - my_all)
            if cxx > 1e-9:
                v = max(var, 0.05)  # a few samples must not look exact
                prior = 1.0 / (_PRIOR_SD * _PRIOR_SD)
                beta = (-cxy / v + prior) / (cxx / v + prior)
                if evidence == "few" and abs(beta - 1.0) < _SIG_Z / math.sqrt(cxx / v + prior):
                    beta = 1.0
                beta = min(_BETA_MAX, max(0.0, round(beta * 20.0) / 20.0))
        self.log_var = var
        self._log_upper, self._log_skew, self._log_n = upper / sw, third / sw, sw
        up = self.up
        if up is not None:  # E[log exec] at one unit under the fitted shape, size by size
            beta = 1.0
            sa = 0.0
            for (_x, u), (w, my, _v, _e, _h, _k) in bs.items():
                sa += w * (my + math.log(amdahl_speedup(up, max(u, 1))))
            a = sa / sw
        else:
            a = my_all + beta * mx  # E[log exec] at one unit (x = 0)
        self.beta = beta
        if not self.t1_samples & _SMEAR_EVERY:
            smear = 0.0
            for (_x, _u), (w, my, _v, e, _h, _k) in bs.items():
                if e > 0.0:
                    smear += w * e / math.exp(my)
            self._low = _mean_excess(var, sw, smear / sw)
        low = self._low
        self.t1 = math.exp(a + (0.5 * min(var, 4.0) if low is None else low))

    def _evidence(self, bs: dict[tuple[float, int], list[float]]) -> str:
        """Whether durations alone may move beta: "many" (two sizes ``_MIN_SPREAD`` apart with
        ``_MIN_PER_SIZE`` completions each), "few" (the same with ``_CENSOR`` times the kind's peak
        in flight each, where that is fewer: then only a significant slope counts),
        or "" (not yet). CPU kinds only: a GPU kind's width follows the load regime, its few calls
        in flight per teacher are not a closed pool of callers, and there the rule learned TP
        slopes of 0.45 from a handful of calls (tests/test_gpu_sizing.py's width switches moved)."""
        spec = self.spec
        gpu = spec is not None and spec.elastic is not None and spec.elastic.resource != "cpu"
        few = 0 if gpu else _CENSOR * self.peak
        many_spread, few_spread = _spreads(bs, few if 0 < few < _MIN_PER_SIZE else math.inf)
        return "many" if many_spread >= _MIN_SPREAD else "few" if few_spread >= _MIN_SPREAD else ""

    def _upgrade(self, beta_raw: float) -> float | None:
        """The Amdahl fraction that replaces the declared shape, or None (keep it): only when the
        measured pairs put beta past the power family's top (``beta_raw``; inf where the
        declaration is flat at the sizes measured), with ``UP_MIN`` completions behind the fit."""
        if self.up_n < UP_MIN or beta_raw <= _BETA_MAX or self._avv <= 0.0:
            return None
        p = min(_UP_P_MAX, max(0.0, self._auv / self._avv))
        if math.isinf(beta_raw) and p < _UP_FLAT_P:
            return None
        return round(p * 200.0) / 200.0  # quantised like beta: memos keyed by it stay few

    def rel(self, spec: Any, m: int) -> float:
        """``T(m) / T(min)`` for ``spec`` under what has been learned: the declared ratio raised
        to ``beta``, or the fitted Amdahl ratio once upgraded (memoised per spec and size until
        either moves)."""
        shape = self.beta if self.up is None else 10.0 + self.up  # what the memo holds (beta <= 1.25)
        if shape != self._rel_shape:
            self._rel.clear()
            self._rel_shape = shape
        key = (spec, m)
        r = self._rel.get(key)
        if r is None:
            if len(self._rel) > 4096:
                self._rel.clear()
            if self.up is not None:
                r = amdahl_speedup(self.up, spec.min_units) / amdahl_speedup(self.up, m)
            else:
                r = spec.relative_duration(m)
            if self.beta != 1.0:
                r = r ** self.beta
            self._rel[key] = r
        return r

    def speedup_at(self, spec: Any, m: int) -> float:
        """Learned speedup at ``m`` units vs one unit."""
        if self.up is not None:
            return amdahl_speedup(self.up, m)
        sp = float(spec.speedup(m))
        return sp if self.beta == 1.0 else sp ** self.beta

    def rate(self, now: float) -> float:
        """Arrivals per second; decays when the kind has gone quiet for longer than its usual gap."""
        if self.last_arrival is None or math.isinf(self.gap):
            return 0.0
        gap = max(self.gap, now - self.last_arrival, 1e-6)
        return 1.0 / gap

    def slow_rate(self) -> float:
        """Arrivals per second over the last ~:data:`SLOW` arrivals: the load a fixed DoP is
        picked for, where :meth:`window_rate` (32 arrivals) also sees a burst's."""
        g = self.slow_gap
        return 1.0 / g if 0.0 < g < math.inf else 0.0

    def window_rate(self, now: float) -> float:
        """Arrivals per second over the last RING arrivals (steadier than the gap EWMA, which a
        handful of near-simultaneous arrivals collapses); decays like :meth:`rate` when quiet."""
        ring = self.ring
        n = len(ring)
        if n < 2:
            return 0.0
        oldest = ring[self.ring_i] if n == RING else ring[0]
        span = max(now, self.last_arrival or now) - oldest
        if span <= _SIMULTANEOUS:  # simultaneous arrivals are a burst, already in the queue, not a rate
            return 0.0
        lam = (n - 1) / span
        quiet = now - (self.last_arrival or now)
        if quiet > 1.0 / lam:
            lam = min(lam, 1.0 / quiet)
        return lam
