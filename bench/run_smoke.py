#!/usr/bin/env python3
"""Smoke test of `flash run` on the GPU machine: .npy in, .npy out, compared with a float64
torch reference; then the backward pass (`--do`, `--dq/--dk/--dv`, `--dparam`) against torch
autograd in float64. Usage: python3 bench/run_smoke.py [FLASH_BINARY]  (default .carry/flash)."""
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
do = rng.standard_normal((B, SQ, HQ, D)).astype(np.float32)
slopes = np.array([2.0 ** (-8 * (h + 1) / HQ) for h in range(HQ)], dtype=np.float32)
# A block-sparse layout for `BigBird` ([heads, seq / 128, 8]): entries -1 (unused), 0 or 1.
lay = rng.integers(-1, 2, (HQ, (max(SQ, SK) + 127) // 128, 8)).astype(np.int64)
allowed = torch.tensor(np.stack([[[(lay[h, qb] == kb).any() for kb in range(lay.shape[1])] for qb in range(lay.shape[1])] for h in range(HQ)]))
for n, a in dict(q=q, k=k, v=v, doc=doc, do=do, slopes=slopes, lay=lay).items():
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
    ("bigbird.flash", ["--param", f"blocks={tmp}/lay.npy"], lambda i, j: allowed[:, i // 128, j // 128], None),
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


def ref_grad(mask_fn, score_fn, param, drop=None):
    """O and the gradients of sum(O * dO) with respect to Q, K, V and the parameter (or None),
    by autograd in float64 on the bf16-rounded inputs (the CLI rounds Q, K, V and dO to bf16).
    `drop` = (keep mask [B, HQ, SQ, SK], p): dropout on the normalised probabilities."""
    t = lambda a: torch.tensor(a).bfloat16().double()
    qd, kd, vd = (t(x).requires_grad_() for x in (q, k, v))
    p = None if param is None else torch.tensor(param, dtype=torch.float64).requires_grad_()
    Q = qd.transpose(1, 2)
    K = kd.transpose(1, 2).repeat_interleave(HQ // HKV, 1)
    V = vd.transpose(1, 2).repeat_interleave(HQ // HKV, 1)
    s = Q @ K.transpose(-1, -2) / D ** 0.5
    if score_fn:
        s = score_fn(s, p)
    i = torch.arange(SQ)[:, None]; j = torch.arange(SK)[None, :]
    s = s.masked_fill(~mask_fn(i, j), float("-inf"))
    pr = torch.softmax(s, -1).nan_to_num(0.0)
    if drop is not None:
        pr = pr * torch.tensor(drop[0]).double() / (1 - drop[1])
    o = (pr @ V).transpose(1, 2)
    o.backward(t(do))
    g = lambda x: x.grad.numpy()
    return o.detach().numpy(), g(qd), g(kd), g(vd), None if p is None else g(p).reshape(-1)


def alibi_score(s, sl):
    i = torch.arange(SQ)[:, None]; j = torch.arange(SK)[None, :]
    return s + sl[None, :, None, None] * (j - i).double()


# (file, --param flags, mask, score(s, param), param value for autograd, --dparam name)
grad_cases = [
    ("causal.flash", [], causal, None, None, None),
    ("softcap.flash", ["--param", "cap=5"], causal, lambda s, c: c * torch.tanh(s / c), np.array([5.0]), "cap"),
    ("alibi.flash", ["--param", f"slopes={tmp}/slopes.npy"], causal, alibi_score, slopes.astype(np.float64), "slopes"),
    # No --dparam: the slopes are frozen (the kernels without their gradient terms).
    ("alibi.flash", ["--param", f"slopes={tmp}/slopes.npy"], causal, alibi_score, slopes.astype(np.float64), None),
]
for f, extra, m, sf, pv, pname in grad_cases:
    outs = {n: f"{tmp}/g_{n}.npy" for n in ("o", "dq", "dk", "dv", "dp")}
    cmd = [flash, "run", f"examples/variants/{f}", "--q", f"{tmp}/q.npy", "--k", f"{tmp}/k.npy", "--v", f"{tmp}/v.npy",
           "--out", outs["o"], "--out-dtype", "f32", "--do", f"{tmp}/do.npy",
           "--dq", outs["dq"], "--dk", outs["dk"], "--dv", outs["dv"]] + extra
    if pname:
        cmd += ["--dparam", f"{pname}={outs['dp']}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("FAIL bwd", f, pname, r.stderr.strip()[-800:]); bad += 1; continue
    want = dict(zip(("o", "dq", "dk", "dv", "dp"), ref_grad(m, sf, pv)))
    ok, parts = True, []
    for n in ("o", "dq", "dk", "dv", "dp"):
        if want[n] is None or (n == "dp" and not pname):
            continue
        got = np.load(outs[n]).astype(np.float64)
        scale = max(1.0, float(np.abs(want[n]).max()))
        err = float(np.abs(got - want[n]).max()) if got.shape == want[n].shape else float("inf")
        good = got.shape == want[n].shape and not np.isnan(got).any() and err <= 2e-2 * scale
        ok &= good
        name = f"d{pname}" if n == "dp" else n
        parts.append(f"{name} err {err:.2e} (max|ref| {scale:.1e}){'' if good else ' !'}")
    bad += not ok
    label = f + (" (frozen)" if pv is not None and not pname else "")
    print("ok  " if ok else "FAIL", "bwd", label, "; ".join(parts), r.stderr.strip().splitlines()[-1:])
# Dropout through the CLI: --seed/--offset, the mask written by --dropout-mask, O and the
# gradients against autograd with that mask; then the mask's kept fraction, and a second seed.
P_DROP = 0.2
drop_cmd = [flash, "run", "examples/variants/dropout.flash", "--q", f"{tmp}/q.npy", "--k", f"{tmp}/k.npy",
            "--v", f"{tmp}/v.npy", "--param", f"p={P_DROP}", "--seed", "1234", "--offset", "5",
            "--dropout-mask", f"{tmp}/m.npy", "--out", f"{tmp}/d_o.npy", "--out-dtype", "f32", "--do", f"{tmp}/do.npy",
            "--dq", f"{tmp}/d_dq.npy", "--dk", f"{tmp}/d_dk.npy", "--dv", f"{tmp}/d_dv.npy"]
r = subprocess.run(drop_cmd, capture_output=True, text=True)
extra_cases = 1
if r.returncode != 0:
    print("FAIL dropout", r.stderr.strip()[-800:]); bad += 1
else:
    mask = np.load(f"{tmp}/m.npy")
    want = dict(zip(("o", "dq", "dk", "dv"), ref_grad(causal, None, None, (mask, P_DROP))[:4]))
    ok, parts = mask.shape == (B, HQ, SQ, SK) and mask.dtype == np.uint8, []
    for n, path in (("o", "d_o"), ("dq", "d_dq"), ("dk", "d_dk"), ("dv", "d_dv")):
        got = np.load(f"{tmp}/{path}.npy").astype(np.float64)
        scale = max(1.0, float(np.abs(want[n]).max()))
        err = float(np.abs(got - want[n]).max())
        good = not np.isnan(got).any() and err <= 2e-2 * scale
        ok &= good
        parts.append(f"{n} err {err:.2e}{'' if good else ' !'}")
    kept = float(mask.mean())
    ok &= abs(kept - (1 - P_DROP)) < 0.02
    # Another seed must give another mask (same call otherwise).
    swap = {"1234": "1235", f"{tmp}/m.npy": f"{tmp}/m2.npy"}
    r2 = subprocess.run([swap.get(a, a) for a in drop_cmd[:-8]], capture_output=True, text=True)
    differ = r2.returncode == 0 and (np.load(f"{tmp}/m2.npy") != mask).mean()
    ok &= bool(differ) and abs(differ - 2 * P_DROP * (1 - P_DROP)) < 0.02
    bad += not ok
    print("ok  " if ok else "FAIL", "dropout p=0.2 seed 1234", "; ".join(parts), f"kept {kept:.4f}, seed 1235 differs on {float(differ):.4f}",
          r.stderr.strip().splitlines()[-1:])
# `RelativeBias` (d 64, f16) backward without --dparam: its table is frozen, and at d 64 the
# launch picks its own tile (a frozen build takes the one its unfrozen build resolves to).
D64 = 64
q6, k6, v6, do6 = (rng.standard_normal(x.shape[:-1] + (D64,)).astype(np.float32) for x in (q, k, v, do))
bias = (0.5 * rng.standard_normal((HQ, 256))).astype(np.float32)
for n, a in dict(q6=q6, k6=k6, v6=v6, do6=do6, bias=bias).items():
    np.save(f"{tmp}/{n}.npy", a)
rb_cmd = [flash, "run", "examples/variants/relative_bias.flash", "--q", f"{tmp}/q6.npy", "--k", f"{tmp}/k6.npy",
          "--v", f"{tmp}/v6.npy", "--param", f"bias={tmp}/bias.npy", "--out", f"{tmp}/rb_o.npy", "--out-dtype", "f32",
          "--do", f"{tmp}/do6.npy", "--dq", f"{tmp}/rb_dq.npy", "--dk", f"{tmp}/rb_dk.npy", "--dv", f"{tmp}/rb_dv.npy"]
r = subprocess.run(rb_cmd, capture_output=True, text=True)
extra_cases += 1
if r.returncode != 0:
    print("FAIL bwd relative_bias.flash (frozen)", r.stderr.strip()[-800:]); bad += 1
else:
    h16 = lambda a: torch.tensor(a).half().double()
    qd, kd, vd = (h16(x).requires_grad_() for x in (q6, k6, v6))
    Q = qd.transpose(1, 2)
    K = kd.transpose(1, 2).repeat_interleave(HQ // HKV, 1)
    V = vd.transpose(1, 2).repeat_interleave(HQ // HKV, 1)
    i = torch.arange(SQ)[:, None]; j = torch.arange(SK)[None, :]
    sc = Q @ K.transpose(-1, -2) / D64 ** 0.5 + torch.tensor(bias).double()[:, torch.clamp(i - j, 0, 255)][None]
    pr = torch.softmax(sc.masked_fill(~causal(i, j), float("-inf")), -1).nan_to_num(0.0)
    o = (pr @ V).transpose(1, 2)
    o.backward(h16(do6))
    want = dict(o=o.detach().numpy(), dq=qd.grad.numpy(), dk=kd.grad.numpy(), dv=vd.grad.numpy())
    ok, parts = True, []
    for n in ("o", "dq", "dk", "dv"):
        got = np.load(f"{tmp}/rb_{n}.npy").astype(np.float64)
        scale = max(1.0, float(np.abs(want[n]).max()))
        err = float(np.abs(got - want[n]).max()) if got.shape == want[n].shape else float("inf")
        good = got.shape == want[n].shape and not np.isnan(got).any() and err <= 2e-2 * scale
        ok &= good
        parts.append(f"{n} err {err:.2e}{'' if good else ' !'}")
    bad += not ok
    print("ok  " if ok else "FAIL", "bwd relative_bias.flash (frozen, d64 f16)", "; ".join(parts), r.stderr.strip().splitlines()[-1:])
total = len(cases) + len(grad_cases) + extra_cases
print(f"# flash run smoke: {total - bad} passed, {bad} failed")
sys.exit(1 if bad else 0)
