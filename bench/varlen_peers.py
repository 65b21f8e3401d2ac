"""Peers of flash's packed-document prefill, on the same tokens in the same run.

Usage: python3 bench/varlen_peers.py FLASH_ROWS.json [--json OUT.json]

Reads the document lengths from flash-gpucheck's `varlen_docs_*` rows (`--varlen`), then times,
bf16, d=128, 16 heads, forward, with triton's do_bench (median, L2 flushed) as peers.py does:
- FlexAttention over the documents packed into one sequence, with a document mask (and a
  document-causal one), its block mask built once outside the timing (its build time printed);
- FlashAttention-2's packed entry point `flash_attn_varlen_func`, where it is installed;
- PyTorch SDPA on jagged nested tensors of the same rows and offsets, flash (FA2's varlen
  kernel) and cuDNN backends, where they take them (not yet run on the device machine).
TFLOP/s counts the documents' own (q, k) pairs (half for causal), as flash-gpucheck does.
Rows: backend, variant (`varlen_docs_dense`, `varlen_docs_causal`), dtype, d, n (tokens), b
(documents), h, causal, mode, ms, tflops.
"""
import argparse, json, sys, warnings

import torch
from triton.testing import do_bench

warnings.filterwarnings("ignore", category=DeprecationWarning)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("flash_rows")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = json.load(open(a.flash_rows))
    lens = next(r["lens"] for r in rows if r.get("variant", "").startswith("varlen_docs_"))
    d, h = 128, 16
    total = sum(lens)
    print(f"# {len(lens)} documents, {total} tokens: {lens}", flush=True)
    dev = "cuda"
    q, k, v = (torch.randn(1, total, h, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
    docs = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev))
    out = []

    def flops(causal):
        return sum(4 * h * d * (l * (l + 1) // 2 if causal else l * l) for l in lens)

    def row(backend, causal, ms):
        tf = flops(causal) / ms / 1e9
        variant = "varlen_docs_causal" if causal else "varlen_docs_dense"
        out.append(dict(backend=backend, variant=variant, dtype="bf16", d=d, n=total, b=len(lens), h=h,
                        causal=causal, mode="fwd", ms=ms, tflops=tf))
        print(f"fwd      {variant:19s} {backend:12s} {ms:9.4f} ms {tf:7.1f} TFLOP/s", flush=True)

    try:
        from torch.nn.attention.flex_attention import flex_attention, create_block_mask
        flex_c = torch.compile(flex_attention, dynamic=False)
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # [1, h, total, d]
        for causal in (False, True):
            if causal:
                mm = lambda b_, h_, q_, k_: (docs[q_] == docs[k_]) & (q_ >= k_)
            else:
                mm = lambda b_, h_, q_, k_: docs[q_] == docs[k_]
            bm = create_block_mask(mm, None, None, total, total)
            build = do_bench(lambda: create_block_mask(mm, None, None, total, total), warmup=3, rep=30, return_mode="median")
            print(f"# flex create_block_mask causal={int(causal)}: {build:.3f} ms (not in the row)")
            with torch.no_grad():
                ms = do_bench(lambda: flex_c(qt, kt, vt, block_mask=bm), warmup=25, rep=100, return_mode="median")
            row("flex", causal, ms)
    except Exception as e:  # pragma: no cover
        print(f"# flex unavailable: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)

    try:
        from flash_attn import flash_attn_varlen_func
        qp, kp, vp = (x[0] for x in (q, k, v))  # [total, h, d]
        m = max(lens)
        for causal in (False, True):
            with torch.no_grad():
                ms = do_bench(lambda: flash_attn_varlen_func(qp, kp, vp, cu, cu, m, m, causal=causal),
                              warmup=25, rep=100, return_mode="median")
            row("fa2", causal, ms)
    except Exception as e:  # pragma: no cover
        print(f"# flash_attn unavailable: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)

    # PyTorch SDPA over jagged nested tensors (the same packed rows and offsets): its flash
    # backend runs FlashAttention-2's varlen kernel, where the flash_attn package is missing.
    try:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        offs = cu.long()
        qj, kj, vj = (torch.nested.nested_tensor_from_jagged(x[0], offs).transpose(1, 2) for x in (q, k, v))
        for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            for causal in (False, True):
                try:
                    with torch.no_grad(), sdpa_kernel(backend):
                        F.scaled_dot_product_attention(qj, kj, vj, is_causal=causal)
                        ms = do_bench(lambda: F.scaled_dot_product_attention(qj, kj, vj, is_causal=causal),
                                      warmup=25, rep=100, return_mode="median")
                    row(name, causal, ms)
                except Exception as e:  # pragma: no cover
                    print(f"# {name} on jagged tensors unavailable (causal={int(causal)}): {type(e).__name__}: {str(e)[:200]}",
                          file=sys.stderr)
    except Exception as e:  # pragma: no cover
        print(f"# jagged nested tensors unavailable: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)

    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
