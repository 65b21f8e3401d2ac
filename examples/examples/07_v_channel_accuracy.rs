//! When V's per-channel scales (`v_scales: per_channel`) buy accuracy, on the CPU: O computed in
//! float64 from Q and K exact and V quantised to e4m3 with one scale per block of 128 keys, per
//! head, or per channel of each head, against O from the unquantised V — V's quantisation error
//! alone (P exact, then P rounded to e4m3 ×256 as the kernels do).
//!
//! V is drawn with its channels' magnitudes spread log-uniformly over `spread` decades (0: the
//! i.i.d. inputs of `04_fp8_accuracy`, standard normal with 0.1 % of the entries ×10). e4m3 is a
//! floating-point format: a value keeps 3 mantissa bits wherever it lies among the normal
//! numbers, which span 448 / 2⁻⁶ ≈ 4.5 decades under one scale; only a channel that many decades
//! below its group's largest value falls into the subnormals (steps of 2⁻⁹) and loses its
//! precision. So a scale per channel should matter once the spread nears that range, not
//! before. The error reported is each output column's RMSE relative to that column's RMS,
//! averaged over the columns (an absolute RMSE would only see the largest channels), and the
//! worst column's.
//!
//! ```sh
//! cargo run --release -p flash-examples --example 07_v_channel_accuracy
//! ```

use flash_dsl::fp8::{attention_inputs, attention_p_cast, quantize, Fp8Format, PCast, Scaling};

/// Column-wise relative RMSE of `o` against `exact` (`[1, n, h, d]`): (mean, max) over the h·d
/// columns of RMSE(column) / RMS(exact column).
fn column_errors(o: &[f64], exact: &[f64], h: usize, d: usize) -> (f64, f64) {
    let cols = h * d;
    let rows = o.len() / cols;
    let (mut sum, mut worst) = (0.0, 0f64);
    for c in 0..cols {
        let (mut se, mut ss) = (0.0, 0.0);
        for r in 0..rows {
            let (a, e) = (o[r * cols + c], exact[r * cols + c]);
            se += (a - e) * (a - e);
            ss += e * e;
        }
        let rel = (se / ss.max(f64::MIN_POSITIVE)).sqrt();
        sum += rel;
        worst = worst.max(rel);
    }
    (sum / cols as f64, worst)
}

fn main() {
    let (n, h, d) = (1024usize, 2usize, 128usize);
    let shape = [1, n, h, d];
    let len = n * h * d;
    let (q, k) = (
        attention_inputs(len, false, 71),
        attention_inputs(len, false, 72),
    );
    println!("| V's channel spread (decades) | P | per block of 128 keys: mean / worst column rel. RMSE | per head | per channel |");
    println!("|---|---|---|---|---|");
    for spread in [0.0f64, 2.0, 4.0, 5.0, 6.0] {
        // Channel c of every head scaled by 10^(−spread · u_c), u_c uniform in [0, 1) (a fixed
        // low-discrepancy draw), on top of the outlier inputs.
        let base = attention_inputs(len, true, 73);
        let v: Vec<f64> = base
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let c = i % d;
                let u = ((c as f64 + 0.5) * 0.618_033_988_749_895).fract();
                x * 10f64.powf(-spread * u)
            })
            .collect();
        let exact = attention_p_cast((&q, &k, &v), shape, n, d, PCast::Exact);
        let v32: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        for p_cast in [PCast::Exact, PCast::E4m3 { scale: 256.0 }] {
            let cell = |scaling: Scaling| {
                let vq = quantize(&v32, shape, scaling, Fp8Format::E4m3).dequantize();
                let o = attention_p_cast((&q, &k, &vq), shape, n, d, p_cast);
                let (mean, worst) = column_errors(&o, &exact, h, d);
                format!("{mean:.2e} / {worst:.2e}")
            };
            println!(
                "| {spread} | {} | {} | {} | {} |",
                if p_cast == PCast::Exact {
                    "exact"
                } else {
                    "e4m3 ×256"
                },
                cell(Scaling::PerBlock { rows: 128 }),
                cell(Scaling::PerHead),
                cell(Scaling::PerChannel)
            );
        }
    }
}
