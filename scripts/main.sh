#!/usr/bin/env bash
# The project's main command (README "The two commands"): install NVRTC, build `flash`, then
# generate and compile every example variant with NVRTC for sm_80 and sm_90a, printing
# registers, shared memory and spills.
#   - Without a GPU it stops there and says plainly that no GPU was found.
#   - With a GPU it also builds and runs `flash-gpucheck`: every example variant is run on the
#     GPU and verified against the float64 CPU reference, then timed (TFLOP/s).
# Exit status: 0 when every kernel compiled and, with a GPU, every check passed.
# Knobs: FLASH_GEN_DIR (where the generated .cu files go, default target/flash-gen),
#        GPUCHECK_ARGS (extra flash-gpucheck arguments, e.g. "--no-time" or "--small").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "==> NVRTC"
scripts/setup-nvrtc.sh

echo "==> cargo build --release -p flash-runtime --bin flash"
cargo build --release -p flash-runtime --bin flash
target="${CARGO_TARGET_DIR:-target}"
flash="$target/release/flash"

echo "==> environment"
info="$("$flash" info)"
echo "$info"

status=0
gen_dir="${FLASH_GEN_DIR:-$target/flash-gen}"
for f in examples/variants/*.flash; do
    echo
    echo "==> $f"
    for family in sm80 sm90 sm90ws; do
        "$flash" gen "$f" --family "$family" --out "$gen_dir" >/dev/null || status=1
    done
    "$flash" compile "$f" --arch sm_80,sm_90a || status=1
done
echo
echo "generated CUDA (sm80, sm90 and sm90ws families, with their headers): $gen_dir"

if [[ "$info" == *"no GPU found"* ]]; then
    echo
    echo "no GPU found: the kernels were generated and compiled, not run."
    [[ "$status" -eq 0 ]] || echo "main: some kernels failed to compile (see above)" >&2
    exit "$status"
fi

echo
echo "==> GPU found: cargo build --release --bin flash-gpucheck"
cargo build --release -p flash-runtime --bin flash-gpucheck
echo "==> flash-gpucheck ${GPUCHECK_ARGS:-} (correctness against the reference, then timing)"
# One "ok ..." line per checked case is left out; failures, the summaries and the timings stay.
# shellcheck disable=SC2086
set +e
"$target/release/flash-gpucheck" ${GPUCHECK_ARGS:-} | grep -v '^ok '
check=${PIPESTATUS[0]}
set -e
if [[ "$check" -ne 0 ]]; then
    echo "main: flash-gpucheck FAILED" >&2
    status=1
fi
[[ "$status" -eq 0 ]] && echo "main: every kernel compiled, ran and matched the reference"
exit "$status"
