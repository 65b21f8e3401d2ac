#!/usr/bin/env python3
"""fwd+bwd table: flash's forward and backward times (flash-gpucheck --backward rows, summed)
against the peers' `fwd_bwd` rows (peers.py --modes ...,fwd_bwd), for the workloads both timed.
FLOPs: 3.5x the forward's (forward 1x + backward 2.5x), useful FLOPs x mask density for variants.
Usage: fwd_bwd_table.py FLASH.json PEERS.json > table.md"""
import json
import sys

flash = json.load(open(sys.argv[1]))
peers = json.load(open(sys.argv[2]))


def key(r):
    return (r["variant"], r["dtype"], r["d"], r["n"], r["b"], r["h"])


fl = {}
for r in flash:
    if r.get("backend") == "flash" and r.get("mode") in ("fwd", "bwd"):
        fl.setdefault(key(r), {})[r["mode"]] = r
pe = {}
for r in peers:
    if r.get("mode") == "fwd_bwd":
        pe.setdefault(key(r), {})[r["backend"]] = r

backends = ["sdpa_flash", "sdpa_cudnn", "flex"]
print("| workload | d | n | b | h | flash fwd+bwd ms | flash TF/s | " + " | ".join(backends)
      + " | " + " | ".join(f"flash/{b}" for b in backends) + " |")
print("|" + "---|" * (7 + 2 * len(backends)))
for k in sorted(pe, key=lambda k: (k[0] not in ("dense", "causal"), k[2], k[0], k[3])):
    if k not in fl or "fwd" not in fl[k] or "bwd" not in fl[k]:
        continue
    f, b = fl[k]["fwd"], fl[k]["bwd"]
    ms = f["ms"] + b["ms"]
    # TF/s of the sum: fwd FLOPs (from the fwd row) x 3.5.
    fwd_flops = f["tflops"] * f["ms"] * 1e9
    tf = 3.5 * fwd_flops / ms / 1e9
    cells, ratios = [], []
    for be in backends:
        p = pe[k].get(be)
        cells.append(f"{p['tflops']:.1f}" if p else "")
        ratios.append(f"{p['ms'] / ms:.2f}" if p else "")
    variant, dtype, d, n, bb, h = k
    print(f"| {variant} | {d} | {n} | {bb} | {h} | {ms:.3f} | {tf:.1f} | " + " | ".join(cells)
          + " | " + " | ".join(ratios) + " |")
