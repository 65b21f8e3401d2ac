#!/usr/bin/env python3
"""Reads the TRACEB lines of an item-boundary trace build (bench/patches/trace-fp8-items.diff)
and prints, per traced kernel (tile keys, scale unit), the mean clocks of each phase of the fp8
stream's step from one work item to the next, over every consumer warp and boundary of block 0
(4th launch), beside the median period of a steady-loop step (its TRACE lines).

Usage: bench/trace_items.py LOG
Phases: fetch (the next item: its Q barrier, decode, first tile), scales (its Q/K/V scales),
kwait (its first K/V stage), issue (its first S and this item's last P.V), swait (wait for S),
soft (its first softmax), pvwait (wait for P.V), finish (this item's epilogue: O and LSE),
pack (its first P into registers).
"""
import collections
import statistics
import sys

PHASES = ["fetch", "scales", "kwait", "issue", "swait", "soft", "pvwait", "finish", "pack"]
bounds, steps = collections.defaultdict(list), collections.defaultdict(dict)
for line in open(sys.argv[1], errors="replace"):
    f = line.split()
    if not f or f[0] not in ("TRACE", "TRACEB"):
        continue
    d = dict(zip(f[1::2], f[2::2]))
    key = (int(d["BN"]), int(d["unit"]))
    if f[0] == "TRACEB":
        ph = {p: int(d[p]) for p in PHASES}
        if ph["fetch"] < 1 << 31:  # the last boundary of a block has no next item
            bounds[key].append(ph)
    else:
        steps[key].setdefault((d["cw"], d.get("w", "0")), []).append(int(d["t0"]))

print("| tile keys | scale unit | boundaries | " + " | ".join(PHASES) + " | extra over a step | step |")
print("|---" * (len(PHASES) + 5) + "|")
for key, rows in sorted(bounds.items()):
    mean = {p: round(sum(r[p] for r in rows) / len(rows)) for p in PHASES}
    periods = [statistics.median([b - a for a, b in zip(t, t[1:])]) for t in steps[key].values() if len(t) > 2]
    step = round(statistics.median(periods)) if periods else 0
    extra = sum(mean.values()) - step
    print(f"| {key[0]} | {key[1]} | {len(rows)} | " + " | ".join(str(mean[p]) for p in PHASES) + f" | {extra} | {step} |")
