#!/usr/bin/env python3
"""Reads the TRACE lines of a trace build (bench/patches/trace-fp8-stream.diff) and prints, per
traced kernel, the median clocks of each phase of the fp8 stream's steady loop for each consumer
warp, the period of an iteration, how much of one warpgroup's softmax overlaps the other's, and
how far apart the four warps of a warpgroup arrive at and leave the products' issue.

Usage: bench/trace_table.py LOG
Phases (clock stamps of lane 0 of each consumer warp of block 0, 4th launch; older logs have
warp 0 of each warpgroup only, without `w`): kwait (wait for the K/V stage), issue (S and P.V
issued), swait (wait for S), soft (the softmax, with P's packing where P has two register sets),
pvwait (wait for P.V), and the rest up to the next iteration (O rescale, P packing otherwise).
The turns trace (bench/patches/trace-fp8-turns.diff: the exponentials in turns between the two
warpgroups) adds `max` (S ready to both rows' maxima done), `turnwait` (waiting for the turn) and
`exps` (the turn's exponentials); the table then gives their medians and how much of an
iteration warp 0 of either warpgroup spends in its exponentials (their union over the period:
the exp2 unit's share of the time if the two never overlap).
"""
import re
import statistics
import sys

pat = re.compile(r"TRACE BN (\d+) unit (\d+) cw (\d)(?: w (\d))? it (\d+) t0 (\d+) kwait (\d+) "
                 r"issue (\d+) swait (\d+) soft (\d+) pvwait (\d+)(?: max (\d+) turnwait (\d+) exps (\d+))?")
kernels, cur = [], None
for line in open(sys.argv[1], errors="replace"):
    m = pat.search(line)
    if not m:
        continue
    bn, unit, cw, w, it, t0, *ph = m.groups()
    bn, unit, cw, w, it, t0 = int(bn), int(unit), int(cw), int(w or 0), int(it), int(t0)
    turns = tuple(map(int, ph[5:])) if ph[5] is not None else None
    ph = list(map(int, ph[:5]))
    if cw == 0 and w == 0 and it == 0:
        cur = {"bn": bn, "unit": unit, "rows": {}, "turns": {}}
        kernels.append(cur)
    cur["rows"].setdefault((cw, w), []).append((t0, ph))
    if turns is not None:
        cur["turns"].setdefault((cw, w), []).append(turns)


def sd(a, b):
    """b - a on the 32-bit clock."""
    d = (b - a) & 0xFFFFFFFF
    return d - (1 << 32) if d >= 1 << 31 else d


def med(xs):
    return int(statistics.median(xs)) if xs else 0


for k in kernels:
    rows = k["rows"]
    base = rows[(0, 0)][0][0]
    print(f"## BN {k['bn']} scale unit {k['unit']}: iterations "
          + " / ".join(str(len(v)) for v in rows.values()))
    print("| cw | warp | kwait | issue | swait | soft | pvwait | rest | period |")
    print("|---|---|---|---|---|---|---|---|---|")
    soft_iv = {0: [], 1: []}
    for (cw, w), r in sorted(rows.items()):
        cols = list(zip(*[ph for _, ph in r]))
        per = [sd(r[i][0], r[i + 1][0]) for i in range(len(r) - 1)]
        rest = [per[i] - sum(r[i][1]) for i in range(len(per))]
        print(f"| {cw} | {w} | " + " | ".join(str(med(c)) for c in cols)
              + f" | {med(rest)} | {med(per)} |")
        if w == 0:
            for t0, (kw, iss, sw, so, pv) in r:
                s0 = sd(base, t0) + kw + iss + sw
                soft_iv[cw].append((s0, s0 + so))
    tot = sum(b - a for a, b in soft_iv[0])
    ov = sum(max(0, min(b, d) - max(a, c)) for a, b in soft_iv[0] for c, d in soft_iv[1])
    if tot:
        print(f"warpgroup 0's softmax overlapping warpgroup 1's: {100 * ov / tot:.0f} % of {tot} clocks")
    if k["turns"]:
        # Exponential intervals of warp 0 of each warpgroup: S ready + max + turnwait, for exps.
        exp_iv = []
        for cw in (0, 1):
            for (t0, (kw, iss, sw, _, _)), (mx, tw, ex) in zip(rows[(cw, 0)], k["turns"][(cw, 0)]):
                e0 = sd(base, t0) + kw + iss + sw + mx + tw
                exp_iv.append((e0, e0 + ex))
        exp_iv.sort()
        union, end = 0, None
        for a, b in exp_iv:
            if end is None or a > end:
                union += b - a
                end = b
            elif b > end:
                union += b - end
                end = b
        span = max(b for _, b in exp_iv) - exp_iv[0][0]
        for (cw, w), tr in sorted(k["turns"].items()):
            mx, tw, ex = zip(*tr)
            print(f"warpgroup {cw} warp {w}: max {med(mx)}, turn wait {med(tw)}, exponentials {med(ex)} (medians)")
        print(f"warp 0 of either warpgroup in its exponentials: {100 * union / span:.0f} % of {span} clocks")
    for cw in (0, 1):
        ws = [rows[(cw, w)] for w in range(4) if (cw, w) in rows]
        if len(ws) < 4:
            continue
        n = min(len(x) for x in ws)

        def spread(i, phases):
            """Spread over the four warps of iteration i's clock after its first `phases` phases."""
            at = [sd(base, x[i][0]) + sum(x[i][1][:phases]) for x in ws]
            return max(at) - min(at)

        arrive = [spread(i, 1) for i in range(n)]
        leave = [spread(i, 2) for i in range(n)]
        print(f"warpgroup {cw}: its four warps reach the issue {med(arrive)} clocks apart (median), "
              f"leave it {med(leave)} apart")
    print()
