#!/usr/bin/env bash
# Runs ON the GPU machine after bench/prepare.sh: memcheck of the backward of the variants with
# parameter gradients (frozen and not) on small shapes, then the dropout workloads (p = 0.1)
# against the peers in the same call (flash's fwd and bwd timings, the peers' fwd, bwd, fwd+bwd).
# At most 8 files come back from $OUT.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
dir=$(mktemp -d)
cp examples/variants/{alibi,relative_bias,softcap}.flash "$dir/"
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 .carry/flash-gpucheck --variants "$dir" --backward-only --small --no-time \
  >"$OUT/bwd-frozen-memcheck.log" 2>&1
grep -E "ERROR SUMMARY|^# " "$OUT/bwd-frozen-memcheck.log" | tail -4
timeout 200 .carry/flash-gpucheck --dropout-only --no-check --json "$OUT/flash.json" >"$OUT/dropout-timing.log" 2>&1
grep -E "dropout" "$OUT/dropout-timing.log" | tail -16
timeout 200 python3 .carry/peers.py --dropout --only sdpa_flash,sdpa_cudnn,sdpa_efficient,flex --seqs 4096,16384 \
  --modes fwd,bwd,fwd_bwd --json "$OUT/peers.json" >"$OUT/dropout-peers.log" 2>&1
tail -3 "$OUT/dropout-peers.log"
for m in fwd_bwd bwd; do
  python3 bench/merge_results.py --flash "$OUT/flash.json" --peers "$OUT/peers.json" --gpu "NVIDIA H200" --mode $m \
    --suffix=-dropout-tma-$m --out-dir "$OUT" 2>&1 | tail -1
done
grep dropout "$OUT"/*-dropout-tma-fwd_bwd.md "$OUT"/*-dropout-tma-bwd.md
