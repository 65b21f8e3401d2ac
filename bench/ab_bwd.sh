#!/usr/bin/env bash
# Runs ON the GPU machine after bench/prepare.sh (and a copy of the previous build's
# flash-gpucheck at .carry/flash-gpucheck-old): the backward check of the new build on every
# example, memcheck of its backward on small shapes, then the backward timings of the old and
# the new build alternated (two rounds each) and a table of new / old per timed row.
# At most 8 files come back from $OUT. Exit status: 0 when the check passed.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
status=0
echo "== backward check (new)"
# CHECK="causal sliding_window" checks those examples only (every example takes longer than a
# device call leaves beside the timings).
vars=()
if [ -n "${CHECK:-}" ]; then
  cdir=$(mktemp -d)
  for v in $CHECK; do cp "examples/variants/$v.flash" "$cdir/"; done
  vars=(--variants "$cdir")
fi
timeout "${CHECK_TIMEOUT:-270}" .carry/flash-gpucheck "${vars[@]}" --backward-only --no-time >"$OUT/bwd-check.log" 2>&1 || status=1
grep -E "^# |^FAIL" "$OUT/bwd-check.log" | tail -8
echo "== memcheck (new, small shapes)"
dir=$(mktemp -d)
cp examples/variants/{causal,alibi,sliding_window}.flash "$dir/"
timeout 100 compute-sanitizer --tool memcheck --print-limit 20 .carry/flash-gpucheck --variants "$dir" --backward-only --small --no-time \
  >"$OUT/bwd-memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|^# " "$OUT/bwd-memcheck.log" | tail -4
for r in 1 2; do
  for v in old new; do
    bin=.carry/flash-gpucheck
    [ "$v" = old ] && bin=.carry/flash-gpucheck-old
    timeout 75 "$bin" --backward-only --no-check >"$OUT/bwd-time-$v-$r.log" 2>&1
  done
done
python3 bench/ab_table.py "$OUT" bwd-time 2 bwd | tee "$OUT/bwd-ab.md"
exit $status
