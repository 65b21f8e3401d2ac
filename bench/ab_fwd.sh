#!/usr/bin/env bash
# Runs ON the GPU machine after bench/prepare.sh (and a copy of the previous build's
# flash-gpucheck at .carry/flash-gpucheck-old): the forward check of the new build on the
# examples named in CHECK (all when empty; extra flags in CHECK_ARGS, e.g. --fp8-only), then the forward timings of the old and the new
# build alternated (ROUNDS rounds, default 2; extra flags in TIME_ARGS, e.g. --fp8-only) and a
# table of old / new per timed row (best of each). NEW_ENV="VAR=1 ..." runs the new side (and the
# check) with those variables set; OLD_BIN names the old side's binary (default
# .carry/flash-gpucheck-old), so one build can be timed against itself under a switch.
# Exit status: 0 when the check passed.
set -uo pipefail
OUT=${OUT:-bench/results/out}
mkdir -p "$OUT"
status=0
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  echo "== forward check (new)"
  vars=()
  if [ -n "${CHECK:-}" ]; then
    cdir=$(mktemp -d)
    for v in $CHECK; do cp "examples/variants/$v.flash" "$cdir/"; done
    vars=(--variants "$cdir")
  fi
  read -r -a cargs <<<"${CHECK_ARGS:-}"
  env ${NEW_ENV:-} timeout "${CHECK_TIMEOUT:-200}" .carry/flash-gpucheck "${vars[@]}" "${cargs[@]}" --no-time >"$OUT/fwd-check.log" 2>&1 || status=1
  grep -E "^# |^FAIL" "$OUT/fwd-check.log" | tail -8
fi
read -r -a targs <<<"${TIME_ARGS:-}"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in old new; do
    bin=.carry/flash-gpucheck
    envs=${NEW_ENV:-}
    if [ "$v" = old ]; then bin=${OLD_BIN:-.carry/flash-gpucheck-old}; envs=; fi
    env $envs timeout "${TIME_TIMEOUT:-90}" "$bin" --no-check "${targs[@]}" >"$OUT/fwd-time-$v-$r.log" 2>&1
  done
done
python3 bench/ab_table.py "$OUT" fwd-time "${ROUNDS:-2}" "(?:fwd|fp8)" | tee "$OUT/fwd-ab.md"
exit $status
