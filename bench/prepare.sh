#!/usr/bin/env bash
# Here-side preparation for bench/gpu_check.sh: builds the release binaries and fills .carry/
# (git-ignored; name it in the device tool's `carry`) with them and bench/peers.py, which lives
# outside the repository and does not travel on its own.
# Usage: bench/prepare.sh [PEERS_PY]   (default /work/shared/bench/peers.py)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p flash-runtime --bins
target=${CARGO_TARGET_DIR:-target}
mkdir -p .carry
cp "$target/release/flash-gpucheck" "$target/release/flash" .carry/
cp "${1:-/work/shared/bench/peers.py}" .carry/peers.py
ls -la .carry/flash-gpucheck .carry/flash .carry/peers.py
