#!/usr/bin/env python3
"""Smoke test of `flash run` on the GPU machine: .npy in, .npy out, compared with a float64
torch reference. Usage: python3 bench/run_smoke.py [FLASH_BINARY]  (default .carry/flash)."""
import os, subprocess, sys, tempfile
import numpy as np
import torch

flash = sys.argv[1] if len(sys.argv) > 1 else ".carry/flash"
tmp = tempfile.mkdtemp()
rng = np.random.default_rng(0)
B, SQ, SK, HQ, HKV, D = 2, 77, 130, 4, 2, 128
q = rng.standard_normal((B, SQ, HQ, D)).astype(np.float32)
k = rng.standard_normal((B, SK, HKV, D)).astype(np.float32)
v = rng.standard_normal((B, SK, HKV, D)).astype(np.float32)
doc = np.sort(rng.integers(0, 4, SK)).astype(np.int64)
for n, a in dict(q=q, k=k, v=v, doc=doc).items():
    np.save(f"{tmp}/{n}.npy", a)


def ref(mask_fn, score_fn=None):
    t = lambda a: torch.tensor(a).bfloat16().double()  # the CLI rounds f32 inputs to bf16
    qd, kd, vd = (t(x).transpose(1, 2) for x in (q, k, v))
    kd = kd.repeat_interleave(HQ // HKV, 1); vd = vd.repeat_interleave(HQ // HKV, 1)
    s = qd @ kd.transpose(-1, -2) / D ** 0.5
    if score_fn:
        s = score_fn(s)
    i = torch.arange(SQ)[:, None]; j = torch.arange(SK)[None, :]
    s = s.masked_fill(~mask_fn(i, j), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ vd
    return o.transpose(1, 2).numpy(), lse.numpy()


causal = lambda i, j: j <= i + SK - SQ
cases = [
    ("causal.flash", [], causal, None),
    ("document.flash", ["--param", f"doc={tmp}/doc.npy"], lambda i, j: causal(i, j) & (torch.tensor(doc)[j] == torch.tensor(doc)[torch.clamp(i, max=SK - 1)]), None),
    ("softcap.flash", ["--param", "cap=5"], causal, lambda s: 5 * torch.tanh(s / 5)),
]
bad = 0
for f, extra, m, sf in cases:
    cmd = [flash, "run", f"examples/variants/{f}", "--q", f"{tmp}/q.npy", "--k", f"{tmp}/k.npy", "--v", f"{tmp}/v.npy",
           "--out", f"{tmp}/o.npy", "--lse", f"{tmp}/lse.npy", "--out-dtype", "f32"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("FAIL", f, r.stderr.strip()[-800:]); bad += 1; continue
    o, lse = np.load(f"{tmp}/o.npy"), np.load(f"{tmp}/lse.npy")
    ro, rl = ref(m, sf)
    fin = np.isfinite(rl)
    eo = np.abs(o - ro).max(); el = np.abs(lse[fin] - rl[fin]).max() if fin.any() else 0.0
    ok = o.shape == ro.shape and eo < 2e-2 and el < 1e-3 and np.all(lse[~fin] == -np.inf) and not np.isnan(o).any()
    bad += not ok
    print("ok  " if ok else "FAIL", f, "o", o.shape, f"err {eo:.2e} lse {el:.1e} masked_rows {(~fin).sum()}", r.stderr.strip().splitlines()[-1:])
print(f"# flash run smoke: {len(cases) - bad} passed, {bad} failed")
sys.exit(1 if bad else 0)
