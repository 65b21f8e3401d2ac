#!/usr/bin/env bash
# Runs ON the GPU machine: alternates several builds' forward timings in one call, so a patch
# is judged against the committed kernels on the same warm GPU.
#   BINS="old a b"   builds under .carry/<name>/flash-gpucheck (the first is the reference)
#   ROUNDS=2         alternations (each round runs every build once, in turn)
#   TIME_ARGS=...    flash-gpucheck flags (e.g. "--fp8-only"); NAME=fp8 names the logs
# Writes $OUT/NAME-<bin>-<round>.log and prints bench/ab_multi_table.py's table.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
read -r -a targs <<<"${TIME_ARGS:-}"
read -r -a bins <<<"${BINS:-old new}"
name=${NAME:-fwd}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in "${bins[@]}"; do
    timeout "${TIME_TIMEOUT:-120}" ".carry/$v/flash-gpucheck" --no-check "${targs[@]}" >"$OUT/$name-$v-$r.log" 2>&1 ||
      echo "$v round $r: exit $?"
  done
done
python3 bench/ab_multi_table.py "$OUT" "$name" "${ROUNDS:-2}" "${bins[@]}" | tee "$OUT/$name-ab.md"
