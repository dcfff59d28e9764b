#!/bin/sh
# Regenerates the snapshot traces and their CPU outputs (tests/test_trace_snapshots.cpp). The
# shapes are ones the CUDA backend supports too in every mode (dstate 64; headdim a multiple of
# 16, since the 8- and 4-bit readouts run on 16-row tensor-core tiles), so the same snapshots
# check both backends.
# Run after an intended change of numerics, and say why in the commit message:
#   tests/data/traces/regenerate.sh build/bin/replayssm
set -eu
BIN=${1:?usage: regenerate.sh PATH/TO/replayssm}
cd "$(dirname "$0")"
# Speculative decoding (window 4) with forks, releases, opens, snapshots and exports; bf16 ring.
"$BIN" trace gen --shape 4,16,64,2 --slots 3 --window 4 --steps 16 --seed 7 \
  --activation-dtype bf16 -o spec.safetensors
# Autoregressive decode across several flushes, fp32 ring.
"$BIN" trace gen --shape 2,16,64,1 --slots 2 --window 1 --steps 36 --seed 8 -o ar.safetensors
for trace in spec ar; do
  for mode in fp32 bf16 fp16 fp16-sr shared-fp8 shared-int8 separate-fp8 separate-nvfp4; do
    "$BIN" trace run "$trace.safetensors" --backend cpu --mode "$mode" -q \
      -o "$trace.$mode.out.safetensors"
  done
done
