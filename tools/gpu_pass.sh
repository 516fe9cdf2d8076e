#!/usr/bin/env bash
# The GPU pass of spec-cookbook on any CUDA host, as steps that each fit in a 10-minute job:
#
#   tools/gpu_pass.sh [--out DIR] [--wheels DIR] STEP...
#
#   test      the test suite on the GPU (SPEC_TEST_DEVICE=cuda)   (over 15 min, H100)
#   test1 .. testN  its N = $TEST_SHARDS shards (default 3; every Nth test file in
#             sorted order), each for a job of its own (4-7 min each on an H100)
#   tune      python -m autotune tune: the default key set                (< 8 min)
#   fresh     the same as a new GPU meets it: no table, an empty Triton cache, into a
#             temporary results root; only its report is kept, as
#             results/<gpu>/tune-report.json (the tables stay; its log is fresh.log in DIR)
#   retune    python -m autotune tune of $RETUNE_RECIPES alone (comma-separated), into a
#             fresh store within RETUNE_BUDGET_S s (default 200): their tables replace
#             those in results/<gpu>/, the run's report goes to
#             DIR/retune-<recipes>-report.json beside retune.log; tune-report.json
#             (the last full tune's) is left as it is. A tune cut short by the step
#             limit still replaces the tables it wrote (the keys it finished); the
#             summary names the recipes it did not write. For a table that a kernel
#             change made stale, before a bench
#   quality   python -m autotune quality: tuner vs exhaustive optimum     (~5 min)
#   bench     python -m autotune bench: every suite, capped at BENCH_MAX_S s
#   bench1    the bench over $BENCH1_SUITES (default chain_verify,chain_verify_sampled)
#   bench2    the bench over every other suite (bench1 + bench2 = a full run in two jobs;
#             each writes its suites as they finish and keeps the other's)
#   example   examples/spec_decode.py --bench with EXAMPLE_ARGS (default: the sweep of
#             the committed H200 report) -> results/<gpu>/spec-decode.md   (~1 min)
#   stages    python tools/stages.py: the small-batch verify priced stage by stage
#             -> results/<gpu>/stages.md                                 (~1 min)
#   sampled-stages  python tools/sampled_stages.py: the same for sampled rows
#             -> results/<gpu>/stages-sampled.md                         (~3 min)
#   probe     python tools/controls_probe.py 1 8 64 -> DIR/controls-probe.md: the sampling
#             controls against temperature only; its warm-up builds the controls
#             binaries in parallel (cores - 1 processes), so a bench of chain_verify_controls
#             after it, on the same Triton cache, finds them built (its time on a GPU
#             is not measured yet)
#   costs     python tools/tune_costs.py: what one config's measurement costs the
#             tuner, piece by piece (the load probe wants a tune's cache), then the
#             default grids' binaries and launcher signatures (--launchers) (~2 min)
#   targets   python -m autotune.targets: TARGETS.md and targets.json of the results
#
# Run from the repository root. Logs go to DIR (--out, else $GPU_PASS_OUT, else $OUT,
# else ./gpu-pass): <step>.log, gpu.txt, summary.txt, and after a step that writes
# results a tarball of results/<gpu> (tuning databases left out), made again before the
# next step starts, so a pass cut short keeps what the finished steps wrote. --wheels
# DIR: wheels (e.g. optuna and its dependencies, for a host without network) installed
# without an index into a private folder put first on PYTHONPATH. The checkout itself is imported
# from the repository root (PYTHONPATH), nothing is installed into the environment.
# Overrides: PYTHON (default python3), TUNE_ARGS, QUALITY_ARGS, EXAMPLE_ARGS, BENCH_ARGS
# (extra arguments of every bench step), BENCH_MAX_S (default 500), PYTEST_ARGS,
# PYTEST_WORKERS (with pytest-xdist; default min(12, cores)), TEST_SHARDS (default 3),
# RETUNE_RECIPES, RETUNE_BUDGET_S, STEP_TIMEOUT (seconds a step may run, default 570; the
# step is interrupted 20 s before, so that it writes its summary).
set -u
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
PY=${PYTHON:-python3}
out=${GPU_PASS_OUT:-${OUT:-gpu-pass}}
wheels=
steps=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) steps+=("$1"); shift ;;
  esac
done
[ ${#steps[@]} -gt 0 ] || { usage; exit 2; }
[ -f tools/gpu_pass.sh ] || { echo "gpu_pass: run from the repository root" >&2; exit 2; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-${TMPDIR:-/tmp}/spec-cookbook-triton-cache}
if [ -n "$wheels" ]; then
  site=${TMPDIR:-/tmp}/spec-cookbook-site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$wheels"/*.whl >"$out/wheels.log" 2>&1 \
    || { echo "gpu_pass: installing the wheels of $wheels failed (see $out/wheels.log)" >&2; exit 1; }
  export PYTHONPATH=$site:$PYTHONPATH
fi
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "gpu_pass: no CUDA device visible to $PY" >&2; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi \
  --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv >"$out/gpu.txt" 2>&1
slug=$("$PY" -c "from recipes._configs import gpu_slug; print(gpu_slug())")
results=results/$slug
limit=${STEP_TIMEOUT:-570}
bench_cap=${BENCH_MAX_S:-500}
bench1=${BENCH1_SUITES:-chain_verify,chain_verify_sampled}

others() {    # every registered suite not in $bench1, comma-separated
  "$PY" -m autotune bench --list | cut -d: -f1 | grep -vxF -f <(tr , '\n' <<<"$bench1") \
    | paste -sd, -
}

run_step() {  # name, command...: the command under the step limit, its log, a summary line
  local name=$1; shift
  local t0=$SECONDS
  # SIGINT 20 s before the limit, so that pytest, the tuner and the bench write what they
  # have (pytest its summary of failures); killed at the limit
  timeout -s INT -k 20 "$((limit > 40 ? limit - 20 : limit))" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local last               # pytest's count line (an interrupt's traceback follows it)
  last=$(grep -E '^(=+ )?[0-9]+ (passed|failed|errors?|skipped)' "$out/$name.log" | tail -1)
  [ -n "$last" ] || last=$(tail -1 "$out/$name.log")
  [ $rc -eq 124 ] && last="interrupted at the step limit: $last"
  echo "$name: rc=$rc, $((SECONDS - t0)) s: $last" | tee -a "$out/summary.txt"
  return $rc
}

pack() {      # the results so far, tarred (again after each step: a later step that runs
              # out of the caller's time keeps the earlier steps' results)
  if [ -n "$wrote_results" ] && [ -d "$results" ]; then
    tar czf "$out/results-$slug.tgz.tmp" --exclude='*.db*' --exclude='studies.journal*' \
      "$results" && mv "$out/results-$slug.tgz.tmp" "$out/results-$slug.tgz"
  fi
}

wrote_results=
status=0
for step in "${steps[@]}"; do
  pack
  case $step in
    test|test[1-9])
      workers=()
      cores=$(nproc 2>/dev/null || echo 4)
      "$PY" -c "import xdist" 2>/dev/null \
        && workers=(-n "${PYTEST_WORKERS:-$((cores < 12 ? cores : 12))}")
      files=()
      if [ "$step" != test ]; then    # every Nth test file, in sorted order
        n=${TEST_SHARDS:-3} k=${step#test}
        [ "$k" -le "$n" ] || { echo "gpu_pass: $step: expected test1 .. test$n" \
                                    "(TEST_SHARDS=$n), got $step" >&2; exit 2; }
        mapfile -t files < <(find tests -name 'test_*.py' | sort \
                             | awk -v n="$n" -v k="$k" 'NR % n == k % n')
      fi
      SPEC_TEST_DEVICE=cuda run_step "$step" "$PY" -m pytest -q ${workers[@]+"${workers[@]}"} \
        -rfs --durations=15 -p no:cacheprovider ${PYTEST_ARGS:-} ${files[@]+"${files[@]}"} \
        || status=1 ;;
    tune)
      run_step tune "$PY" -m autotune tune ${TUNE_ARGS:---no-progress} || status=1
      wrote_results=1 ;;
    fresh)
      froot=$(mktemp -d)
      if TRITON_CACHE_DIR=$(mktemp -d) run_step fresh "$PY" -m autotune tune \
          --results "$froot" ${TUNE_ARGS:---no-progress}
      then
        cp "$froot/$slug/tune-report.json" "$results/tune-report.json" || status=1
      else status=1
      fi
      wrote_results=1 ;;
    retune)
      [ -n "${RETUNE_RECIPES:-}" ] || { echo "gpu_pass: retune needs RETUNE_RECIPES" >&2; exit 2; }
      tag=${RETUNE_RECIPES//,/-}
      store=$(mktemp -d)
      run_step retune "$PY" -m autotune tune --recipe "$RETUNE_RECIPES" --results "$store" \
        --storage "$store/studies.journal" --budget-s "${RETUNE_BUDGET_S:-200}" --no-progress \
        || status=1
      # an interrupted tune has written the tables of the keys it finished: those
      # replace the stale ones too (dispatch serves the keys it did not reach as
      # any untuned key: a near tuned one, else the heuristic)
      copied=() missing=()
      for r in ${RETUNE_RECIPES//,/ }; do
        if [ -f "$store/$slug/$r.json" ] && cp "$store/$slug/$r.json" "$results/"
        then copied+=("$r"); else missing+=("$r"); status=1
        fi
      done
      [ -f "$store/$slug/tune-report.json" ] \
        && cp "$store/$slug/tune-report.json" "$out/retune-$tag-report.json"
      echo "retune: tables replaced: ${copied[*]:-none}; not written: ${missing[*]:-none}" \
        | tee -a "$out/summary.txt"
      wrote_results=1 ;;
    quality)
      run_step quality "$PY" -m autotune quality ${QUALITY_ARGS:---no-progress} || status=1
      wrote_results=1 ;;
    bench)
      run_step bench "$PY" -m autotune bench --budget-s "$bench_cap" --readme README.md \
        ${BENCH_ARGS:-} || status=1
      wrote_results=1 ;;
    bench1)
      run_step bench1 "$PY" -m autotune bench --suite "$bench1" --budget-s "$bench_cap" \
        --readme README.md ${BENCH_ARGS:-} || status=1
      wrote_results=1 ;;
    bench2)
      rest=$(others)
      if [ -z "$rest" ]; then echo "bench2: no suites besides $bench1" | tee -a "$out/summary.txt"
      else
        run_step bench2 "$PY" -m autotune bench --suite "$rest" --budget-s "$bench_cap" \
          --readme README.md ${BENCH_ARGS:-} || status=1
      fi
      wrote_results=1 ;;
    example)
      run_step example "$PY" examples/spec_decode.py --bench \
        ${EXAMPLE_ARGS:-} || status=1
      wrote_results=1 ;;
    stages)
      run_step stages "$PY" tools/stages.py --out "$results/stages.md" || status=1
      wrote_results=1 ;;
    sampled-stages)
      run_step sampled-stages "$PY" tools/sampled_stages.py \
        --out "$results/stages-sampled.md" || status=1
      wrote_results=1 ;;
    probe)
      jobs=$(( $(nproc 2>/dev/null || echo 4) - 1 ))
      run_step probe "$PY" tools/controls_probe.py --jobs "$(( jobs > 1 ? jobs : 1 ))" 1 8 64 \
        && sed -n '/^| case/,$p' "$out/probe.log" >"$out/controls-probe.md" || status=1 ;;
    costs)
      run_step costs "$PY" tools/tune_costs.py || status=1
      run_step launchers "$PY" tools/tune_costs.py --launchers || status=1 ;;
    targets)
      if "$PY" -m autotune.targets "$results" >"$results/TARGETS.md.tmp" 2>"$out/targets.log"; then
        mv "$results/TARGETS.md.tmp" "$results/TARGETS.md"
        cp "$results/TARGETS.md" "$out/TARGETS.md"
        echo "targets: $(grep -o '[0-9]* of [0-9]* met, [0-9]* not evaluated' "$results/TARGETS.md")" \
          | tee -a "$out/summary.txt"
      else
        rm -f "$results/TARGETS.md.tmp"; echo "targets: failed (see targets.log)" \
          | tee -a "$out/summary.txt"; status=1
      fi
      wrote_results=1 ;;
    *) echo "gpu_pass: unknown step $step (test test1 .. testN tune fresh retune quality" \
            "bench bench1 bench2 example stages sampled-stages probe costs targets)" >&2
       exit 2 ;;
  esac
done
pack
exit $status
