#!/usr/bin/env python3
"""Where a wgmma kernel's waits and exponentials sit in each stretch of its loop (no GPU).

`bench/sass_steady.py A.cu [B.cu ...]` compiles each dumped kernel source with NVRTC as flash
does (`sass_same.sass`), cuts its machine code at the groups of wgmma instructions (QGMMA for
fp8, HGMMA for bf16; a group is a run of them less than 40 instructions apart) and prints, for
each stretch between two groups after the first, the offsets (from the group that opens it) of
its wgmma issues, its `WARPGROUP.DEPBAR` waits, its mbarrier operations (`SYNCS`), the span and
count of its exponentials (`MUFU.EX2`), e4m3 packs (`F2FP`), row maxima (`FMNMX`), shuffles and
`FMUL`s. The fp8 stream's steady step is the first such stretch (later ones hold the item
boundary and its epilogue).

Why: the same kernel text around an unchanged loop has run 4-8 % apart on an H200 because ptxas
ordered the loop differently (`bench/results/fp8-steady-schedules-2026-11-28.md`); this names
how two builds' loops differ, e.g. whether the wait for P·V comes before or after the
exponentials. Sources come from `FLASH_DUMP_DIR=DIR flash compile FILE --no-cache`.

`bench/sass_steady.py --waits A.cu [B.cu ...]` prints one line a kernel instead: for the loop's
first two stretches (the stream's two steps when it keeps two P register sets), where its last
wait (the one for P·V) sits against its exponentials — `before`, `inside` or `after` — with the
offsets. Over the builds timed on 2026-11-29 the fastest dense 192-key kernel waited `before`
in step 1 and `inside` in step 2 (`results/history/2026-11-29-fp8-boundary-decode-attempt/`);
that pattern did not hold up: on the same day candidate 22 and ptxas's register usage level 0
kept those positions and ran 6-10 % slower (`results/history/2026-11-29-fp8-patches-22-23-25-timed/`),
so this describes a loop; it does not predict its speed.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_same import nvrtc, sass  # noqa: E402

KINDS = {
    "mma": ("QGMMA", "HGMMA"),
    "wait": ("WARPGROUP.DEPBAR",),
    "mbar": ("SYNCS",),
    "ex2": ("MUFU.EX2",),
    "pack": ("F2FP",),
    "max": ("FMNMX",),
    "shfl": ("SHFL",),
    "fmul": ("FMUL",),
}


def opcode(line):
    words = re.sub(r"^@!?U?P\w+\s+", "", line).split()
    return words[0].rstrip(";") if words else ""


def groups(ops):
    """Runs of wgmma instructions less than 40 apart: [(first index, count)]."""
    out = []
    for i, op in enumerate(ops):
        if op.startswith(KINDS["mma"]):
            if out and i - out[-1][-1] < 40:
                out[-1].append(i)
            else:
                out.append([i])
    return out


def positions(ops, start, end):
    """Offsets (from `start`) of each kind's instructions in ops[start:end]."""
    seg = ops[start:end]
    return {k: [i for i, op in enumerate(seg) if op.startswith(p)] for k, p in KINDS.items()}


def describe(ops, start, end):
    seg = ops[start:end]
    at = positions(ops, start, end)

    def span(k):
        v = at[k]
        return f"{v[0]}-{v[-1]} ({len(v)})" if v else "-"

    return (f"{len(seg)} instructions; mma at {at['mma']}; wait at {at['wait']}; mbarrier at "
            f"{at['mbar']}; ex2 {span('ex2')}; pack {span('pack')}; max {span('max')}; "
            f"shfl {len(at['shfl'])}; fmul {len(at['fmul'])}")


def placement(ops, start, end):
    """Where the stretch's last wait sits against its exponentials."""
    at = positions(ops, start, end)
    waits, ex2 = at["wait"], at["ex2"]
    if not waits or not ex2:
        return "no wait or no exponentials"
    w = waits[-1]
    where = "before" if w < ex2[0] else "after" if w > ex2[-1] else "inside"
    return f"{where} (wait {w}, ex2 {ex2[0]}-{ex2[-1]})"


def main():
    args = sys.argv[1:]
    waits_only = bool(args) and args[0] == "--waits"
    if waits_only:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    nv = nvrtc()
    for path in args:
        ops = [opcode(line) for line in sass(nv, path)]
        g = groups(ops)
        if waits_only:
            steps = [placement(ops, g[k][0], g[k + 1][0]) for k in (1, 2) if k + 1 < len(g)]
            print(f"{os.path.basename(path)}: " + "; ".join(f"step {k + 1} {p}" for k, p in enumerate(steps)))
            continue
        print(f"== {path}: wgmma groups {[(x[0], len(x)) for x in g]}")
        for k in range(1, len(g) - 1):
            print(f"  stretch {k}: {describe(ops, g[k][0], g[k + 1][0])}")


if __name__ == "__main__":
    main()
