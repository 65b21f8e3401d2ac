#!/usr/bin/env bash
# Runs ON the GPU machine: the first GPU run of the work committed without one (2026-11-28, no
# device time left that session). Here first:
#   bench/build_patched.sh old= a=bench/patches/1-fp8-boundary-vote.diff,bench/patches/4-bf16-votes.diff \
#     b=bench/patches/3-fp8-stream-all-votes.diff,bench/patches/4-bf16-votes.diff
# then one device call per step, carrying .carry:
#   bash bench/next_call.sh check   # v_scales: quantiser (per-channel cases bit for bit against
#                                   # the host model), the eight v_scales declarations of
#                                   # examples/fp8/check.flash under the 2x rule with blocks
#                                   # crossing work items, the accuracy table (~4 min)
#   bash bench/next_call.sh ab      # the overlap patches against the committed kernels, alternated:
#                                   # fp8 d 128 (with the _vchannel rows) and bf16 variants (~7 min)
# Logs and tables land in $OUT.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
case "${1:-}" in
  check)
    FLASH_PERSISTENT_BLOCKS=3 \
      FLASH_FP8_VARIANTS=Fp8DenseVChannel,Fp8CausalPerHeadVChannel,Fp8CausalVHead,Fp8Causal256VChannel,Fp8WindowVRowsChannel,Fp8DensePerHeadVBlock,Fp8CausalVTensor,Fp8DenseInt8VChannel \
      timeout "${CHECK_TIMEOUT:-420}" .carry/old/flash-gpucheck --fp8-only --no-time >"$OUT/vscales-check.log" 2>&1
    echo "check exit $?"
    grep -E '^#|^FAIL|^\|' "$OUT/vscales-check.log" | tail -60
    ;;
  ab)
    FLASH_FP8_TIME_DIMS=128 BINS="old a b" ROUNDS=2 NAME=fp8 TIME_ARGS=--fp8-only bash bench/ab_multi.sh
    BINS="old a" ROUNDS=2 NAME=bf16 TIME_ARGS="--time-set bf16,d64,n4096,n16384,variants" bash bench/ab_multi.sh
    ;;
  *)
    echo "usage: bench/next_call.sh check|ab" >&2
    exit 2
    ;;
esac
