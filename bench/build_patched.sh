#!/usr/bin/env bash
# Here-side (no GPU): builds release flash-gpucheck binaries of the committed tree with candidate
# patches applied, for bench/ab_multi.sh to alternate on the GPU in one call.
#   bench/build_patched.sh old= a=bench/patches/A.diff b=bench/patches/B.diff
# builds .carry/old/ (no patch) and .carry/a/ (both patches), each in a scratch worktree of HEAD
# (the checkout is left alone; uncommitted changes are not included). Copies bench/peers.py's
# source beside them as .carry/peers.py when ../shared/bench/peers.py exists.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
target=${CARGO_TARGET_DIR:-$root/target}/patched
mkdir -p .carry
for spec in "$@"; do
  name=${spec%%=*}
  patches=${spec#*=}
  wt=$(mktemp -d)
  git worktree add -q --detach "$wt" HEAD
  (
    cd "$wt"
    IFS=, read -r -a list <<<"$patches"
    for p in "${list[@]}"; do
      [ -n "$p" ] && git apply "$root/$p"
    done
    CARGO_TARGET_DIR="$target" cargo build -q --release -p flash-runtime --bin flash-gpucheck
  )
  mkdir -p ".carry/$name"
  cp "$target/release/flash-gpucheck" ".carry/$name/"
  git worktree remove --force "$wt"
  echo "built .carry/$name/flash-gpucheck (${patches:-no patch})"
done
if [ -f ../shared/bench/peers.py ]; then cp ../shared/bench/peers.py .carry/peers.py; fi
