#!/usr/bin/env python3
"""Table of several builds' timings from alternated runs (bench/ab_multi.sh).

`ab_multi_table.py OUT NAME ROUNDS BIN...` reads OUT/NAME-BIN-{1..ROUNDS}.log, takes every line
ending in `<ms> ms <rate> TFLOP/s` or `<ms> ms <rate> GB/s` (the forward's and the quantiser's
timings; the text before it keys the row) and prints one markdown row per workload: each
build's best rate over the rounds, its spread, and its ratio to the first build's best.
"""
import collections
import re
import sys

out, name, rounds, bins = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
line = re.compile(r"^(.*?)\s+([0-9.]+) ms\s+([0-9.]+) (TFLOP/s|GB/s)")
rows = collections.OrderedDict()
for b in bins:
    for r in range(1, rounds + 1):
        try:
            lines = open(f"{out}/{name}-{b}-{r}.log").read().splitlines()
        except OSError:
            continue
        for l in lines:
            m = line.match(l)
            if m:
                key = re.sub(r"\s+flash$", "", m.group(1).strip())
                rows.setdefault(key, collections.defaultdict(list))[b].append(float(m.group(3)))
head = " | ".join(f"{b} rate (best; runs)" for b in bins)
ratios = " | ".join(f"{b} / {bins[0]}" for b in bins[1:])
print(f"| row | {head} | {ratios} |")
print("|---|" + "---|" * (2 * len(bins) - 1))
for k, d in rows.items():
    if not all(d[b] for b in bins):
        continue
    best = {b: max(d[b]) for b in bins}
    cells = " | ".join(f"{best[b]:.1f} ({' '.join(f'{x:.0f}' for x in d[b])})" for b in bins)
    rel = " | ".join(f"{best[b] / best[bins[0]]:.3f}" for b in bins[1:])
    print(f"| {k} | {cells} | {rel} |")
