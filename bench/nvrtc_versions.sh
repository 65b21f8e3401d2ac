#!/usr/bin/env bash
# Runs ON the GPU machine: the same flash-gpucheck build timed with its kernels compiled by
# two NVRTC versions, alternating, so a ptxas version's schedule is judged in one call.
#   BIN=old                    .carry/$BIN/flash-gpucheck
#   NVRTC_TARS="nvrtc133.tar.xz"  tarballs under .carry/ holding libnvrtc.so.13 and its
#                              libnvrtc-builtins.so.13.N (xz); "system" = the machine's own NVRTC
#   ROUNDS=2  TIME_ARGS=--fp8-only  NAME=fp8  (as bench/ab_multi.sh)
# The kernel cache is keyed on NVRTC's version, so each version compiles its own cubins.
# Writes $OUT/NAME-<label>-<round>.log and prints bench/ab_multi_table.py's table.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
read -r -a targs <<<"${TIME_ARGS:-}"
labels=(system)
for t in ${NVRTC_TARS:-}; do
  l=${t%.tar.xz}
  mkdir -p "/tmp/$l" && tar -xJf ".carry/$t" -C "/tmp/$l" || { echo "cannot unpack $t"; exit 1; }
  labels+=("$l")
done
name=${NAME:-fp8}
for l in "${labels[@]}"; do  # which NVRTC each label loads, by its own nvrtcVersion
  lib=/tmp/$l/libnvrtc.so.13; [ "$l" = system ] && lib=libnvrtc.so.13
  python3 -c "import ctypes,sys; n=ctypes.CDLL(sys.argv[1]); a,b=ctypes.c_int(),ctypes.c_int(); n.nvrtcVersion(ctypes.byref(a),ctypes.byref(b)); print(sys.argv[2], 'NVRTC', a.value, b.value)" "$lib" "$l" | tee -a "$OUT/$name-versions.txt"
done
for r in $(seq 1 "${ROUNDS:-2}"); do
  for l in "${labels[@]}"; do
    if [ "$l" = system ]; then
      env -u FLASH_NVRTC_PATH timeout "${TIME_TIMEOUT:-150}" ".carry/${BIN:-old}/flash-gpucheck" --no-check "${targs[@]}" \
        >"$OUT/$name-$l-$r.log" 2>&1 || echo "$l round $r: exit $?"
    else
      FLASH_NVRTC_PATH="/tmp/$l/libnvrtc.so.13" LD_LIBRARY_PATH="/tmp/$l:${LD_LIBRARY_PATH:-}" \
        timeout "${TIME_TIMEOUT:-150}" ".carry/${BIN:-old}/flash-gpucheck" --no-check "${targs[@]}" \
        >"$OUT/$name-$l-$r.log" 2>&1 || echo "$l round $r: exit $?"
    fi
  done
done
python3 bench/ab_multi_table.py "$OUT" "$name" "${ROUNDS:-2}" "${labels[@]}" | tee "$OUT/$name-ab.md"
