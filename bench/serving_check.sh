#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root, after bench/prepare.sh filled .carry/ here:
# the serving kernels (packed batches, chunked prefill, split-KV decode on contiguous and paged
# caches) of the named example variants, with the forward check they sit in, and memcheck of the
# packed and chunked kernels on small shapes. Dropout variants are served at p = 0.
# Usage: bench/serving_check.sh NAME...   (file stems under examples/variants, e.g. bigbird dropout)
# At most 8 files come back from $OUT. Exit status: 0 when every check passed.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
BIN=.carry/flash-gpucheck
dir=$(mktemp -d)
for name in "$@"; do cp "examples/variants/$name.flash" "$dir/"; done
tag=$(IFS=-; echo "$*")
status=0
echo "== packed and chunked"
timeout 150 "$BIN" --variants "$dir" --varlen-only --no-time >"$OUT/serving-$tag-varlen.log" 2>&1 || status=1
grep -E "^# |^FAIL" "$OUT/serving-$tag-varlen.log" | tail -8
echo "== forward check with split-KV and paged decode"
timeout 240 "$BIN" --variants "$dir" --no-time >"$OUT/serving-$tag-check.log" 2>&1 || status=1
grep -E "^# |^FAIL" "$OUT/serving-$tag-check.log" | tail -8
echo "== memcheck"
timeout 150 compute-sanitizer --tool memcheck --print-limit 20 "$BIN" --variants "$dir" --varlen-only --small --no-time \
  >"$OUT/serving-$tag-memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|^# " "$OUT/serving-$tag-memcheck.log" | tail -4
exit $status
