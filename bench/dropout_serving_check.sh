#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root, after bench/prepare.sh filled .carry/ here:
# the serving kernels (packed, chunked prefill, paged decode) of the `Dropout` example at p = 0,
# which the session that built them could not run (no device time left), and memcheck of them.
# At most 8 files come back from $OUT. Exit status: 0 when every check passed.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
BIN=.carry/flash-gpucheck
dir=$(mktemp -d)
cp examples/variants/dropout.flash "$dir/"
status=0
echo "== packed and chunked (p = 0)"
timeout 120 "$BIN" --variants "$dir" --varlen-only --no-time >"$OUT/dropout-serving-varlen.log" 2>&1 || status=1
grep -E "^# |^FAIL" "$OUT/dropout-serving-varlen.log" | tail -6
echo "== forward check with the paged decode check (p = 0 there)"
timeout 180 "$BIN" --variants "$dir" --no-time >"$OUT/dropout-serving-check.log" 2>&1 || status=1
grep -E "^# |^FAIL" "$OUT/dropout-serving-check.log" | tail -6
echo "== memcheck"
timeout 120 compute-sanitizer --tool memcheck --print-limit 20 "$BIN" --variants "$dir" --varlen-only --small --no-time \
  >"$OUT/dropout-serving-memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|^# " "$OUT/dropout-serving-memcheck.log" | tail -4
exit $status
