//! The accuracy of FP8 attention's quantisation schemes, on the CPU: for each scheme of
//! `flash_dsl::fp8::SCHEMES` (per-tensor, per-head, per-block of 128, per-block with the random
//! Hadamard rotation of Q and K, and with K smoothed too), the RMSE and largest error of O
//! computed in float64 from the dequantised Q, K, V (e4m3) against O from the unquantised
//! inputs — the quantisation error alone — and the RMSE once P too is rounded to e4m3 (after a
//! ×256 scale, as FP8 kernels do before their second product). Inputs as FlashAttention-3
//! evaluates FP8: standard normal, and the same with 0.1 % of the entries ×10 ("outliers"); head
//! dims 64, 128, 256; 1024 tokens, 2 heads.
//!
//! ```sh
//! cargo run --release -p flash-examples --example 04_fp8_accuracy
//! ```

use flash_dsl::fp8::{attention_inputs, attention_p_cast, quantize_qkv, Fp8Format, PCast, SCHEMES};

fn main() {
    let (b, n, h) = (1usize, 1024usize, 2usize);
    println!("| inputs | d | scheme | RMSE | max error | per-tensor / this | RMSE, P in e4m3 (×256) | per-tensor / this |");
    println!("|---|---|---|---|---|---|---|---|");
    for outliers in [false, true] {
        for d in [64usize, 128, 256] {
            let len = b * n * h * d;
            let seed = 17 + d as u64 + outliers as u64;
            let (q, k, v) = (
                attention_inputs(len, outliers, seed),
                attention_inputs(len, outliers, seed + 100),
                attention_inputs(len, outliers, seed + 200),
            );
            let shape = [b, n, h, d];
            let exact = attention_p_cast((&q, &k, &v), shape, n, d, PCast::Exact);
            let err = |o: &[f64]| {
                let (mut se, mut max) = (0.0f64, 0.0f64);
                for (a, e) in o.iter().zip(&exact) {
                    se += (a - e) * (a - e);
                    max = max.max((a - e).abs());
                }
                ((se / o.len() as f64).sqrt(), max)
            };
            let (mut base, mut base_p) = (0.0, 0.0);
            for scheme in &SCHEMES {
                let (qq, kq, vq) =
                    quantize_qkv(scheme, Fp8Format::E4m3, (&q, &k, &v), (shape, shape), 7);
                let (rmse, max) = err(&attention_p_cast(
                    (&qq, &kq, &vq),
                    shape,
                    n,
                    d,
                    PCast::Exact,
                ));
                let p_cast = PCast::E4m3 { scale: 256.0 };
                let (rmse_p, _) = err(&attention_p_cast((&qq, &kq, &vq), shape, n, d, p_cast));
                if scheme.name == "per-tensor" {
                    (base, base_p) = (rmse, rmse_p);
                }
                println!(
                    "| {} | {d} | {} | {rmse:.3e} | {max:.3e} | {:.2} | {rmse_p:.3e} | {:.2} |",
                    if outliers { "outliers" } else { "normal" },
                    scheme.name,
                    base / rmse,
                    base_p / rmse_p
                );
            }
        }
    }
}
