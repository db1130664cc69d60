#!/usr/bin/env bash
# The GPU path's device check (issue 18): run once on a CUDA machine; under 5 minutes on one H200
# (139 GiB device, 128 GiB host). It runs
#   1. pytest on the GPU test files: all of them on CUDA (the cuda-marked tests, and every other test
#      with CUDA visible, which changes defaults), only the cuda-marked ones without,
#   2. the restore benchmark at 0.5, 2 and 8 GB, one process per size, so every host and device
#      buffer of a size is freed before the next (the host's page-locked budget holds one size),
#   3. the scoring part (evict-on-execution vs dedicated, and the charge per service),
#   4. a short soak under faults (cancels, raises, timeouts) with every pool GPU on that device, its
#      allocator's bytes compared before the Tangram starts and after it closed,
# and prints ONE table: restore GB/s vs raw pinned host-to-device GB/s (target >= 80 %), eviction
# time, measured vs estimated charge per service, host_memory_stats() before/after. Exit 1 if a
# check failed, 2 without CUDA.
#
# The device is lent once, for minutes: a step that fails or runs out of time is a FAIL row in the
# table, never the end of the run, and the whole check fits GPU_CHECK_BUDGET seconds (default 540,
# under the device tool's 600 s per command): each step's timeout is its own or what is left.
#
#   bash scripts/gpu-check.sh                    # on the device
#   GPU_CHECK_CPU=1 bash scripts/gpu-check.sh    # its CPU-only parts at tiny sizes (the suite runs this)
#   GPU_CHECK_OUT=dir                            # keep the JSON and the pytest log there
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
OUT="${GPU_CHECK_OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
start=$(date +%s)

if [ "${GPU_CHECK_CPU:-0}" = 1 ]; then
    SIZES="4 16"
    REPEATS=3
    EXTRA=(--device cpu)
    SCORING=(--services 3 --service-mb 1 --dim 256 --requests 24 --batch 8)
    SOAK=(--gpu-device cpu --gpu-width 4096 --trajectories 256)
    TESTS=(-m cuda)
else
    if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu-check: no CUDA device visible (GPU_CHECK_CPU=1 runs the CPU-only parts)" >&2
        exit 2
    fi
    SIZES="512 2048 8192"
    REPEATS=9
    EXTRA=()
    SCORING=()
    SOAK=(--gpu-device cuda:0 --gpu-width 262144 --trajectories 1024)  # 16 MiB services
    TESTS=()
fi

BUDGET="${GPU_CHECK_BUDGET:-540}"
RESERVE=20  # for the report

# step TIMEOUT STUB_JSON CMD...: run CMD under min(TIMEOUT, what is left of the budget); when it
# fails, times out or has no time left, write STUB_JSON saying so (the report turns it into a FAIL)
step() {
    local limit=$1 stub=$2
    shift 2
    local left=$(( BUDGET - RESERVE - ($(date +%s) - start) ))
    (( left < limit )) && limit=$left
    if (( limit < 5 )); then
        echo "gpu-check: no time left for this step (budget ${BUDGET} s)" >&2
        [ -n "$stub" ] && printf '{"failed": "not run: the %s s budget was spent"}\n' "$BUDGET" >"$stub"
        return 0
    fi
    local rc=0
    timeout "$limit" "$@" || rc=$?
    if (( rc != 0 )) && [ -n "$stub" ]; then
        local why="exit $rc"
        (( rc == 124 )) && why="timed out after ${limit} s"
        printf '{"failed": "%s"}\n' "$why" >"$stub"
    fi
    return 0
}

echo "== pytest ${TESTS[*]-(every test)} on the GPU test files"
rc_pytest=0
left=$(( BUDGET - RESERVE ))
timeout $(( left < 180 ? left : 180 )) "$PY" -m pytest -q -p no:cacheprovider ${TESTS[@]+"${TESTS[@]}"} \
    tests/test_torch_store.py tests/test_gpu_manager.py tests/test_gpu_path.py >"$OUT/pytest.txt" 2>&1 || rc_pytest=$?
tail -n 15 "$OUT/pytest.txt"

for mb in $SIZES; do
    echo "== restore benchmark, $mb MB"
    step 120 "$OUT/restore-$mb.json" "$PY" benchmarks/gpu_restore.py ${EXTRA[@]+"${EXTRA[@]}"} --sizes-mb "$mb" \
        --repeats "$REPEATS" --skip-scoring --json "$OUT/restore-$mb.json"
done

echo "== scoring"
step 150 "$OUT/scoring.json" "$PY" benchmarks/gpu_restore.py ${EXTRA[@]+"${EXTRA[@]}"} ${SCORING[@]+"${SCORING[@]}"} \
    --skip-bandwidth --json "$OUT/scoring.json"

echo "== soak under faults"
step 90 "$OUT/soak.json" "$PY" benchmarks/soak.py "${SOAK[@]}" --actions 3 --seed 2 --cancel 0.10 \
    --json "$OUT/soak.json" >"$OUT/soak.txt" 2>&1
tail -n 1 "$OUT/soak.txt"

echo
reports=()
for mb in $SIZES; do reports+=("$OUT/restore-$mb.json"); done
exec "$PY" benchmarks/gpu_restore.py --report "${reports[@]}" "$OUT/scoring.json" \
    --pytest "$OUT/pytest.txt" --pytest-rc "$rc_pytest" --soak "$OUT/soak.json" --elapsed "$(( $(date +%s) - start ))"
