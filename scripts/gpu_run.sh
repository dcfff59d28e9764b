#!/usr/bin/env bash
# Build, test, check and benchmark the CUDA backend on a GPU machine in one call (the device lease
# is short). Every step writes its log to $OUT (or ./gpu-out); a failing step does not stop the
# later ones, and the exit status is non-zero when any step failed.
#   scripts/gpu_run.sh [STEP...]     steps: build test racecheck bench table profile stalls source
#                                    kernels phases drift
#                                    (default: build test racecheck bench profile)
# Environment: RACE_FILTER (the gtest filter run under the sanitizers), BENCH_ARGS (the `replayssm
# bench` configurations), TABLE_ARGS (the headline table's), PROFILE_ARGS (the profiled bench's),
# PROFILE_SKIP (the launches the profile, stalls and source steps skip: 60, 40 and 40),
# STALLS_KERNELS / STALLS_WINDOW / STALLS_COUNT (the kernels, window and number of launches of the
# stalls step), SOURCE_KERNEL / SOURCE_WINDOW (the kernel and window of the source step),
# KERNELS_WINDOW / KERNELS_COUNT (the window and number of launches of the kernels step),
# PHASE_ARGS (the phases step's configurations, ';'-separated),
# DIAG_PATCH (a diagnostic patch of bench/diagnostics applied before the build, e.g.
# bench/diagnostics/direct-phase-clock.patch: never on a tree whose numbers are reported),
# REPLAYSSM_BIN (the program the bench, table, profile, stalls, source, kernels, phases and
# drift steps run; default ./build/bin/replayssm; a .xz file is decompressed first),
# AB_TREE (a second source tree, e.g. a worktree of a branch carried with the call: the same steps
# run there afterwards, results under $OUT/ab, so both versions are measured in one call),
# REQUIRE_GPU (a part of the GPU's name, e.g. H200: on any other card, or none, exit 3 before any
# step, so that a table meant for one card never spends a lease on another).
set -uo pipefail
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(build test racecheck bench profile)
out=${OUT:-gpu-out}
mkdir -p "$out"
rc=0
has() { [[ " ${steps[*]} " == *" $1 "* ]]; }
step() {  # step NAME LIMIT_S CMD...: runs CMD under a time limit, logs to $out/NAME.txt
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  local s=$?
  echo "[$name] exit $s after $((SECONDS - t0)) s"
  ((s != 0)) && rc=1 && tail -25 "$out/$name.txt"
  return $s
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
if [[ -n ${REQUIRE_GPU:-} ]] && ! grep -qi -- "$REQUIRE_GPU" <(tail -n +2 "$out/gpu.txt"); then
  echo "REQUIRE_GPU=$REQUIRE_GPU: this machine's GPU is not one (nvidia-smi above); no step run" >&2
  exit 3
fi
git log -1 --format='commit %H %s' 2>/dev/null | tee -a "$out/gpu.txt"
# REPLAYSSM_BIN: a replayssm program built elsewhere (an sm_90a build carried with the call, maybe
# xz-compressed) for the steps that run it, so that a short lease needs no `build` step.
bin=${REPLAYSSM_BIN:-./build/bin/replayssm}
if [[ $bin == *.xz ]]; then
  xz -dc "$bin" >/tmp/replayssm-carried && chmod +x /tmp/replayssm-carried || exit 1
  bin=/tmp/replayssm-carried
fi

if [[ -n ${DIAG_PATCH:-} ]]; then
  # git apply where the tree is a checkout, patch(1) where it is a plain copy.
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    step diag-patch 30 git apply "$DIAG_PATCH" || exit 1
  else
    step diag-patch 30 patch -p1 --forward -i "$DIAG_PATCH" || exit 1
  fi
fi
if has build; then
  step configure 120 cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_BUILD_TYPE=Release || exit 1
  step build 400 cmake --build build -j16 || exit 1
fi
# Which program the later steps run (a carried REPLAYSSM_BIN, or the build's).
[[ -x $bin ]] && "$bin" --version | sed 's/^/replayssm /' | tee -a "$out/gpu.txt"
if has test; then
  step test 300 ctest --test-dir build -L gpu --output-on-failure -j4
  grep -E "tests passed|tests failed|\*\*\*Failed|Failed  " "$out/test.txt" | head -20
  grep -hE "^\[(cuda-vs-cpu|standard-decode)\]" build/Testing/Temporary/LastTest.log 2>/dev/null |
    sort | uniq >"$out/test-agreement.txt"
fi
if has racecheck; then
  # A random mixed sequence (flushing and non-flushing slots), the graph test and the direct
  # readout's W > 1 path at four heads per block (about 70 s under racecheck on the H200) under
  # the shared-memory race checker, the memory checker and the initialisation checker.
  filt=${RACE_FILTER:-'*RandomOperationSequence/separate_fp8_bf16:*RandomOperationSequence/separate_nvfp4*:*GraphCapture*:CudaBackend.DirectReadoutMultiHeadBlocksMatchesCpu'}
  for tool in racecheck memcheck initcheck; do
    step $tool 200 compute-sanitizer --tool $tool --error-exitcode 3 \
      ./build/tests/test_cuda_backend --gtest_filter="$filt"
    grep -E "SUMMARY|FAILED  \]|PASSED" "$out/$tool.txt" | head -8
  done
fi
if has bench; then
  step bench 420 $bin bench --backend cuda --check \
    ${BENCH_ARGS:---batches 1,8,64,256 --modes fp32,bf16,shared-fp8,separate-fp8,separate-nvfp4 --windows 1,8}
  cat "$out/bench.txt"
fi
if has table; then
  # The README's headline table (TABLE_ARGS: the bench options): every batch and window of the
  # three low-precision modes against the standard kernels of the same process, checked against
  # the CPU first; JSON in table.json, the table in table.md (scripts/bench_table.py). Then the
  # speculative windows at history 32 (table-h32.json).
  tbl=${TABLE_ARGS:---batches 1,8,64,256 --windows 1,4,8 \
    --modes shared-fp8,separate-fp8,separate-nvfp4}
  step table 420 bash -c "$bin bench --backend cuda --check $tbl -o json >$out/table.json"
  python3 scripts/bench_table.py "$out/table.json" | tee "$out/table.md"
  step table-h32 150 bash -c "$bin bench --backend cuda --batches 64,256 \
    --modes separate-fp8,separate-nvfp4 --windows 4,8 --history 32 -o json >$out/table-h32.json"
  python3 scripts/bench_table.py "$out/table-h32.json" | tee "$out/table-h32.md"
fi
if has profile; then
  # Per-kernel duration, DRAM throughput, occupancy and registers of the replay kernels, one
  # configuration per window (PROFILE_ARGS: the bench options), of timed steps: PROFILE_SKIP
  # matching launches are skipped first (60 here, where validate, verify and commit of each of
  # the bench's phase-spreading pre-steps match; as in bench/results/2026-12-06-h200-session53.md).
  # Also each launch's shared memory and the SM configuration it ran in: a flush and a verify in
  # different configurations do not overlap (bench/results/2026-12-06-h100-session54.md). ncu
  # reports the function's own configuration, not that of a launch with the step carveout's
  # attribute (session 56): tests/test_carveout_driver.cu reads that one from residency.
  metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
  metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
  metrics+=,launch__grid_size,launch__block_size,launch__occupancy_limit_registers
  metrics+=,launch__occupancy_limit_shared_mem,launch__shared_mem_per_block_dynamic
  metrics+=,launch__shared_mem_config_size
  for w in 1 8; do
    step profile-w$w 200 ncu --clock-control none --metrics "$metrics" --csv \
      -k regex:'verify|flush|validate|finalize|commit' -s "${PROFILE_SKIP:-60}" -c 60 \
      $bin bench --backend cuda --repeats 1 --flush-cycles 1 --windows $w \
      ${PROFILE_ARGS:---modes separate-fp8 --batches 64}
  done
fi
if has stalls; then
  # Where the flush and verify kernels wait: warp-state (stall reasons), scheduler, occupancy and
  # memory sections of one launch each, W = 8 (PROFILE_ARGS: the bench options). STALLS_KERNELS
  # (an ncu name regex), STALLS_WINDOW and STALLS_COUNT (launches, 4) pick other kernels, e.g. the
  # standard kernel with 4 intermediate states: STALLS_KERNELS=standard_decode_kernel
  # STALLS_WINDOW=4 STALLS_COUNT=40 PROFILE_SKIP=0 (the fp32 kernel's launches come first).
  # PROFILE_SKIP (40 here) matching launches are skipped first: the bench's phase-spreading
  # pre-steps (up to history - 1 decode steps of fewer entries, ring nearly empty) come before the
  # timed steps.
  step stalls 240 ncu --clock-control none --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats \
    -k regex:"${STALLS_KERNELS:-flush_kernel|verify_kernel}" -s "${PROFILE_SKIP:-40}" \
    -c "${STALLS_COUNT:-4}" \
    $bin bench --backend cuda --repeats 1 --flush-cycles 1 --windows "${STALLS_WINDOW:-8}" \
    ${PROFILE_ARGS:---modes separate-fp8 --batches 64}
fi
if has source; then
  # Where one kernel's warps wait, by region of its SASS and by instruction (warp-state samples;
  # scripts/ncu_source_summary.py): SOURCE_KERNEL (an ncu name regex, verify_kernel),
  # SOURCE_WINDOW (1); PROFILE_ARGS the other bench options; PROFILE_SKIP as for stalls. The
  # source page is kept in source.csv.xz.
  step source 240 ncu --clock-control none --section WarpStateStats --section SourceCounters \
    --import-source no -k regex:"${SOURCE_KERNEL:-verify_kernel}" -s "${PROFILE_SKIP:-40}" -c 1 \
    -f -o /tmp/replayssm-source \
    $bin bench --backend cuda --repeats 1 --flush-cycles 1 --windows "${SOURCE_WINDOW:-1}" \
    ${PROFILE_ARGS:---modes separate-fp8 --batches 64}
  ncu --import /tmp/replayssm-source.ncu-rep --page source --csv --print-source sass \
    >/tmp/replayssm-source.csv && xz -c /tmp/replayssm-source.csv >"$out/source.csv.xz" &&
    python3 scripts/ncu_source_summary.py /tmp/replayssm-source.csv | tee "$out/source-summary.txt"
fi
if has kernels; then
  # Each kernel of a replay step alone (ncu serialises them), summed per step and grouped by the
  # step's verify kernel (scripts/ncu_step_times.py): which kernel a step's time is in. Window
  # KERNELS_WINDOW (8); PROFILE_ARGS the other bench options, e.g. '--modes separate-fp8
  # --batches 64 --history 32'.
  step kernels 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    -k regex:'verify|flush|validate|commit' -c "${KERNELS_COUNT:-160}" \
    $bin bench --backend cuda --repeats 1 --flush-cycles 1 --windows "${KERNELS_WINDOW:-8}" \
    ${PROFILE_ARGS:---modes separate-fp8 --batches 64}
  python3 scripts/ncu_step_times.py "$out/kernels.txt" | tee "$out/kernels-summary.txt"
fi
if has phases; then
  # The PHASE / DPHASE lines a diagnostic build (DIAG_PATCH) prints, for each configuration of
  # PHASE_ARGS (several separated by ';'), e.g. '--windows 8 --history 16;--windows 8 --history 32'
  # beside the default mode and batch below.
  IFS=';' read -r -a phase_configs <<< "${PHASE_ARGS:---windows 8 --history 16;--windows 8 --history 32}"
  for i in "${!phase_configs[@]}"; do
    # shellcheck disable=SC2086  # the configuration's options split on spaces
    step "phases-$i" 150 $bin bench --backend cuda --batches 64 --modes separate-fp8 --repeats 1 \
      ${phase_configs[i]}
    echo "== ${phase_configs[i]}"
    grep -h "PHASE" "$out/phases-$i.txt" | tail -6
  done
fi
if has drift; then
  step drift 150 $bin drift --backend cuda ${DRIFT_ARGS:-} --out "$out/drift"
fi
if [[ -n ${AB_TREE:-} ]]; then
  echo "[ab] the same steps in $AB_TREE"
  (cd "$AB_TREE" && OUT="$(realpath "$out")/ab" AB_TREE= bash scripts/gpu_run.sh "${steps[@]}") ||
    rc=1
fi
exit $rc
