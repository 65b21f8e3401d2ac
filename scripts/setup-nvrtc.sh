#!/usr/bin/env bash
# Installs NVRTC 13.0 from its PyPI wheel into <repo>/.nvrtc (or $FLASH_NVRTC_DIR) and prints the
# library folder. Idempotent: an existing install of the pinned version is reused.
#
# Why 13.0.x: the GPU machines run driver 580, which refuses the PTX ISA that NVRTC >= 13.5 emits.
set -euo pipefail

version="13.0.88"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${FLASH_NVRTC_DIR:-$repo/.nvrtc}"
lib="$dir/nvidia/cu13/lib"
stamp="$dir/.flash-nvrtc-$version"

if [[ -f "$stamp" && -e "$lib/libnvrtc.so.13" && -e "$lib/libnvrtc-builtins.so.13.0" ]]; then
    echo "$lib"
    exit 0
fi

py="${PYTHON:-python3}"
if ! command -v "$py" >/dev/null 2>&1; then
    echo "setup-nvrtc: error: $py not found; install python3 with pip, or point FLASH_NVRTC_PATH at libnvrtc.so" >&2
    exit 1
fi

echo "setup-nvrtc: installing nvidia-cuda-nvrtc==$version into $dir" >&2
if ! "$py" -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
        --target "$dir" "nvidia-cuda-nvrtc==$version" >&2; then
    echo "setup-nvrtc: error: pip could not install nvidia-cuda-nvrtc==$version into $dir" >&2
    exit 1
fi

for f in libnvrtc.so.13 libnvrtc-builtins.so.13.0; do
    if [[ ! -e "$lib/$f" ]]; then
        echo "setup-nvrtc: error: the wheel installed, but $lib/$f is missing; found:" >&2
        ls -la "$lib" >&2 || true
        exit 1
    fi
done
touch "$stamp"
echo "$lib"
