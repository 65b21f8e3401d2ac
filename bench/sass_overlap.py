#!/usr/bin/env python3
"""Where the softmax's exponentials sit against the wgmma waits, read from the SASS (no GPU).

The overlapped schedules issue Q·Kᵀ of tile j + 1 and P·V of tile j, wait for S
(`WARPGROUP.DEPBAR.LE gsb0, 0x1`), run the softmax, then wait for P·V (`... 0x0`): the softmax
overlaps P·V only if ptxas leaves the exponentials (`MUFU.EX2`) between the two waits. ptxas
places a wait as early as its basic block allows, and has moved it above the exponentials
before (see `bench/results/ab-fp8-step-late/`). This prints, for each kernel of the
declarations compiled, the number of MUFU.EX2 between each pair of consecutive waits, in code
order: in a steady loop the pair `0x1->0x0` should hold a tile's exponentials.

Usage: bench/sass_overlap.py FILE.flash [--name NAME] [--tile BMxBNxWxS]
Needs the `flash` binary (target/release/flash, or $FLASH_BIN), NVRTC (as `flash compile`
does) and nvdisasm: $NVDISASM, else one installed from the `nvidia-cuda-nvdisasm` wheel into
<repo>/.nvdisasm (`python3 -m pip install --target .nvdisasm nvidia-cuda-nvdisasm`).
"""
import glob
import os
import subprocess
import sys
import tempfile

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def nvdisasm():
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    found = glob.glob(os.path.join(repo, ".nvdisasm", "nvidia", "cu*", "bin", "nvdisasm"))
    if not found:
        sys.exit("sass_overlap: no nvdisasm; set NVDISASM or "
                 "`python3 -m pip install --target .nvdisasm nvidia-cuda-nvdisasm`")
    return found[0]


def waits_and_exps(sass):
    """[(wait, next wait, MUFU.EX2 between)] in code order."""
    lines = sass.split("\n")
    dep = [i for i, l in enumerate(lines) if "WARPGROUP.DEPBAR" in l]
    arg = lambda l: l.split("gsb0,")[1].split(";")[0].strip()
    return [(arg(lines[a]), arg(lines[b]), sum("MUFU.EX2" in l for l in lines[a:b]))
            for a, b in zip(dep, dep[1:])]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    flash = os.environ.get("FLASH_BIN", os.path.join(repo, "target", "release", "flash"))
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([flash, "compile", *sys.argv[1:], "--cache-dir", cache, "--json"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(out.stderr or out.stdout)
        for entry in sorted(glob.glob(os.path.join(cache, "v*", "*.fkc"))):
            data = open(entry, "rb").read()
            elf = data.find(b"\x7fELF")
            # The entry's JSON metadata names the kernel before the CUBIN.
            name = data[:elf].split(b'"kernel_name":"')[1].split(b'"')[0].decode()
            cubin = os.path.join(cache, "k.cubin")
            open(cubin, "wb").write(data[elf:])
            sass = subprocess.run([nvdisasm(), "-c", cubin], capture_output=True,
                                  text=True, check=True).stdout
            pairs = " ".join(f"{a}->{b}:{n}" for a, b, n in waits_and_exps(sass))
            print(f"{name}: {pairs}")


if __name__ == "__main__":
    main()
