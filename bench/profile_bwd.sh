#!/usr/bin/env bash
# Runs ON the GPU machine after bench/prepare.sh: an Nsight Compute profile (full set, with
# per-instruction stall samples) of one dense backward main kernel on the wgmma family,
# d = 128, n = 4096, b = 4, h = 16 (the first such launch of the backward timings), written to
# $OUT as the report, its details page and its SASS source page (CSV).
# Usage: bench/profile_bwd.sh [KERNEL_REGEX]   (default: the dense d128 backward main kernel)
# GPUCHECK_ARGS picks the timings that launch it (default `--backward-only --no-check`; the
# dropout backward: `--dropout-only --no-check`).
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
re=${1:-flash_bwd_dense_bf16_d128x128_m64n128w8s1_sm90}
timeout 400 ncu --kernel-name "regex:$re" --launch-count 1 --set full --import-source no \
  -o "$OUT/bwd" -f .carry/flash-gpucheck ${GPUCHECK_ARGS:---backward-only --no-check} >"$OUT/run.log" 2>&1
grep -E "^bwd|PROF" "$OUT/run.log" | head -20
ncu --import "$OUT/bwd.ncu-rep" --page details >"$OUT/details.txt" 2>&1
ncu --import "$OUT/bwd.ncu-rep" --page source --csv --print-source sass >"$OUT/sass.csv" 2>&1
wc -c "$OUT"/*
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$OUT/details.txt" | head -20
