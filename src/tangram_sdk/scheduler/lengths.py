"""Length hints learned per sandbox: what a caller's ``expected_s`` says, without the caller.

An elastic CPU action that names its ``container`` (the sandbox it runs in: one per trajectory,
one repository per trajectory in SWE-style RL) is usually like the actions that ran there before:
a repository's test suite is long every time. The core keeps, per kind and container, the logs of
the completed actions' lengths at their minimum units, and predicts the next one's by *empirical
Bayes*: the sandbox's own mean shrunk towards the kind's mean by how much sandboxes really differ
(between-sandbox variance) against how much one sandbox's runs spread (within-sandbox variance),
both estimated from the same observations. Where sandboxes do not differ (lengths independent of
the sandbox) there is no prediction, or one near the kind's mean that marks no step risk
(``moldable.RISK_MIN_RATIO``); where they do, the prediction is passed on as a length hint
(``Submitted.expected``: an explicit one wins), which marks only the far tail as a step risk
(``moldable.CpuSizing.units``). The kind-wide statistics weigh the last ``HORIZON`` observations
(an RL job's tests drift as its policy learns: cumulative statistics would judge today's lengths by
last week's), each sandbox's are exact (a trajectory is short-lived), and at most the ``MAX_KEYS``
most recently seen sandboxes are kept per kind.
"""

from __future__ import annotations

import math

__all__ = ["SandboxLengths", "HORIZON", "MAX_KEYS", "MIN_KEYS", "add_sample"]

MAX_KEYS = 65536  # sandboxes remembered per kind (oldest forgotten first)
MIN_KEYS = 8  # sandboxes with two runs or more before the within-sandbox spread is trusted
HORIZON = 65536.0  # observations a kind-wide statistic weighs (a few RL steps of a large batch)


def add_sample(acc: list[float], x: float, horizon: float = math.inf) -> float:
    """Welford's update of ``acc = [count, mean, M2]`` with ``x``; returns the increase of M2.
    Exact below ``horizon`` observations; from there on each update first scales the accumulator
    down to ``horizon - 1`` observations' worth, so the count stays at ``horizon`` and the mean
    and variance become exponentially weighted (old evidence fades, new moves them by 1/horizon)."""
    if acc[0] >= horizon:
        acc[2] *= (horizon - 2.0) / (horizon - 1.0)
        acc[0] = horizon - 1.0
    n = acc[0] + 1.0
    d = x - acc[1]
    acc[1] += d / n
    inc = d * (x - acc[1])
    acc[0], acc[2] = n, acc[2] + inc
    return inc


class SandboxLengths:
    """Per-sandbox log lengths of one kind (see the module docstring)."""

    __slots__ = ("_keys", "_all", "_w_m2", "_w_df", "_w_keys")

    def __init__(self) -> None:
        self._keys: dict[str, list[float]] = {}  # container -> [count, mean of logs, M2 of logs]
        self._all = [0.0, 0.0, 0.0]  # every observation of the kind: count, mean and M2 of logs
        self._w_m2 = 0.0  # within sandboxes: summed M2 and degrees of freedom
        self._w_df = 0.0
        self._w_keys = 0  # sandboxes with two observations or more

    def observe(self, key: str, seconds: float) -> None:
        """One completed action of sandbox ``key``: ``seconds`` at its minimum units."""
        if not (seconds > 0.0 and math.isfinite(seconds)):
            return
        x = math.log(seconds)
        add_sample(self._all, x, HORIZON)
        ks = self._keys
        k = ks.pop(key, None)  # re-inserted last: the dict's order is recency
        if k is None:
            if len(ks) >= MAX_KEYS:
                del ks[next(iter(ks))]
            k = [0.0, 0.0, 0.0]
        ks[key] = k
        inc = add_sample(k, x)
        n = k[0]
        if n >= 2.0:
            if self._w_df >= HORIZON:  # the pooled within-sandbox spread weighs recent runs too
                keep = (HORIZON - 1.0) / HORIZON
                self._w_m2 *= keep
                self._w_df *= keep
            self._w_m2 += inc
            self._w_df += 1.0
            if n == 2.0:
                self._w_keys += 1

    def predict(self, key: str) -> float | None:
        """Seconds at the minimum units expected of sandbox ``key``'s next action, or None when
        there is nothing to say: no run of it yet, too few sandboxes to tell apart, or sandboxes
        that do not differ (no between-sandbox variance)."""
        k = self._keys.get(key)
        n, mean, m2 = self._all
        if k is None or self._w_keys < MIN_KEYS or n < 2.0:
            return None
        within = self._w_m2 / self._w_df
        between = m2 / (n - 1.0) - within
        if between <= 0.0:
            return None
        shrink = between / (between + within / k[0])
        return math.exp(mean + shrink * (k[1] - mean))
