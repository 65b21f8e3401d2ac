#!/usr/bin/env bash
# Runs ON the GPU machine: the bf16 overlap patches of bench/patches/ against the committed
# kernels, alternated in one call. Here first:
#   bench/build_patched.sh old= a=bench/patches/2-bf16-step-late.diff b=bench/patches/4-bf16-votes.diff
# then, carrying .carry:
#   bash bench/next_call.sh ab      # bf16 variants, one round of each build
# And the fp8 exponentials in turns between the consumer warpgroups (bench/patches/5-fp8-exp-turns.diff):
#   bench/build_patched.sh old= turns=bench/patches/5-fp8-exp-turns.diff
#   bash bench/next_call.sh turns   # fp8 d 128 timing of both builds (NS=4096 by default; NS=4096,16384
#                                   # for both lengths), then the patch's check on the streamed
#                                   # declarations with blocks crossing items (a hang would be a
#                                   # barrier mismatch: the check runs under `timeout`)
# (Its `check` step, the first GPU run of `v_scales`, ran on 2026-11-28:
# bench/results/vscales-2026-11-28/.) Logs and tables land in $OUT.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case "${1:-}" in
  ab)
    BINS="old a b" ROUNDS=1 NAME=bf16 TIME_ARGS="--time-set bf16,d64,n4096,n16384,variants" bash bench/ab_multi.sh
    ;;
  turns)
    for v in turns old; do
      FLASH_FP8_TIME_DIMS=128 FLASH_FP8_TIME_NS=${NS:-4096} timeout 200 .carry/$v/flash-gpucheck --fp8-only --no-check \
        >"$OUT/fp8-$v-1.log" 2>&1 || echo "$v: exit $?"
    done
    python3 bench/ab_multi_table.py "$OUT" fp8 1 old turns | tee "$OUT/fp8-ab.md"
    FLASH_PERSISTENT_BLOCKS=3 FLASH_FP8_ATTENTION_ONLY=1 \
      FLASH_FP8_VARIANTS=Fp8CausalPerHead,Fp8DensePerTensor,Fp8CausalInt8PerHead,Fp8DenseInt8V16,Fp8CausalVRowsInt8PerHead,Fp8DenseVChannel,Fp8CausalPerHeadVChannel,Fp8CausalVHead,Fp8WindowVRowsChannel,Fp8CausalVTensor,Fp8DenseInt8VChannel \
      timeout "${CHECK_TIMEOUT:-200}" .carry/turns/flash-gpucheck --fp8-only --no-time >"$OUT/turns-check.log" 2>&1
    echo "check exit $?"
    grep -E '^#|^FAIL' "$OUT/turns-check.log" | tail -20
    ;;
  *)
    echo "usage: bench/next_call.sh ab|turns" >&2
    exit 2
    ;;
esac
