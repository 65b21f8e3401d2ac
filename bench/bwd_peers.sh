#!/usr/bin/env bash
# Runs ON the GPU machine after bench/prepare.sh: flash's forward and backward timings (the
# variants with frozen score params as the peers run them, and with their gradients), then the
# peers' dense and variant backward and fwd+bwd in the same call, and the merged tables.
# At most 8 files come back from $OUT.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
MODE=${MODE:---backward-only}   # --backward also times the forward (for the fwd+bwd table)
SUFFIX=${SUFFIX:--bwd-tma}       # of the merged table's file name
MODES=${MODES:-bwd}             # the peers' modes: bwd, fwd_bwd
if [ -n "${CHECK:-}" ]; then    # CHECK="alibi relative_bias softcap": their backward check first
  dir=$(mktemp -d)
  for v in $CHECK; do cp "examples/variants/$v.flash" "$dir/"; done
  timeout 150 .carry/flash-gpucheck --variants "$dir" --backward-only --no-time >"$OUT/bwd-check.log" 2>&1
  grep -E "^# |^FAIL" "$OUT/bwd-check.log" | tail -6
fi
timeout 200 .carry/flash-gpucheck $MODE --no-check --json "$OUT/flash.json" >"$OUT/timing.log" 2>&1
grep -E "^bwd .*(flash +[0-9]|useful)" "$OUT/timing.log" | grep -v "x[0-9]*x[0-9]* Sm" | tail -30
timeout 240 python3 .carry/peers.py --variants --only sdpa_flash,sdpa_cudnn,flex --seqs 4096,16384 \
  --modes "$MODES" --variant-seqs 4096,16384 --json "$OUT/peers.json" >"$OUT/peers.log" 2>&1
tail -3 "$OUT/peers.log"
python3 bench/merge_results.py --flash "$OUT/flash.json" --peers "$OUT/peers.json" --gpu "NVIDIA H200" --mode bwd \
  --suffix="${SUFFIX:--bwd-tma}" --out-dir "$OUT" 2>&1 | tail -3
python3 bench/fwd_bwd_table.py "$OUT/flash.json" "$OUT/peers.json" >"$OUT/fwd-bwd.md" 2>&1
cat "$OUT"/*"${SUFFIX:--bwd-tma}".md | head -40
cat "$OUT/fwd-bwd.md" | head -40
