#!/usr/bin/env bash
# Build, test and benchmark the CUDA backend on a GPU machine in one go (the device lease is
# short). Outputs land in $OUT (or ./gpu-out): build log, test log, benchmark table.
#   scripts/gpu_run.sh [test|bench|all] [extra gtest filter]
set -uo pipefail
what=${1:-all}
filter=${2:-*}
out=${OUT:-gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
cmake -S . -B build -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release \
  >"$out/build.txt" 2>&1 &&
  cmake --build build -j16 --target test_cuda_backend bench_decode >>"$out/build.txt" 2>&1 ||
  { tail -50 "$out/build.txt"; exit 1; }
rc=0
if [[ $what == test || $what == all ]]; then
  timeout 300 ./build/tests/test_cuda_backend --gtest_filter="$filter" 2>&1 | tee "$out/test.txt" |
    grep -E "^\[(cuda-vs-cpu|standard-decode)\]|FAILED|PASSED|Failure|error|Expected|Which is|actual|rel|slot" |
    uniq -c | tail -80
  rc=${PIPESTATUS[0]}
fi
if [[ $what == bench || $what == all ]]; then
  timeout 300 ./build/bin/bench_decode --out "$out/bench.md" 2>&1 | tee "$out/bench.txt"
fi
exit $rc
