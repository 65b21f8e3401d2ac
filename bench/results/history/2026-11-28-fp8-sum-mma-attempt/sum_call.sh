#!/usr/bin/env bash
# Runs ON the GPU machine: the row sums on the tensor cores (bench/patches/6-fp8-sum-mma.diff,
# built as .carry/sum/): fp8 d 128 n 4096 timing (flash bf16 in the same run), then its check on
# the streamed fp8 declarations with blocks crossing items.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
FLASH_FP8_TIME_DIMS=128 FLASH_FP8_TIME_NS=4096 timeout 110 .carry/sum/flash-gpucheck --fp8-only --no-check >"$OUT/fp8-sum-1.log" 2>&1 || echo "timing: exit $?"
grep -E "perhead|bf16|fp8 / bf16" "$OUT/fp8-sum-1.log"
FLASH_PERSISTENT_BLOCKS=3 FLASH_FP8_ATTENTION_ONLY=1 \
  FLASH_FP8_VARIANTS=Fp8CausalPerHead,Fp8DensePerTensor,Fp8CausalInt8PerHead,Fp8WindowVRowsChannel,Fp8DenseVChannel,Fp8CausalVHead \
  timeout "${CHECK_TIMEOUT:-90}" .carry/sum/flash-gpucheck --fp8-only --no-time >"$OUT/sum-check.log" 2>&1
echo "check exit $?"
grep -E '^#|^FAIL' "$OUT/sum-check.log" | tail -20
