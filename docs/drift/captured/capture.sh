#!/bin/sh
# Streams captured from the built-in model (docs/accuracy.md, "Captured model streams"):
# 4000 greedy tokens with speculative decoding, layers 0 and 5, then the drift study on each.
#   docs/drift/captured/capture.sh build/bin/replayssm
set -eu
BIN=${1:?usage: capture.sh PATH/TO/replayssm}
OUT=${2:-/tmp/replayssm-captured}
mkdir -p "$OUT"
PROMPT='def fibonacci(n):
    """Return the n-th Fibonacci number."""
    '
for layer in 0 5; do
  "$BIN" generate -n 4000 --ignore-eos -p "$PROMPT" --capture "$OUT/layer$layer.safetensors" \
    --capture-layer "$layer" >/dev/null
done
"$BIN" drift --trace "$OUT/layer0.safetensors" --steps 3900 --seeds 1 --out "$OUT/drift0"
"$BIN" drift --trace "$OUT/layer5.safetensors" --steps 3900 --seeds 1 --regime ar --out "$OUT/drift5"
