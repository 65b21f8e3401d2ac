#!/usr/bin/env bash
# Runs ON the GPU machine (carrying .carry with a release flash-gpucheck under .carry/$BIN/, BIN
# defaulting to `old`; `bench/build_patched.sh` builds candidates beside it, e.g.
# `BIN=turns bash bench/profile_fp8.sh` for a patch's kernel; NS picks the lengths): an
# Nsight Compute profile (full set, with per-instruction stall samples) of the fp8 d 128 forward
# with per-head scales and 192-key tiles (the per-head/per-tensor default, `fp8_perhead_n192`
# rows), dense, at n 16384 (b 1) and n 4096 (b 4), h 16, one launch each after three warm-ups.
# Writes the details page, SASS page and raw metrics of each profile to $OUT (…-BIN-N.*) and
# prints the lines that say what bounds the kernel.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
re=${1:-fwd_fp8denseh_e4m3_d128x128_m128n192}
bin=${BIN:-old}
for n in ${NS:-16384 4096}; do
  FLASH_FP8_TIME_DIMS=128 FLASH_FP8_TIME_NS=$n timeout 280 ncu --kernel-name "regex:$re" \
    --launch-skip 3 --launch-count 1 --set full --import-source no -o "$OUT/fp8-$bin-$n" -f \
    ".carry/$bin/flash-gpucheck" --fp8-only --no-check >"$OUT/run-$bin-$n.log" 2>&1
  echo "n $n: ncu exit $?"
  ncu --import "$OUT/fp8-$bin-$n.ncu-rep" --page details >"$OUT/details-$bin-$n.txt" 2>&1
  ncu --import "$OUT/fp8-$bin-$n.ncu-rep" --page source --csv --print-source sass >"$OUT/sass-$bin-$n.csv" 2>&1
  ncu --import "$OUT/fp8-$bin-$n.ncu-rep" --page raw >"$OUT/raw-$bin-$n.txt" 2>&1
  rm -f "$OUT/fp8-$bin-$n.ncu-rep"
  grep -E "pipe_(tensor|xu|fma|alu|fp16)[a-z_]*(active|executed)[a-z_.]*pct_of_peak_sustained_active|sm__throughput.avg.pct|smsp__issue_active.avg.pct" "$OUT/raw-$bin-$n.txt" | head -30
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Registers Per|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Eligible Warps|Active Warps Per" "$OUT/details-$bin-$n.txt" | head -20
done
wc -c "$OUT"/*
