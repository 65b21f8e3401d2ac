#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root, after bench/prepare.sh filled .carry/ here:
#   1. .carry/flash-gpucheck: correctness of every example variant + timings (flash.json);
#   2. compute-sanitizer memcheck of the same check on small shapes;
#   3. bench/run_smoke.py: `flash run` on .npy files against a torch float64 reference;
#   4. .carry/peers.py (PyTorch SDPA, FlexAttention) in the same call, so ratios are fair;
#   5. bench/merge_results.py: bench/results/<gpu>-<date>.{json,md}, copied to $OUT.
# Knobs: SKIP_SANITIZER=1, SKIP_SMOKE=1, SKIP_PEERS=1, PEERS_ARGS (default "--quick --variants"),
# CHECK_ARGS (extra flash-gpucheck arguments), *_TIMEOUT seconds per stage.
# Exit status: 0 when the check, memcheck and the smoke test passed.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT" bench/results
BIN=.carry/flash-gpucheck
export PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
DATE=$(date -u +%Y-%m-%d)
status=0

echo "== flash-gpucheck"
timeout "${CHECK_TIMEOUT:-240}" "$BIN" --json "$OUT/flash.json" ${CHECK_ARGS:-} 2>&1 | tee "$OUT/check.log" | grep -v '^ok '
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "flash-gpucheck FAILED"; status=1; }

if [ -z "${SKIP_SANITIZER:-}" ]; then
  echo "== compute-sanitizer memcheck (small shapes)"
  timeout "${SAN_TIMEOUT:-150}" compute-sanitizer --tool memcheck --print-limit 20 "$BIN" --small \
    >"$OUT/memcheck.log" 2>&1
  san=$?
  grep -E "ERROR SUMMARY|^# correctness|^FAIL" "$OUT/memcheck.log" | tail -20
  [ "$san" -eq 0 ] || { echo "memcheck FAILED (exit $san)"; status=1; }
fi

if [ -z "${SKIP_SMOKE:-}" ]; then
  echo "== flash run smoke test"
  timeout "${SMOKE_TIMEOUT:-60}" python3 bench/run_smoke.py .carry/flash 2>&1 | tee "$OUT/smoke.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "smoke test FAILED"; status=1; }
fi

if [ -z "${SKIP_PEERS:-}" ]; then
  echo "== peers.py ${PEERS_ARGS:---quick --variants}"
  timeout "${PEERS_TIMEOUT:-600}" python3 .carry/peers.py ${PEERS_ARGS:---quick --variants} \
    --json "$OUT/peers.json" >"$OUT/peers.log" 2>&1 || echo "peers.py did not finish (see peers.log)"
  grep -E "^#" "$OUT/peers.log" | head -5
fi

echo "== merge"
python3 bench/merge_results.py --flash "$OUT/flash.json" --peers "$OUT/peers.json" \
  --gpu "$GPU" --date "$DATE" --out-dir bench/results
cp bench/results/*-"$DATE".json bench/results/*-"$DATE".md "$OUT/" 2>/dev/null
exit $status
