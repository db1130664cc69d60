"""The unit-split DP equals brute force; the greedy equals the DP whenever costs are convex."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tangram_sdk import Amdahl
from tangram_sdk.scheduler.split import (
    best_split,
    brute_force_split,
    dp_split,
    greedy_split,
    is_convex,
    single_split,
)

costs = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@st.composite
def option_sets(draw, convex=False):
    n = draw(st.integers(1, 4))
    out = []
    for _ in range(n):
        if convex:
            p = draw(st.floats(0.0, 1.0))
            t1 = draw(st.floats(0.1, 10.0))
            mu = draw(st.sampled_from([0.0, 0.1, 1.0]))
            k = draw(st.integers(0, 5))
            a = Amdahl(p)
            opts = [(j, t1 / a.speedup(j + 1) * (1 + mu * (j + 1))) for j in range(k + 1)]
        else:
            steps = sorted(set(draw(st.lists(st.integers(1, 6), max_size=3))))
            opts = [(0, draw(costs))] + [(k, draw(costs)) for k in steps]
        out.append(opts)
    return out


@settings(max_examples=300, deadline=None)
@given(option_sets(), st.integers(0, 12))
def test_dp_equals_brute_force(options, cap):
    picks, cost = dp_split(options, cap)
    bpicks, bcost = brute_force_split(options, cap)
    assert math.isclose(cost, bcost, rel_tol=1e-9, abs_tol=1e-9)
    assert sum(picks) <= cap
    chosen = sum(dict(o)[k] for o, k in zip(options, picks))
    assert math.isclose(chosen, cost, rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=300, deadline=None)
@given(option_sets(convex=True), st.integers(0, 12))
def test_greedy_equals_dp_on_convex_costs(options, cap):
    assert all(is_convex(o) for o in options)
    _, g = greedy_split(options, cap)
    _, d = dp_split(options, cap)
    assert math.isclose(g, d, rel_tol=1e-9, abs_tol=1e-9)
    _, b = best_split(options, cap)
    assert math.isclose(b, d, rel_tol=1e-9, abs_tol=1e-9)


def test_dp_handles_non_convex_cell_sizes():
    # GPU cells: options 1, 2, 4 (extras 0, 1, 3); only the DP sees that 4+0 beats 2+2 here
    opts = [[(0, 10.0), (1, 9.0), (3, 2.0)], [(0, 10.0), (1, 9.0), (3, 2.0)]]
    picks, cost = dp_split(opts, 3)
    assert cost == 12.0 and sorted(picks) == [0, 3]


@settings(max_examples=300, deadline=None)
@given(option_sets(), st.integers(-1, 12), st.lists(st.sampled_from([math.inf, math.nan, 1.0]), max_size=3))
def test_single_candidate_shortcut_equals_the_dp(options, cap, odd):
    """Most rounds plan one candidate: the shortcut must pick exactly what the DP picks, ties,
    infinite costs (a size that could only displace caches) and NaN included."""
    opts = list(options[0])
    for i, c in enumerate(odd):
        if i < len(opts):
            opts[i] = (opts[i][0], c)
    assert single_split(opts, cap) == dp_split([opts], cap) or (
        math.isnan(single_split(opts, cap)[1]) and math.isnan(dp_split([opts], cap)[1]))
    assert best_split([opts], cap)[0] == dp_split([opts], cap)[0] or is_convex(opts)
