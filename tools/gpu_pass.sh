#!/usr/bin/env bash
# The H200 pass, in two device calls (each under 10 minutes):
#   tools/gpu_pass.sh 1   GPU test suite, stage pricing probe, make tune
#   tools/gpu_pass.sh 2   make bench (with the tuned tables in place), tuner quality
# Outputs go to $OUT (logs and a tarball of results/h200). Run from the repository root
# with the Optuna wheels in .whl/ (../shared/device/wheels.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv >"$OUT/gpu.txt"
if [ "${1:-1}" = 1 ]; then
  SPEC_TEST_DEVICE=cuda timeout 220 python3 -m pytest -q -n 12 -p no:benchmark \
    -p no:cacheprovider --durations=10 2>&1 | tail -60 >"$OUT/tests.log"
  timeout 40 python3 tools/probe_stages.py "$OUT/stages.txt" >/dev/null 2>&1
  timeout 280 make tune TUNE_ARGS="--budget-s 215 --no-progress" >"$OUT/tune.log" 2>&1
  python3 -m autotune report >/dev/null 2>&1
  tar czf "$OUT/h200-tune.tgz" --exclude='*.db*' results/h200
  tail -4 "$OUT/tests.log"; cat "$OUT/stages.txt"; tail -12 "$OUT/tune.log"
else
  FAILED_TESTS=(tests/test_autotune_tune.py::test_sampled_tune_resumes_from_the_store
    tests/test_chain_verify_sampled.py::test_noise_term_upper_bound_exhaustive
    tests/test_autotune_tune.py::test_killed_tune_resumes
    tests/test_autotune_tune.py::test_cli_smoke_tune_of_every_recipe
    tests/test_relay.py::test_cuda_graph_capture_and_replay
    tests/test_copy_inputs.py::test_cuda_graph_capture
    tests/test_ops.py::test_draft_tail_op tests/test_verify_metadata.py::test_cuda_graph_capture)
  SPEC_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -n 8 -p no:benchmark \
    -p no:cacheprovider -rf --tb=short "${FAILED_TESTS[@]}" >"$OUT/retest.log" 2>&1
  timeout 300 make bench BENCH_ARGS="--max-seconds 250 --out results/h200" \
    >"$OUT/bench.log" 2>&1
  timeout 160 python3 -m autotune quality --keys 10 --budget-s 130 --no-progress \
    >"$OUT/quality.log" 2>&1
  tar czf "$OUT/h200-bench.tgz" --exclude='*.db*' results/h200
  tail -3 "$OUT/retest.log"; tail -8 "$OUT/bench.log"; tail -20 "$OUT/quality.log"
fi
