#!/usr/bin/env python3
"""Table of old / new timings from alternated runs: `ab_table.py OUT STEM ROUNDS REGEX`.

Reads OUT/STEM-{old,new}-{1..ROUNDS}.log, takes every line whose start matches REGEX followed
by `<ms> ms <tf> TFLOP/s`, and prints one markdown row per workload with both sides' runs and
old / new of the best of each (bench/ab_fwd.sh, bench/ab_bwd.sh).
"""
import collections
import re
import sys

out, stem, rounds, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
line = re.compile(rf"^({prefix} .*?)\s+([0-9.]+) ms\s+([0-9.]+) TFLOP/s")
rows = collections.defaultdict(lambda: {"old": [], "new": []})
for side in ("old", "new"):
    for r in range(1, rounds + 1):
        try:
            lines = open(f"{out}/{stem}-{side}-{r}.log").read().splitlines()
        except OSError:
            continue
        for l in lines:
            m = line.match(l)
            if m:
                rows[m.group(1)][side].append(float(m.group(2)))
print(f"| row | old ms ({rounds} runs) | new ms ({rounds} runs) | old / new (best of each) |")
print("|---|---|---|---|")
for k, d in rows.items():
    if d["old"] and d["new"]:
        old = " ".join(f"{x:.3f}" for x in d["old"])
        new = " ".join(f"{x:.3f}" for x in d["new"])
        print(f"| {k} | {old} | {new} | {min(d['old']) / min(d['new']):.3f} |")
