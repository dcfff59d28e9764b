#!/usr/bin/env bash
# A/B on the GPU machine in one device call: several source trees (this one and worktrees of
# branches carried with the call) are built in parallel, each runs the GPU tests, then each runs
# the same benchmark one after the other (same card state, same copy-bandwidth ceiling). All
# results are packed into $OUT/results.tgz, one file, since the device tool returns at most 8.
#   scripts/gpu_ab.sh TREE...        e.g. scripts/gpu_ab.sh . .cuda-wt/nvfp4 .cuda-wt/prepare
# Environment: BENCH_ARGS (the `replayssm bench --backend cuda` options; default below),
# LIMIT_S (overall seconds, default 540: the results are packed even when it runs out).
# Make a tree: `git worktree add .cuda-wt/NAME BRANCH` (.cuda-wt/ is excluded from git), and name
# it, with .cuda-wt/.deps where the machine lacks the test packages (docs/cuda.md), in `carry`.
set -uo pipefail
[[ $# -ge 1 ]] || { echo "usage: scripts/gpu_ab.sh TREE..." >&2; exit 2; }
out=${OUT:-gpu-out}
work=$(mktemp -d)
mkdir -p "$out"
[[ -d .cuda-wt/.deps/usr ]] && cp -rn .cuda-wt/.deps/usr/. /usr/ 2>/dev/null
bench_args=${BENCH_ARGS:---batches 1,64,256 --modes shared-fp8,separate-fp8,separate-nvfp4 --windows 1,8}
jobs=$(($(nproc) / $#))
((jobs < 2)) && jobs=2
name() { [[ $1 == . ]] && echo main || basename "$1"; }

timeout "${LIMIT_S:-540}" bash -s "$work" "$jobs" "$bench_args" "$@" <<'EOF'
work=$1 jobs=$2 bench_args=$3
shift 3
name() { [[ $1 == . ]] && echo main || basename "$1"; }
for t in "$@"; do
  r="$work/$(name "$t")"
  mkdir -p "$r"
  (cd "$t" && git log -1 --format='%H %s' > "$r/commit.txt" 2>/dev/null
   cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release \
     > "$r/build.txt" 2>&1 && cmake --build build -j"$jobs" >> "$r/build.txt" 2>&1
   rc=$?; echo "[$(name "$t")] build exit $rc") &
done
wait
for t in "$@"; do
  r="$work/$(name "$t")"
  (cd "$t" && ctest --test-dir build -L gpu --output-on-failure -j4 > "$r/test.txt" 2>&1
   rc=$?; echo "[$(name "$t")] gpu tests exit $rc: $(grep -E 'tests passed' "$r/test.txt")"
   grep -hE '^\[(cuda-vs-cpu|standard-decode)\]' build/Testing/Temporary/LastTest.log \
     > "$r/agreement.txt" 2>/dev/null) &
done
wait
for t in "$@"; do
  r="$work/$(name "$t")"
  # shellcheck disable=SC2086
  (cd "$t" && ./build/bin/replayssm bench --backend cuda $bench_args > "$r/bench.txt" 2>&1
   rc=$?; echo "[$(name "$t")] bench exit $rc")
done
EOF
echo "[ab] exit $? (124: LIMIT_S ran out)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$work/gpu.txt" 2>&1
for t in "$@"; do
  echo "== $(name "$t")"
  grep -E '^\| (standard|replay)' "$work/$(name "$t")/bench.txt" 2>/dev/null
done
tar -czf "$out/results.tgz" -C "$work" .
rm -rf "$work"
