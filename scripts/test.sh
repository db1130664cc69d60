#!/usr/bin/env bash
# The one test command (README, .ci/run): install what the tests need, start the real components
# (a Docker engine with the test image), then run the whole suite.
#
#   bash scripts/test.sh            # everything
#   bash scripts/test.sh -k sched   # extra args go to pytest
#
# Under CI=true a Docker or Ray test that would skip fails instead (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# torch==2.13.0 resolves to the CPU wheel shipped on these machines (a bare "torch" would pull CUDA).
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,docker,torch,ray]' 2>&1 \
    | grep -v -E "^WARNING: Location .* is ignored" || true
# veRL / OpenRLHF, so the integration tests run against their real base classes
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements/frameworks-nodeps.txt 2>&1 \
    | grep -v -E "^WARNING: Location .* is ignored" || true
# (pip then lists veRL's/OpenRLHF's undeclared GPU stacks as "not installed" and tensordict's stale
# pyvers<0.2 pin as a conflict: expected, filtered)
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements/frameworks.txt 2>&1 \
    | grep -v -E "^WARNING: Location .* is ignored|which is not installed|dependency resolver does not currently|(verl|openrlhf) .* requires .*, but you have|tensordict .* requires pyvers.*, but you have pyvers" || true
.venv/bin/python -c "import tangram_sdk, torch, aiodocker, ray, verl, openrlhf, pytest" >/dev/null

if [ "$(id -u)" = "0" ]; then
    bash scripts/docker-up.sh || echo "test.sh: Docker could not be started; Docker tests will skip (fail under CI=true)" >&2
else
    echo "test.sh: not root, not starting dockerd; Docker tests need a reachable daemon" >&2
fi

PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ "$#" -gt 0 ]; then
    exec "${PYTEST[@]}" "$@"
fi

# The whole suite, in four processes on CI's two cores:
# - the pure, deterministic CPU-bound files (the simulator, the policy matrix, the core's property
#   tests, mypy: no clocks, no daemons) as two pytest processes at the lowest priority, each in a
#   session of its own with a nice autogroup (kernel.sched_autogroup_enabled weighs sessions, not
#   processes) and `nice -n 19` (where autogroups are off);
# - the Ray tests (`-m ray`: local clusters, actors killed and frozen) in a session of their own at
#   normal priority, beside
# - everything else in the foreground (Docker, subprocesses, real timeouts).
# The last two wait on daemons and timeouts and leave most of a core idle, so side by side they
# take about as long as the longer of the two. Ray gets its own process because a Ray test started
# while another process runs a `ray start` cluster would join that cluster (ray.init finds it).
# Then the tests marked `exclusive` (they measure a speed-up or CPU time: two cores faster than
# one, the live demo; or count calls on a path priced by the wall clock) run alone, after the Ray
# process and the pure lanes have ended.
# CI at stop 53, same machine: before the Ray split 12.5 min in all (foreground ~630 s, of which
# Ray ~250 s; the pure lanes ~220 s and ~245 s); after it 8.6 min (foreground ~385 s beside Ray
# ~280 s, then the exclusive tests ~33 s; the pure lanes ~330 s and ~355 s, the cores now busy).
# Then the quick policy matrix grew its contended cells into runs of six seeds (~80 CPU-s more;
# ten seeds took CI to 10.1 min) and mypy moved to the second lane: 8.9 min (foreground ~390 s
# beside Ray ~280 s, exclusive ~33 s; the pure lanes ~413 s each).
PURE_A=(tests/test_policy_matrix.py tests/test_fuzz.py tests/test_scheduler_props.py
        tests/test_scheduler.py tests/test_core_never_stuck.py)
PURE_B=(tests/test_gpu_sizing.py tests/test_typing.py
        tests/test_sim_engine.py tests/test_sim_baselines.py tests/test_sim_trace.py tests/test_sandbox_lengths.py
        tests/test_split.py tests/test_malleable.py tests/test_purity.py tests/test_learn.py
        tests/test_weighted_quotas.py tests/test_restart.py tests/test_pricing.py tests/test_plan_gap.py
        tests/test_hints.py tests/test_resources.py tests/test_spec.py tests/test_options.py tests/test_releases.py
        tests/test_supply.py)
out=$(mktemp -d)
rc=0
background() {  # background NICE OUTFILE PYTEST-ARGS...: in a session of its own
    local nice="$1" to="$2"; shift 2
    setsid -w nice -n "$nice" sh -c 'echo "$0" > /proc/self/autogroup 2>/dev/null; exec "$@"' "$nice" \
        "${PYTEST[@]}" "$@" >"$to" 2>&1 </dev/null
}
background 19 "$out/a" --durations=10 "${PURE_A[@]}" &
pid_a=$!
background 19 "$out/b" --durations=10 "${PURE_B[@]}" &
pid_b=$!
ignore=()
for f in "${PURE_A[@]}" "${PURE_B[@]}"; do
    ignore+=("--ignore=$f")
done
background 0 "$out/r" --durations=10 -m "ray and not exclusive" "${ignore[@]}" &
pid_r=$!
echo "== everything but the pure files and the Ray tests (those run in the background)"
# --durations: the slowest tests in the log, where CI time goes (kept well under 20 minutes)
"${PYTEST[@]}" --durations=15 -m "not ray and not exclusive" "${ignore[@]}" || rc=1
wait "$pid_r" || rc=1
echo "== the Ray tests (-m ray)"
cat "$out/r"
# the pure lanes end first: at nice 19 they still took a share of the cores, and a speed-up measured
# beside them fell short of its bar (stop 63, a clean-clone CI on this 2-core machine: 1.426 where
# 1.447 was asked; the lanes ended 731-783 s in, past the exclusive phase's start)
wait "$pid_a" || rc=1
wait "$pid_b" || rc=1
echo "== the tests that need the cores to themselves (-m exclusive)"
"${PYTEST[@]}" -m exclusive "${ignore[@]}" || rc=1
echo "== ${PURE_A[*]}"
cat "$out/a"
echo "== ${PURE_B[*]}"
cat "$out/b"
rm -rf "$out"
exit "$rc"
