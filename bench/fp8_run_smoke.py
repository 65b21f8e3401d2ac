#!/usr/bin/env python3
"""Smoke test of `flash run` on fp8 variants on the GPU machine: float .npy inputs quantised on
the GPU as each variant declares (`scales:`), optionally rotated (`--hadamard-seed`), then the fp8
forward; O against a float64 torch reference of the unquantised (bf16-rounded) inputs, next to
the same run of the bf16 variant and a plain fp8 model in torch (the inputs quantised with the
same grouping, e4m3 by torch's cast, f32 arithmetic, P rounded to e4m3 x256). Odd sizes and GQA.
Fails (exit 1) when an fp8 run's RMSE exceeds twice the plain model's of its grouping, or on a
NaN. Usage: python3 bench/fp8_run_smoke.py [FLASH_BINARY]."""
import subprocess, sys, tempfile
import numpy as np
import torch

flash = sys.argv[1] if len(sys.argv) > 1 else ".carry/flash"
tmp = tempfile.mkdtemp()
rng = np.random.default_rng(1)
B, SQ, SK, HQ, HKV, D = 2, 333, 517, 4, 2, 128
q = rng.standard_normal((B, SQ, HQ, D)).astype(np.float32)
k = rng.standard_normal((B, SK, HKV, D)).astype(np.float32)
v = rng.standard_normal((B, SK, HKV, D)).astype(np.float32)
for n, a in dict(q=q, k=k, v=v).items():
    np.save(f"{tmp}/{n}.npy", a)


def quant(x, group):
    """x [B, S, H, D] float64 -> dequantised e4m3 values, scales per 128 rows or per head."""
    B_, S, H, _ = x.shape
    if group == "head":
        amax = x.abs().amax(dim=(1, 3), keepdim=True)
        scale = amax / 448
        return (x / scale).float().to(torch.float8_e4m3fn).double() * scale
    out = torch.empty_like(x)
    for s0 in range(0, S, 128):
        blk = x[:, s0:s0 + 128]
        scale = blk.abs().amax(dim=(1, 3), keepdim=True) / 448
        out[:, s0:s0 + 128] = (blk / scale).float().to(torch.float8_e4m3fn).double() * scale
    return out


def attend(group=None):
    t = lambda a: torch.tensor(a).bfloat16().double()
    qd, kd, vd = (t(x) for x in (q, k, v))
    if group:
        qd, kd, vd = quant(qd, group), quant(kd, group), quant(vd, group)
    qd, kd, vd = (x.transpose(1, 2) for x in (qd, kd, vd))
    kd = kd.repeat_interleave(HQ // HKV, 1); vd = vd.repeat_interleave(HQ // HKV, 1)
    if group:
        qd, kd, vd = qd.float(), kd.float(), vd.float()
    s = qd @ kd.transpose(-1, -2) / D ** 0.5
    i = torch.arange(SQ)[:, None]; j = torch.arange(SK)[None, :]
    s = s.masked_fill(~(j <= i + SK - SQ), float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    l = p.sum(-1, keepdim=True)
    if group:
        p = (p * 256).to(torch.float8_e4m3fn).float() / 256
    return (p @ vd / l).double().transpose(1, 2).numpy()


want = attend()
rms = lambda o: float(np.sqrt(np.mean((o - want) ** 2)))
plain = {g: rms(attend(g)) for g in ("block", "head")}
print(f"plain fp8 model RMSE: per block {plain['block']:.3e}, per head {plain['head']:.3e}")
runs = [
    ("bf16 Causal", "examples/variants/causal.flash", "Causal", [], None),
    ("fp8 per block", "examples/fp8/check.flash", "Fp8Causal", [], "block"),
    ("fp8 per block + Hadamard", "examples/fp8/check.flash", "Fp8Causal", ["--hadamard-seed", "7"], "block"),
    ("fp8 per head", "examples/fp8/check.flash", "Fp8CausalPerHead", [], "head"),
    ("fp8 per block, V rows", "examples/fp8/check.flash", "Fp8CausalVRows", [], "block"),
]
status, base = 0, None
for label, file, name, extra, group in runs:
    out = f"{tmp}/o.npy"
    cmd = [flash, "run", file, "--name", name, "--q", f"{tmp}/q.npy", "--k", f"{tmp}/k.npy",
           "--v", f"{tmp}/v.npy", "--out", out, "--out-dtype", "f32"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL {label}: exit {r.returncode}: {r.stderr.strip()}")
        status = 1
        continue
    o = np.load(out).astype(np.float64)
    rmse = rms(o)
    mx = float(np.abs(o - want).max())
    base = base or rmse
    bound = 2 * plain[group] if group else 2 * rmse
    ok = bool(np.isfinite(o).all()) and rmse <= bound
    status |= 0 if ok else 1
    print(f"{'ok  ' if ok else 'FAIL'} {label:<26} RMSE {rmse:.3e} (bound {bound:.3e}) max {mx:.3e} ({rmse / base:.1f}x bf16)  [{r.stderr.strip().splitlines()[-1]}]")
sys.exit(status)
