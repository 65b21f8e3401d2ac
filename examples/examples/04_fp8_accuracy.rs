//! The accuracy of FP8 attention's quantisation schemes, on the CPU: for each scheme of
//! `flash_dsl::fp8::SCHEMES` (per-tensor, per-head, per-block of 128, per-block with the random
//! Hadamard rotation of Q and K, and with K smoothed too), the RMSE and largest error of O
//! computed in float64 from the dequantised Q, K, V (e4m3) against O from the unquantised
//! inputs — the quantisation error alone, which an FP8 kernel adds its own to (P in fp8, fp32
//! accumulation). Inputs as FlashAttention-3 evaluates FP8: standard normal, and the same with
//! 0.1 % of the entries ×10 ("outliers"); head dims 64, 128, 256; 1024 tokens, 2 heads.
//!
//! ```sh
//! cargo run --release -p flash-examples --example 04_fp8_accuracy
//! ```

use flash_dsl::fp8::{attention_inputs, quantize_qkv, Fp8Format, SCHEMES};
use flash_dsl::model::reference::{forward, Problem};

fn main() {
    let (b, n, h) = (1usize, 1024usize, 2usize);
    println!("| inputs | d | scheme | RMSE | max error | RMSE vs per-tensor |");
    println!("|---|---|---|---|---|---|");
    for outliers in [false, true] {
        for d in [64usize, 128, 256] {
            let spec =
                flash_dsl::parse::parse_str(&format!("Dense {{ head_dim: {d}, dtype: bf16 }}"))
                    .expect("parses")
                    .remove(0);
            let len = b * n * h * d;
            let seed = 17 + d as u64 + outliers as u64;
            let (q, k, v) = (
                attention_inputs(len, outliers, seed),
                attention_inputs(len, outliers, seed + 100),
                attention_inputs(len, outliers, seed + 200),
            );
            let problem = |q: Vec<f64>, k: Vec<f64>, v: Vec<f64>| Problem {
                batch: b,
                heads_q: h,
                heads_kv: h,
                seq_q: n,
                seq_k: n,
                q,
                k,
                v,
                params: flash_dsl::eval::ParamValues::none(),
                rng: Default::default(),
            };
            let exact = forward(&spec, &problem(q.clone(), k.clone(), v.clone())).o;
            let mut base = 0.0;
            for scheme in &SCHEMES {
                let shape = [b, n, h, d];
                let (qq, kq, vq) =
                    quantize_qkv(scheme, Fp8Format::E4m3, (&q, &k, &v), (shape, shape), 7);
                let o = forward(&spec, &problem(qq, kq, vq)).o;
                let (mut se, mut max) = (0.0f64, 0.0f64);
                for (a, e) in o.iter().zip(&exact) {
                    se += (a - e) * (a - e);
                    max = max.max((a - e).abs());
                }
                let rmse = (se / o.len() as f64).sqrt();
                if scheme.name == "per-tensor" {
                    base = rmse;
                }
                println!(
                    "| {} | {d} | {} | {rmse:.3e} | {max:.3e} | {:.2}x lower |",
                    if outliers { "outliers" } else { "normal" },
                    scheme.name,
                    base / rmse
                );
            }
        }
    }
}
