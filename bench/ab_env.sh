#!/usr/bin/env bash
# Runs ON the GPU machine: one build's forward timings under several NVRTC option sets, alternated
# in one call (FLASH_NVRTC_EXTRA, e.g. "-Xptxas --register-usage-level=10", which flash appends
# to its fixed NVRTC options and hashes into the kernel cache key).
#   BIN=env  EXTRAS="default|-Xptxas --register-usage-level=0|..."  (|-separated; "default" = none)
#   LABELS="l5 l0 ..."  names in the table, one per option set; ROUNDS, TIME_ARGS, NAME as ab_multi.sh
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
read -r -a targs <<<"${TIME_ARGS:-}"
read -r -a labels <<<"${LABELS:?labels}"
IFS='|' read -r -a extras <<<"${EXTRAS:?option sets}"
name=${NAME:-fwd}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for i in "${!labels[@]}"; do
    e=${extras[$i]}
    [ "$e" = default ] && e=
    FLASH_NVRTC_EXTRA="$e" timeout "${TIME_TIMEOUT:-120}" ".carry/${BIN:-env}/flash-gpucheck" --no-check "${targs[@]}" \
      >"$OUT/$name-${labels[$i]}-$r.log" 2>&1 || echo "${labels[$i]} round $r: exit $?"
  done
done
python3 bench/ab_multi_table.py "$OUT" "$name" "${ROUNDS:-2}" "${labels[@]}" | tee "$OUT/$name-ab.md"
