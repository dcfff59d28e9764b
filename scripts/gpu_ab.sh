#!/usr/bin/env bash
# A/B on the GPU machine in one device call: several source trees (this one and worktrees of
# branches carried with the call) are built in parallel, each runs the CUDA backend's tests, then
# the same benchmark runs with every tree's program in turn (scripts/gpu_ab_programs.sh), ROUNDS
# times with the order rotated each round (same card state, same copy-bandwidth ceiling; a drift
# over the call shows as a difference between rounds). Results go to $OUT/results.tgz, packed
# again after every step, since the device tool returns at most 8 files and a call cut short keeps
# what it had packed; with one scripts/bench_compare.py table per configuration at the end.
#   scripts/gpu_ab.sh TREE...        e.g. scripts/gpu_ab.sh . .cuda-wt/nvfp4 .cuda-wt/prepare
# Environment:
#   BENCH_ARGS     the `replayssm bench --backend cuda` options (default below); several
#                  configurations separated by ';' run one after the other in each round
#   ROUNDS         rounds of the benchmarks (default 2)
#   BENCH_LIMIT_S  seconds per benchmark run (default 120; batch 256 at W = 8 with the standard
#                  T = 8 baselines alone takes about 20 s)
#   TARGETS        build targets (default: replayssm-cli test_cuda_backend; `all` builds everything
#                  and then runs `ctest -L gpu` instead of test_cuda_backend)
#   LIMIT_S        overall seconds (default 540): later steps are skipped, the results packed
#   TEST_LIMIT_S   seconds for the tests (default 110 per tree: they run side by side on one GPU;
#                  test_cuda_backend took about 100 s with two trees at once, over 150 s with three,
#                  in session 20; in session 53 two trees ran 17 of its tests each in 220 s)
#   TEST_FILTER    a gtest filter for test_cuda_backend (default: every test), e.g.
#                  'CudaBackend.DirectReadout*' for a change to the direct readout
# Each run writes bench-<configuration>-<round>-<tree>.json (and .err, whose `[bench]` lines are
# the rows measured so far, kept even when the run's limit cuts it short).
# Make a tree: `git worktree add .cuda-wt/NAME BRANCH` (.cuda-wt/ is excluded from git), and name
# it, with .cuda-wt/.deps where the machine lacks the test packages (docs/cuda.md), in `carry`.
set -uo pipefail
[[ $# -ge 1 ]] || { echo "usage: scripts/gpu_ab.sh TREE..." >&2; exit 2; }
out=${OUT:-gpu-out}
work=$(mktemp -d)
mkdir -p "$out"
[[ -d .cuda-wt/.deps/usr ]] && cp -rn .cuda-wt/.deps/usr/. /usr/ 2>/dev/null
bench_args=${BENCH_ARGS:---batches 1,64,256 --modes shared-fp8,separate-fp8,separate-nvfp4 --windows 1,8}
rounds=${ROUNDS:-2}
bench_limit=${BENCH_LIMIT_S:-120}
limit=${LIMIT_S:-540}
targets=${TARGETS:-replayssm-cli test_cuda_backend}
test_limit=${TEST_LIMIT_S:-$((110 * $#))}  # the trees' tests share the GPU
jobs=$(($(nproc) / $#))
((jobs < 2)) && jobs=2
name() { if [[ $1 == . ]]; then echo main; else basename "$1"; fi; }
pack() { tar -czf "$out/results.tgz" -C "$work" .; }
left() {  # at least 1: `timeout 0` would mean no limit
  local l=$((limit - SECONDS))
  echo $((l > 1 ? l : 1))
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$work/gpu.txt" 2>&1
for t in "$@"; do
  r="$work/$(name "$t")"
  mkdir -p "$r"
  (cd "$t" && git log -1 --format='%H %s' > "$r/commit.txt" 2>/dev/null
   build_targets=()
   [[ $targets == all ]] || read -r -a build_targets <<< "--target $targets"
   # shellcheck disable=SC2016  # expanded by the inner shell: $0 = jobs, $@ = the targets
   timeout "$(left)" bash -c 'cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a \
       -DCMAKE_BUILD_TYPE=Release -DREPLAYSSM_PYTHON=OFF && cmake --build build -j"$0" "${@}"' \
     "$jobs" "${build_targets[@]}" > "$r/build.txt" 2>&1
   echo "[$(name "$t")] build exit $? at ${SECONDS}s") &
done
wait
pack
for t in "$@"; do
  r="$work/$(name "$t")"
  (cd "$t" || exit
   if [[ $targets == all ]]; then
     timeout "$test_limit" ctest --test-dir build -L gpu --output-on-failure -j4 > "$r/test.txt" 2>&1
   else
     timeout "$test_limit" ./build/tests/test_cuda_backend --gtest_filter="${TEST_FILTER:-*}" \
       > "$r/test.txt" 2>&1
   fi
   rc=$?  # 124: cut short by TEST_LIMIT_S
   echo "[$(name "$t")] tests exit $rc: $(grep -hE 'tests passed|^\[  (PASSED|FAILED)' "$r/test.txt" | tr '\n' ' ')") &
done
wait
pack
# The benchmark rounds: each tree's program, as scripts/gpu_ab_programs.sh runs carried ones
# (the order rotated each round, for two trees reversed), into the same folder and archive.
programs=()
for t in "$@"; do
  program=$(cd "$t" && pwd)/build/bin/replayssm
  if [[ -x $program ]]; then
    programs+=("$(name "$t")=$program")
  else
    echo "[$(name "$t")] no program: not benchmarked"
  fi
done
((${#programs[@]})) &&
  RESULTS_DIR=$work OUT=$out BENCH_ARGS=$bench_args ROUNDS=$rounds BENCH_LIMIT_S=$bench_limit \
    LIMIT_S=$(left) UNPACK= bash "$(dirname "$0")/gpu_ab_programs.sh" "${programs[@]}"
rm -rf "$work"
