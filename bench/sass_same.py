#!/usr/bin/env python3
"""Whether two CUDA sources compile to the same machine code (no GPU).

`bench/sass_same.py DIR_A DIR_B [NAME.cu ...]` compiles each NAME.cu of DIR_A and DIR_B
(default: every .cu in both) with NVRTC as flash does (sm_90a, C++17, each directory on the
include path for its dumped headers), disassembles the CUBINs with nvdisasm and compares the
instruction text (addresses and encodings dropped). For a change that rewrites a template's
text but should not change a kernel: dump both builds' sources with `FLASH_DUMP_DIR` (e.g.
through the NVRTC tests) and compare. Needs NVRTC in <repo>/.nvrtc (scripts/setup-nvrtc.sh) or
$FLASH_NVRTC_DIR, and nvdisasm as bench/sass_overlap.py finds it.
"""
import ctypes
import glob
import os
import subprocess
import sys
import tempfile

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_overlap import nvdisasm  # noqa: E402


def nvrtc():
    base = os.environ.get("FLASH_NVRTC_DIR", os.path.join(repo, ".nvrtc"))
    lib = glob.glob(os.path.join(base, "nvidia", "cu*", "lib"))
    if not lib:
        sys.exit(f"sass_same: no NVRTC under {base}; run scripts/setup-nvrtc.sh")
    ctypes.CDLL(glob.glob(os.path.join(lib[0], "libnvrtc-builtins.so.*"))[0], mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(glob.glob(os.path.join(lib[0], "libnvrtc.so.*"))[0])


def sass(nv, path):
    src = open(path, "rb").read()
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=sm_90a", b"-std=c++17", b"-default-device", b"--no-cache",
            ("-I" + os.path.dirname(os.path.abspath(path))).encode()]
    # Extra NVRTC options (e.g. `-Xptxas -O2`), whitespace-separated, as FLASH_NVRTC_EXTRA gives flash.
    opts += [o.encode() for o in os.environ.get("FLASH_NVRTC_EXTRA", "").split()]
    if nv.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)) != 0:
        n = ctypes.c_size_t()
        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        nv.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{path}: {log.value.decode()}")
    n = ctypes.c_size_t()
    nv.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    cubin = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetCUBIN(prog, cubin)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin.raw)
    out = subprocess.run([nvdisasm(), "-c", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    return [l.split("*/", 1)[1].strip() for l in out.splitlines() if "/*" in l and "*/" in l]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    a, b = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or sorted(
        set(os.path.basename(p) for p in glob.glob(os.path.join(a, "*.cu")))
        & set(os.path.basename(p) for p in glob.glob(os.path.join(b, "*.cu"))))
    nv = nvrtc()
    same = 0
    for name in names:
        pa, pb = os.path.join(a, name), os.path.join(b, name)
        if open(pa, "rb").read() == open(pb, "rb").read() or sass(nv, pa) == sass(nv, pb):
            same += 1
        else:
            print(f"DIFFERENT {name}")
    print(f"{same} of {len(names)} kernels: the same machine code")
    sys.exit(0 if same == len(names) else 1)


if __name__ == "__main__":
    main()
