#!/usr/bin/env bash
# The project's test command (README "Testing"; CI runs exactly this through .ci/run).
# Installs NVRTC from its wheel, then formatting, lints and every test, with NVRTC-dependent
# tests required to run (they fail instead of skipping when NVRTC is missing).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "==> NVRTC"
scripts/setup-nvrtc.sh

export FLASH_REQUIRE_NVRTC=1
# Keep tests off the user's cache folder.
export FLASH_CACHE_DIR="${FLASH_CACHE_DIR:-$(mktemp -d)}"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "==> cargo doc (rustdoc warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

echo "==> NVRTC compile of every example variant, forward and backward (registers, shared memory, spills)"
cargo test -p flash-runtime --test examples_nvrtc --test backward_nvrtc -- --nocapture

echo "==> fuzzing (seeded, bounded): declarations through parse/validate/plan/emit/NVRTC with tile classification against the CPU evaluator; bytes into the .flash parser and the .npy reader"
cargo test -p flash-runtime --test fuzz -- --nocapture

echo "==> packages: each crate packaged and verified alone; a scratch crate on them compiles its kernels"
scripts/check-packages.sh

echo "==> cargo test (unit, integration and doc tests; the Doc-tests lines count the latter)"
cargo test --workspace --no-fail-fast -- --skip every_example_variant_compiles_without_spills \
  --skip every_backward_kernel_compiles_within_the_spill_bound --skip fuzz_
