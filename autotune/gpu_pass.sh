#!/usr/bin/env bash
# The H200 pass, as steps that fit the device calls (each call under 10 minutes):
#   tools/gpu_pass.sh test probe    GPU test suite (~3 min), bandwidth probe (~3 min)
#   tools/gpu_pass.sh tune          make tune, the default key set (< 8 min)
#   tools/gpu_pass.sh retest        $RETEST (default tests/test_ops.py) again
#   tools/gpu_pass.sh quality       tuner quality (~5 min, up to 330 s)
#   tools/gpu_pass.sh bench         make bench (~4-5 min, up to BENCH_TIMEOUT, 280 s)
# (quality and bench together can pass the 10-minute limit of one call, and the results
# tarball is written after the last step: give them a call each.)
# TUNE_ARGS, QUALITY_ARGS, BENCH_ARGS override each step's arguments (BENCH_TIMEOUT its limit).
# Outputs go to $OUT (logs, and a tarball of results/h200 after tune/quality/bench). Run
# from the repository root with the Optuna wheels in .whl/ (../shared/device/wheels.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv >"$OUT/gpu.txt"
summary=()
for step in "$@"; do
  case $step in
    test)
      SPEC_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -n 12 -p no:benchmark \
        -p no:cacheprovider -rfs --durations=10 >"$OUT/test-gpu.log" 2>&1
      summary+=("$(tail -1 "$OUT/test-gpu.log")")
      grep -E '^(FAILED|ERROR)' "$OUT/test-gpu.log" | head -20 ;;
    retest)   # RETEST="tests/a.py tests/b.py::test_x": a part of the suite again
      SPEC_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -n 8 -p no:benchmark \
        -p no:cacheprovider -rfs ${RETEST:-tests/test_ops.py} >"$OUT/retest.log" 2>&1
      summary+=("retest: $(tail -1 "$OUT/retest.log")") ;;
    probe)
      timeout 300 python3 tools/probe_bw.py "$OUT/probe-bw.txt" >"$OUT/probe.log" 2>&1
      summary+=("probe rc=$?") ;;
    tune)
      t0=$SECONDS; timeout 580 make tune TUNE_ARGS="${TUNE_ARGS:---no-progress}" >"$OUT/tune.log" 2>&1
      echo "make tune: rc=$? wall $((SECONDS - t0)) s" >>"$OUT/tune.log"
      python3 -m autotune report >/dev/null 2>&1
      summary+=("$(tail -2 "$OUT/tune.log" | tr '\n' ' ')") ;;
    quality)
      timeout 330 make quality QUALITY_ARGS="${QUALITY_ARGS:---budget-s 280 --no-progress}" >"$OUT/quality.log" 2>&1
      summary+=("$(grep -E 'complete keys|MET|NOT MET' "$OUT/quality.log" | tail -2)") ;;
    bench)
      timeout ${BENCH_TIMEOUT:-280} make bench BENCH_ARGS="${BENCH_ARGS:---max-seconds 240 --out results/h200}" \
        >"$OUT/bench.log" 2>&1
      summary+=("$(tail -2 "$OUT/bench.log" | tr '\n' ' ')") ;;
    *) echo "gpu_pass: unknown step $step"; exit 2 ;;
  esac
done
case " $* " in *" tune "*|*" quality "*|*" bench "*)
  tar czf "$OUT/h200-results.tgz" --exclude='*.db*' results/h200 ;; esac
[ -f "$OUT/probe-bw.txt" ] && cat "$OUT/probe-bw.txt"
printf '%s\n' "${summary[@]}"
