#!/usr/bin/env bash
# Runs ON the GPU machine: the bf16 overlap patches of bench/patches/ against the committed
# kernels, alternated in one call. Here first:
#   bench/build_patched.sh old= a=bench/patches/2-bf16-step-late.diff b=bench/patches/4-bf16-votes.diff
# then, carrying .carry:
#   bash bench/next_call.sh ab      # bf16 variants, one round of each build
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
  *)
    echo "usage: bench/next_call.sh ab" >&2
    exit 2
    ;;
esac
