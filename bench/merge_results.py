#!/usr/bin/env python3
"""Merge flash-gpucheck timings with bench/peers.py timings into one results file and a table.

Usage: merge_results.py --flash flash.json [--peers peers.json] --gpu NAME [--date YYYY-MM-DD]
                        [--out-dir DIR]
Writes DIR/<gpu>-<date>.json (every row of both files, each with `gpu`, `dtype` and `backend`)
and DIR/<gpu>-<date>.md (one row per flash workload with the peers' TFLOP/s and the ratios
flash/sdpa_flash, flash/sdpa_cudnn, flash/flex; a ratio > 1 means flash is faster).
Rows match on (dtype, d, n, causal, mode) for dense workloads and (variant, n, mode) for
variant workloads. Only rows timed in the same run on the same machine should be merged.
Python 3 standard library only.
"""
import argparse
import datetime
import json
import math
import os
import re

PEERS = ("sdpa_flash", "sdpa_cudnn", "flex")


def load(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def finite(x):
    return isinstance(x, (int, float)) and not (isinstance(x, float) and (math.isnan(x) or math.isinf(x)))


def key(r):
    if r.get("variant") not in (None, "dense", "causal"):
        return ("variant", r["variant"], r["n"], r.get("mode", "fwd"))
    return ("dense", r.get("dtype", "bf16"), r["d"], r["n"], bool(r.get("causal")), r.get("mode", "fwd"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flash", required=True)
    ap.add_argument("--peers")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--mode", default="fwd", help="which timing mode the table shows (fwd, bwd)")
    ap.add_argument("--suffix", default="", help="appended to the output file names")
    a = ap.parse_args()

    flash = load(a.flash)
    peers = load(a.peers)
    gpu = re.sub(r"[^A-Za-z0-9_.-]+", "_", a.gpu).strip("_")
    rows = []
    for r in flash:
        rows.append(dict(r, gpu=r.get("gpu", a.gpu)))
    for r in peers:
        rows.append(dict(r, gpu=a.gpu, dtype=r.get("dtype", "bf16")))

    peer_tf = {}
    for r in peers:
        if r.get("backend") in PEERS and finite(r.get("tflops")):
            peer_tf[(key(r), r["backend"])] = r["tflops"]

    lines = [
        f"# flash vs peers on {a.gpu} ({a.date}), {a.mode}",
        "",
        "TFLOP/s (variants: useful TFLOP/s = dense FLOPs x mask density / time); ratio = flash / peer.",
        "",
        "| workload | dtype | d | n | b | h | flash ms | flash TF/s | sdpa_flash | sdpa_cudnn | flex "
        "| flash/sdpa_flash | flash/sdpa_cudnn | flash/flex |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in flash:
        if r.get("mode") != a.mode or not finite(r.get("tflops")):
            continue
        k = key(r)
        name = r.get("variant") or ("causal" if r.get("causal") else "dense")
        cells = []
        ratios = []
        for p in PEERS:
            t = peer_tf.get((k, p))
            cells.append(f"{t:.1f}" if t else "")
            ratios.append(f"{r['tflops'] / t:.2f}" if t else "")
        lines.append(
            f"| {name} | {r.get('dtype', '')} | {r['d']} | {r['n']} | {r['b']} | {r['h']} | {r['ms']:.3f} "
            f"| {r['tflops']:.1f} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |"
        )
    comp = [r for r in flash if str(r.get("mode", "")).startswith("compile")]
    if comp:
        lines += ["", "Compile latency (ms): " + ", ".join(f"{r['mode']} {r['ms']:.2f}" for r in comp)]

    os.makedirs(a.out_dir, exist_ok=True)
    base = os.path.join(a.out_dir, f"{gpu}-{a.date}{a.suffix}")
    with open(base + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {base}.json and {base}.md")


if __name__ == "__main__":
    main()
