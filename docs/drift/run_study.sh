#!/usr/bin/env bash
# Regenerates the numbers and plots of docs/accuracy.md on the CPU backend (about 15-20 minutes
# on two cores). Usage, from the repository root after building: bash docs/drift/run_study.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${REPLAYSSM:-build/bin/replayssm}
out=docs/drift
common=(--shape 8,16,32,2 --seeds 3 --modes all --regime ar,spec -q)

# The table: every stream at 1K, 8K and 32K decode tokens, history 16 (plots only for 32K).
for steps in 1024 8192; do
  "$bin" drift "${common[@]}" --steps "$steps" --stream all --history 16 --no-plots \
    --out "$out/runs/$steps" > "$out/runs/table_$steps.txt"
done
"$bin" drift "${common[@]}" --steps 32768 --stream all --history 16 \
  --out "$out/runs/32768" > "$out/runs/table_32768.txt"

# History 8 and 32 on the two streams where the history matters most.
"$bin" drift "${common[@]}" --steps 32768 --stream mamba2,long --history 8,32 \
  --out "$out/runs/history" > "$out/runs/table_history.txt"

# Deliberately biased roundings (hook arms, not cache modes): what the signed metric detects.
"$bin" drift --shape 8,16,32,2 --seeds 3 --regime ar -q --steps 32768 --stream long,tiny \
  --modes fp16-sr7,fp16-sr7-biased,fp16-sr13,fp16-sr4-biased,fp16-trunc \
  --out "$out/runs/biased" > "$out/runs/table_biased.txt"

# A larger row (dstate 128, as in the models), shorter run.
"$bin" drift --shape 8,64,128,1 --steps 8192 --seeds 2 --stream long,mamba2 --regime ar -q \
  --modes fp16,fp16-sr7,shared-fp8,shared-int8,separate-fp8,separate-nvfp4 --no-plots \
  --out "$out/runs/shape128" > "$out/runs/table_shape128.txt"

# A whole layer of the Mamba-2 2.7B shape (80 heads x 64 x 128, 1 group), 32K tokens, every arm,
# autoregressive and speculative, one seed (about 17 minutes on 2 cores); two plots kept.
"$bin" drift --shape 80,64,128,1 --steps 32768 --seeds 1 -q --out "$out/runs/model" \
  > "$out/runs/table_model.txt"

# The same layer on a GPU (CUDA build; about 2 minutes on an H200), autoregressive; not run by
# default since the study's machine may have no GPU.
if [[ ${DRIFT_CUDA:-0} == 1 ]]; then
  "$bin" drift --backend cuda --shape 80,64,128,1 --steps 32768 --seeds 1 --regime ar -q \
    --out "$out/runs/model-cuda" > "$out/runs/table_model_cuda.txt"
fi
