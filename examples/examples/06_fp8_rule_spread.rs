//! How far apart two equally valid fp8 implementations land under FlashAttention's rule: on the
//! CPU, for many random inputs, the largest error of O (against float64 attention of the
//! dequantised inputs) of the fp8 kernel's rounding (`reference::forward_fp8_tiled`: tiles of
//! 128 keys, P rounded to e4m3 ×256 relative to the running max) divided by that of the plain
//! fp8 implementation the GPU check compares with (`reference::forward_fp8_plain`: P normalised,
//! then rounded). Both round every probability once, to the same format; only the point differs.
//! The rule passes a kernel whose largest error is at most twice the plain one. With outlier
//! inputs (0.1 % of entries ×10) the largest error is one rounding of one large probability
//! times one large V entry, and the two maxima are two draws of that: the printed spread is how
//! often a faithful kernel lands past 2× by chance.
//!
//! ```sh
//! cargo run --release -p flash-examples --example 06_fp8_rule_spread [SEEDS]
//! S0=208 cargo run --release -p flash-examples --example 06_fp8_rule_spread 1
//! ```
//!
//! 40 seeds (`bench/results/cpu-fp8-rule-spread-2026-11-25.md`): tiled / normalised, largest
//! error, median 0.22–0.69, at most 1.08, none past 2; the GPU check's seed 208 (window of 256,
//! d 64, 1000 × 1000, outliers) is 2.02 in this model and in the kernel alike, which is why the
//! check's baseline is the tiled rounding.

use flash_dsl::eval::ParamValues;
use flash_dsl::fp8::{attention_inputs, quantize, Fp8Format, Scaling};
use flash_dsl::model::reference::{self, Problem};

fn main() {
    let seeds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let specs = flash_dsl::parse::parse_str(
        "pub Fp8Window64 { head_dim: 64, dtype: e4m3, mask: window(256) }\n\
         pub Fp8Dense { head_dim: 128, dtype: e4m3 }\n\
         pub Fp8Causal { head_dim: 128, dtype: e4m3, mask: causal }",
    )
    .expect("the declarations parse");
    let (b, n, h) = (1usize, 1000usize, 2usize);
    println!("| variant | inputs | seeds | tiled / plain, largest error: min | median | max | share > 2 |");
    println!("|---|---|---|---|---|---|---|");
    for spec in &specs {
        let d = spec.head_dim_qk as usize;
        for outliers in [false, true] {
            let mut ratios: Vec<f64> = (0..seeds)
                .map(|seed| {
                    let draw = |s: u64| -> Vec<f32> {
                        attention_inputs(b * n * h * d, outliers, s)
                            .iter()
                            .map(|&x| x as f32)
                            .collect()
                    };
                    let block = Scaling::PerBlock { rows: 128 };
                    let dq =
                        |x: &[f32]| quantize(x, [b, n, h, d], block, Fp8Format::E4m3).dequantize();
                    // `S0=208`: the one seed the GPU check ran (the case that failed against the
                    // normalised baseline at 2.02×).
                    let s0 = std::env::var("S0")
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1000 + 3 * seed);
                    let mut p = Problem::random(spec, b, h, h, n, n, ParamValues(Vec::new()), 0);
                    (p.q, p.k, p.v) = (dq(&draw(s0)), dq(&draw(s0 + 1)), dq(&draw(s0 + 2)));
                    let exact = reference::forward(spec, &p);
                    let plain = reference::forward_fp8_plain(spec, &p);
                    let tiled = reference::forward_fp8_tiled(spec, &p, 128);
                    reference::max_abs_diff(&tiled.o, &exact.o)
                        / reference::max_abs_diff(&plain.o, &exact.o)
                })
                .collect();
            ratios.sort_by(f64::total_cmp);
            let over = ratios.iter().filter(|&&r| r > 2.0).count();
            println!(
                "| {} | {} | {seeds} | {:.2} | {:.2} | {:.2} | {over}/{seeds} |",
                spec.name,
                if outliers {
                    "0.1 % outliers ×10"
                } else {
                    "normal"
                },
                ratios[0],
                ratios[ratios.len() / 2],
                ratios[ratios.len() - 1],
            );
        }
    }
}
