#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root, after bench/prepare.sh filled .carry/ here
# (copy the previous release's flash-gpucheck to .carry/flash-gpucheck-prev first for the A/B):
#   1. the packed-batch and chunked-prefill checks, then the prefill timing of packed documents
#      next to dense batches of the same tokens (varlen.json, varlen-check.log);
#   1b. the FP8 quantisation kernel against the host model, bit for bit, and its bandwidth
#      (fp8.log);
#   2. the peers on the same documents: FlexAttention's document mask, FlashAttention-2's varlen
#      entry point (varlen-peers.json, varlen-peers.log);
#   3. compute-sanitizer memcheck of the packed checks on small shapes (memcheck.log);
#   4. the whole forward check, since the packed kernels changed code every forward kernel
#      shares (check.log);
#   5. with .carry/flash-gpucheck-prev, the forward timings of both binaries alternated, twice
#      (ab.log), for regressions of the dense kernels.
# At most 8 files come back from $OUT. Exit status: 0 when every check passed.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
BIN=.carry/flash-gpucheck
export PYTHONUNBUFFERED=1
status=0

echo "== packed batches, chunked prefill, prefill timing"
timeout "${VARLEN_TIMEOUT:-420}" "$BIN" --varlen-only --json "$OUT/varlen.json" >"$OUT/varlen-check.log" 2>&1 \
  || { echo "varlen check FAILED"; status=1; }
grep -E "^#|^FAIL|^varlen" "$OUT/varlen-check.log" | tail -40

echo "== fp8 quantisation"
timeout "${FP8_TIMEOUT:-180}" "$BIN" --fp8-only >"$OUT/fp8.log" 2>&1 || { echo "fp8 check FAILED"; status=1; }
grep -E "^# |^FAIL|^quant bf16" "$OUT/fp8.log" | tail -12

echo "== peers on the same documents"
timeout "${PEERS_TIMEOUT:-300}" python3 bench/varlen_peers.py "$OUT/varlen.json" --json "$OUT/varlen-peers.json" \
  2>&1 | tee "$OUT/varlen-peers.log"

echo "== memcheck (small shapes)"
timeout "${SAN_TIMEOUT:-300}" compute-sanitizer --tool memcheck --print-limit 20 "$BIN" --varlen-only --small --no-time \
  >"$OUT/memcheck.log" 2>&1 || { echo "memcheck FAILED"; status=1; }
grep -E "ERROR SUMMARY|^# " "$OUT/memcheck.log" | tail -5

if [ -z "${SKIP_FORWARD:-}" ]; then
  echo "== the whole forward check"
  timeout "${CHECK_TIMEOUT:-300}" "$BIN" --no-time >"$OUT/check.log" 2>&1 || { echo "forward check FAILED"; status=1; }
  grep -E "^# |^FAIL" "$OUT/check.log" | tail -20
fi

if [ -x .carry/flash-gpucheck-prev ] && [ -z "${SKIP_AB:-}" ]; then
  echo "== forward timings, previous and this binary alternated"
  for round in 1 2; do
    for b in prev new; do
      bin=$([ "$b" = prev ] && echo .carry/flash-gpucheck-prev || echo "$BIN")
      echo "## round $round $b"
      timeout "${AB_TIMEOUT:-200}" "$bin" --no-check 2>&1 | grep -E "^fwd " | head -80
    done
  done >"$OUT/ab.log" 2>&1
  tail -5 "$OUT/ab.log"
fi
exit $status
