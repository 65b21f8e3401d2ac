#!/usr/bin/env bash
# Runs ON the GPU machine after bench/prepare.sh: flash's forward and backward timings (the
# variants with frozen score params as the peers run them, and with their gradients), then the
# peers' dense and variant backward and fwd+bwd in the same call, and the merged tables.
# At most 8 files come back from $OUT.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
timeout 260 .carry/flash-gpucheck --backward --no-check --json "$OUT/flash.json" >"$OUT/timing.log" 2>&1
grep -E "^bwd .*(flash +[0-9]|useful)" "$OUT/timing.log" | grep -v "x[0-9]*x[0-9]* Sm" | tail -30
timeout 300 python3 .carry/peers.py --variants --only sdpa_flash,sdpa_cudnn,flex --seqs 4096,16384 \
  --modes bwd,fwd_bwd --variant-seqs 4096,16384 --json "$OUT/peers.json" >"$OUT/peers.log" 2>&1
tail -3 "$OUT/peers.log"
python3 bench/merge_results.py --flash "$OUT/flash.json" --peers "$OUT/peers.json" --gpu "NVIDIA H200" --mode bwd \
  --suffix=-bwd-tma --out-dir "$OUT" 2>&1 | tail -3
python3 bench/fwd_bwd_table.py "$OUT/flash.json" "$OUT/peers.json" >"$OUT/fwd-bwd.md" 2>&1
cat "$OUT"/*-bwd-tma.md | head -40
cat "$OUT/fwd-bwd.md" | head -40
