#!/usr/bin/env python3
"""Reads the TRACE lines of a trace build (bench/patches/trace-fp8-stream.diff) and prints, per
traced kernel, the median clocks of each phase of the fp8 stream's steady loop for each consumer
warpgroup, the period of an iteration, and how much of one warpgroup's softmax overlaps the
other's.

Usage: bench/trace_table.py LOG
Phases (clock stamps of warp 0 of each consumer warpgroup of block 0, 4th launch):
kwait (wait for the K/V stage), issue (S and P.V issued), swait (wait for S), soft (the
softmax), pvwait (wait for P.V), and the rest up to the next iteration (O rescale, P packing).
"""
import re
import statistics
import sys

pat = re.compile(r"TRACE BN (\d+) unit (\d+) cw (\d) it (\d+) t0 (\d+) kwait (\d+) issue (\d+) swait (\d+) soft (\d+) pvwait (\d+)")
kernels, cur = [], None
for line in open(sys.argv[1], errors="replace"):
    m = pat.search(line)
    if not m:
        continue
    bn, unit, cw, it, t0, *ph = map(int, m.groups())
    if cw == 0 and it == 0:
        cur = {"bn": bn, "unit": unit, 0: [], 1: []}
        kernels.append(cur)
    cur[cw].append((t0, ph))


def sd(a, b):
    """b - a on the 32-bit clock."""
    d = (b - a) & 0xFFFFFFFF
    return d - (1 << 32) if d >= 1 << 31 else d


for k in kernels:
    print(f"## BN {k['bn']} scale unit {k['unit']}: iterations {len(k[0])} / {len(k[1])}")
    print("| cw | kwait | issue | swait | soft | pvwait | rest | period |")
    print("|---|---|---|---|---|---|---|---|")
    soft_iv = {}
    for cw in (0, 1):
        rows = k[cw]
        cols = list(zip(*[ph for _, ph in rows])) if rows else []
        per = [sd(rows[i][0], rows[i + 1][0]) for i in range(len(rows) - 1)]
        rest = [per[i] - sum(rows[i][1]) for i in range(len(per))]
        med = lambda xs: int(statistics.median(xs)) if xs else 0
        print(f"| {cw} | " + " | ".join(str(med(c)) for c in cols) + f" | {med(rest)} | {med(per)} |")
        base = k[0][0][0] if k[0] else 0
        soft_iv[cw] = []
        for t0, (kw, iss, sw, so, pv) in rows:
            s0 = sd(base, t0) + kw + iss + sw
            soft_iv[cw].append((s0, s0 + so))
    tot = sum(b - a for a, b in soft_iv[0])
    ov = 0
    for a, b in soft_iv[0]:
        for c, d in soft_iv[1]:
            ov += max(0, min(b, d) - max(a, c))
    if tot:
        print(f"warpgroup 0's softmax overlapping warpgroup 1's: {100 * ov / tot:.0f} % of {tot} clocks")
    print()
