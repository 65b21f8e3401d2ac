#!/usr/bin/env bash
# Here-side preparation for bench/gpu_check.sh: builds the release binaries and fills .carry/
# (git-ignored; name it in the device tool's `carry`) with them and bench/peers.py, which lives
# outside the repository and does not travel on its own.
# Usage: bench/prepare.sh [PEERS_PY]   (default ../shared/bench/peers.py, beside the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p flash-runtime --bins
target=${CARGO_TARGET_DIR:-target}
mkdir -p .carry
cp "$target/release/flash-gpucheck" "$target/release/flash" .carry/
cp "${1:-../shared/bench/peers.py}" .carry/peers.py
# Let the carried copy take its sequence lengths and modes from the environment (PEERS_SEQS=
# "1024,4096,16384", PEERS_MODES="fwd"), so one device call can time exactly the workloads the
# issue names next to flash; unset, it behaves as the original.
sed -i -e 's/^import argparse, json, math, sys$/import argparse, json, math, os, sys/' \
  -e 's/seqlens = \[\] if a.no_dense else /seqlens = [] if a.no_dense else [int(x) for x in os.environ["PEERS_SEQS"].split(",")] if os.environ.get("PEERS_SEQS") else /' \
  -e 's/for mode in ("fwd", "fwd_bwd"):/for mode in os.environ.get("PEERS_MODES", "fwd,fwd_bwd").split(","):/' \
  -e 's/for n in (\[4096\] if quick else \[4096, 16384\]):/for n in ([int(x) for x in os.environ["PEERS_VARIANT_SEQS"].split(",")] if os.environ.get("PEERS_VARIANT_SEQS") else [4096] if quick else [4096, 16384]):/' \
  .carry/peers.py
grep -c 'os.environ' .carry/peers.py
ls -la .carry/flash-gpucheck .carry/flash .carry/peers.py
