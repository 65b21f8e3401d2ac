#!/usr/bin/env bash
# Runs ON the GPU machine: alternates several builds' forward timings in one call, so a patch
# is judged against the committed kernels on the same warm GPU.
#   BINS="old a b"   builds under .carry/<name>/flash-gpucheck (the first is the reference)
#   ROUNDS=2         alternations (each round runs every build once, in turn)
#   TIME_ARGS=...    flash-gpucheck flags (e.g. "--fp8-only"); NAME=fp8 names the logs
#   EXTRAS="default|-Xptxas --register-usage-level=0"  instead of several builds, one build
#                    (.carry/$BIN/, BIN=old) under several NVRTC option sets (FLASH_NVRTC_EXTRA,
#                    which flash keys its kernel cache on; |-separated, "default" = none), BINS
#                    naming them in the same order
# Writes $OUT/NAME-<bin>-<round>.log and prints bench/ab_multi_table.py's table.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
read -r -a targs <<<"${TIME_ARGS:-}"
read -r -a bins <<<"${BINS:-old new}"
[ -n "${EXTRAS:-}" ] && IFS='|' read -r -a extras <<<"$EXTRAS"
name=${NAME:-fwd}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for i in "${!bins[@]}"; do
    v=${bins[$i]} bin=${bins[$i]} e=${FLASH_NVRTC_EXTRA:-}
    if [ -n "${EXTRAS:-}" ]; then
      bin=${BIN:-old} e=${extras[$i]}
      [ "$e" = default ] && e=
    fi
    FLASH_NVRTC_EXTRA="$e" timeout "${TIME_TIMEOUT:-120}" ".carry/$bin/flash-gpucheck" --no-check "${targs[@]}" \
      >"$OUT/$name-$v-$r.log" 2>&1 || echo "$v round $r: exit $?"
  done
done
python3 bench/ab_multi_table.py "$OUT" "$name" "${ROUNDS:-2}" "${bins[@]}" | tee "$OUT/$name-ab.md"
