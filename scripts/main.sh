#!/usr/bin/env bash
# The project's main command (README "Quick start"): build `flash`, then generate and compile
# every example variant with NVRTC for sm_80 and sm_90a, printing registers, shared memory and
# spills. Works without a GPU; says so plainly when there is none.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "==> NVRTC"
scripts/setup-nvrtc.sh

echo "==> cargo build --release"
cargo build --release
flash="${CARGO_TARGET_DIR:-target}/release/flash"

echo "==> environment"
info="$("$flash" info)"
echo "$info"

status=0
for f in examples/variants/*.flash; do
    echo
    echo "==> $f"
    "$flash" gen "$f" --out "${FLASH_GEN_DIR:-target/flash-gen}" >/dev/null || status=1
    "$flash" compile "$f" --arch sm_80,sm_90a || status=1
done

echo
if [[ "$info" == *"no GPU found"* ]]; then
    echo "no GPU found: kernels were generated and compiled, not run."
fi
exit "$status"
