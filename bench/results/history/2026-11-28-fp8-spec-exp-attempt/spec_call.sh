#!/usr/bin/env bash
# Runs ON the GPU machine: the speculative-exponent patch (bench/patches/5-fp8-spec-exp.diff,
# built as .carry/spec/) against the committed kernels (.carry/old/), fp8 d 128 n 4096 timed
# alternately, then the patch's check on the streamed fp8 declarations with blocks crossing items.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
export FLASH_FP8_TIME_DIMS=128 FLASH_FP8_TIME_NS=${NS:-4096}
for v in spec old; do
  timeout 150 .carry/$v/flash-gpucheck --fp8-only --no-check >"$OUT/fp8-$v-1.log" 2>&1 || echo "$v: exit $?"
done
python3 bench/ab_multi_table.py "$OUT" fp8 1 old spec | tee "$OUT/fp8-ab.md"
FLASH_PERSISTENT_BLOCKS=3 FLASH_FP8_ATTENTION_ONLY=1 \
  FLASH_FP8_VARIANTS=Fp8CausalPerHead,Fp8DensePerTensor,Fp8CausalInt8PerHead,Fp8DenseInt8V16,Fp8WindowVRowsChannel,Fp8DenseVChannel \
  timeout "${CHECK_TIMEOUT:-170}" .carry/spec/flash-gpucheck --fp8-only --no-time >"$OUT/spec-check.log" 2>&1
echo "check exit $?"
grep -E '^#|^FAIL' "$OUT/spec-check.log" | tail -20
