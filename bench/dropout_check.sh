#!/usr/bin/env bash
# Runs ON the GPU machine after bench/prepare.sh, with the previous build copied to
# .carry/flash-gpucheck-old: the dropout timings of both builds alternated twice (the A/B of a
# change to the dropout kernels; the new build first, and a hang stops the script there), the
# dropout check (GPU masks against the host generator bit for bit over every family and tile
# configuration, forward and gradients by FlashAttention's rule), its memcheck on small shapes,
# and, with PEERS=1, the peers' dropout workloads (p = 0.1) in the same call, merged with the new
# build's first timings into the fwd_bwd and bwd tables. At most 8 files come back from $OUT.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
for round in 1 2; do
  for build in new old; do
    bin=.carry/flash-gpucheck; [ "$build" = old ] && bin=.carry/flash-gpucheck-old
    json=(); [ "$build$round" = new1 ] && json=(--json "$OUT/flash.json")
    echo "## $build round $round" >>"$OUT/dropout-ab.log"
    timeout 80 "$bin" --dropout-only --no-check "${json[@]}" >>"$OUT/dropout-ab.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then echo "## $build round $round: rc $rc" | tee -a "$OUT/dropout-ab.log"; exit 1; fi
  done
done
grep -E "^## |dropout0" "$OUT/dropout-ab.log"
timeout 150 .carry/flash-gpucheck --dropout-only --no-time >"$OUT/dropout-check.log" 2>&1
echo "rc $?" >>"$OUT/dropout-check.log"
grep -E "^# |^FAIL|^rc" "$OUT/dropout-check.log" | tail -12
timeout 120 compute-sanitizer --tool memcheck --print-limit 20 .carry/flash-gpucheck --dropout-only --small --no-time \
  >"$OUT/dropout-memcheck.log" 2>&1
echo "rc $?" >>"$OUT/dropout-memcheck.log"
grep -E "ERROR SUMMARY|^# .*passed|^rc" "$OUT/dropout-memcheck.log" | tail -6
[ "${PEERS:-0}" = 1 ] || exit 0
timeout 200 python3 .carry/peers.py --dropout --only sdpa_flash,sdpa_cudnn,flex --seqs 4096,16384 \
  --modes fwd,bwd,fwd_bwd --json "$OUT/peers.json" >"$OUT/dropout-peers.log" 2>&1
tail -3 "$OUT/dropout-peers.log"
for m in fwd_bwd bwd; do
  python3 bench/merge_results.py --flash "$OUT/flash.json" --peers "$OUT/peers.json" --gpu "NVIDIA H200" --mode $m \
    --suffix=-dropout-$m --out-dir "$OUT" 2>&1 | tail -1
done
grep dropout "$OUT"/*-dropout-fwd_bwd.md "$OUT"/*-dropout-bwd.md
