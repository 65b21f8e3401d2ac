#!/usr/bin/env bash
# Runs ON the GPU machine after bench/prepare.sh: the backward check of the variants with
# parameter gradients (each case run with the gradients and again frozen, without them), its
# memcheck on small shapes, and the `flash run` smoke test (a frozen ALiBi case included).
# At most 8 files come back from $OUT. Exit status: 0 when every check passed.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
dir=$(mktemp -d)
cp examples/variants/{alibi,relative_bias,softcap}.flash "$dir/"
status=0
echo "== backward check, parameter gradients and frozen"
timeout 200 .carry/flash-gpucheck --variants "$dir" --backward-only --no-time >"$OUT/bwd-frozen-check.log" 2>&1 || status=1
grep -E "^# |^FAIL" "$OUT/bwd-frozen-check.log" | tail -8
echo "== memcheck"
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 .carry/flash-gpucheck --variants "$dir" --backward-only --small --no-time \
  >"$OUT/bwd-frozen-memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|^# " "$OUT/bwd-frozen-memcheck.log" | tail -4
echo "== flash run smoke"
timeout 150 python3 bench/run_smoke.py .carry/flash >"$OUT/smoke.log" 2>&1 || status=1
grep -E "^# |FAIL|frozen" "$OUT/smoke.log" | tail -6
exit $status
