//! Naive CPU references of a variant's forward pass.
//!
//! - [`forward`] computes every score in float64 and applies the softmax row by row: the
//!   "ground truth" every kernel and the tiled [`emulate`](crate::model::emulate) are compared with.
//! - [`forward_lowp`] is the "plain same-precision implementation" of the correctness rule
//!   (FlashAttention's): the error a kernel may have against [`forward`] is bounded by a multiple
//!   of the error this one has.
//!
//! Layouts are row-major and contiguous: q `[b, seq_q, hq, dqk]`, k `[b, seq_k, hkv, dqk]`,
//! v `[b, seq_k, hkv, dv]`, o `[b, seq_q, hq, dv]`, lse `[b, hq, seq_q]` in natural-log units.
//! Query head `h` reads key/value head `h / (hq / hkv)` (GQA / MQA). A row with no visible key
//! (or `seq_k = 0`) gives `o = 0` and `lse = -inf`, never NaN.

use crate::dropout::{DropoutFactor, DropoutRng};
use crate::eval::{Env, ParamValues, Point, Sizes};
use crate::spec::VariantSpec;

/// One attention problem: shapes, inputs and parameter values.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// Batch size.
    pub batch: usize,
    /// Query (and output) heads; a multiple of `heads_kv`.
    pub heads_q: usize,
    /// Key/value heads (`heads_q` for MHA, fewer for GQA, 1 for MQA).
    pub heads_kv: usize,
    /// Query positions.
    pub seq_q: usize,
    /// Key/value positions.
    pub seq_k: usize,
    /// `[batch, seq_q, heads_q, head_dim_qk]`.
    pub q: Vec<f64>,
    /// `[batch, seq_k, heads_kv, head_dim_qk]`.
    pub k: Vec<f64>,
    /// `[batch, seq_k, heads_kv, head_dim_v]`.
    pub v: Vec<f64>,
    /// Values of the variant's declared parameters, in declaration order.
    pub params: ParamValues,
    /// The dropout generator's seed and offset (read only by variants with dropout).
    pub rng: DropoutRng,
}

/// Result of a forward pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Output {
    /// `[batch, seq_q, heads_q, head_dim_v]`.
    pub o: Vec<f64>,
    /// `[batch, heads_q, seq_q]`, natural log; `-inf` for rows with no visible key.
    pub lse: Vec<f64>,
    /// (query tile, key tile) pairs computed, over all batches and heads; 0 for the references.
    pub tiles_visited: u64,
    /// (query tile, key tile) pairs skipped as empty; 0 for the references.
    pub tiles_skipped: u64,
}

impl Problem {
    /// A problem with inputs drawn uniformly from `[-1, 1)` by a fixed-seed generator (never
    /// zeros), with the given parameter values.
    #[allow(clippy::too_many_arguments)]
    pub fn random(
        spec: &VariantSpec,
        batch: usize,
        heads_q: usize,
        heads_kv: usize,
        seq_q: usize,
        seq_k: usize,
        params: ParamValues,
        seed: u64,
    ) -> Problem {
        let mut rng = crate::rng::SplitMix(seed);
        let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
        let mut draw = |n: usize| (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect();
        Problem {
            batch,
            heads_q,
            heads_kv,
            seq_q,
            seq_k,
            q: draw(batch * seq_q * heads_q * dqk),
            k: draw(batch * seq_k * heads_kv * dqk),
            v: draw(batch * seq_k * heads_kv * dv),
            params,
            rng: DropoutRng::default(),
        }
    }

    /// Sizes that tensor parameters resolve against.
    pub fn sizes(&self) -> Sizes {
        Sizes {
            batch: self.batch,
            heads: self.heads_q,
            seq_q: self.seq_q,
            seq_k: self.seq_k,
        }
    }

    /// Panics with a clear message unless the shapes agree with `spec`.
    pub fn check(&self, spec: &VariantSpec) {
        let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
        assert!(
            self.heads_kv > 0 && self.heads_q / self.heads_kv * self.heads_kv == self.heads_q,
            "heads_q {} must be a multiple of heads_kv {}",
            self.heads_q,
            self.heads_kv
        );
        for (name, len, want) in [
            (
                "q",
                self.q.len(),
                self.batch * self.seq_q * self.heads_q * dqk,
            ),
            (
                "k",
                self.k.len(),
                self.batch * self.seq_k * self.heads_kv * dqk,
            ),
            (
                "v",
                self.v.len(),
                self.batch * self.seq_k * self.heads_kv * dv,
            ),
        ] {
            assert_eq!(
                len, want,
                "{name} has {len} elements, the shape needs {want}"
            );
        }
    }

    /// Offset of row `(b, pos, head)` in a `[batch, seq, heads, d]` tensor.
    pub(crate) fn row(
        b: usize,
        pos: usize,
        head: usize,
        seq: usize,
        heads: usize,
        d: usize,
    ) -> usize {
        ((b * seq + pos) * heads + head) * d
    }

    /// Key/value head read by query head `h`.
    pub fn kv_head(&self, h: usize) -> usize {
        h / (self.heads_q / self.heads_kv)
    }
}

/// The keys query `i` of `(b, h)` sees under the mask, each with its element's point (score 0
/// until the caller computes it in its own precision). One loop for every CPU model.
pub(crate) fn visible_keys<'e>(
    env: &'e Env,
    seq_k: usize,
    b: usize,
    h: usize,
    i: usize,
) -> impl Iterator<Item = (usize, Point)> + 'e {
    (0..seq_k)
        .map(move |j| {
            let pt = Point {
                b: b as i64,
                h: h as i64,
                q: i as i64,
                k: j as i64,
                s: 0.0,
            };
            (j, pt)
        })
        .filter(|(_, pt)| env.mask(pt))
}

/// Float64 forward pass: `s = scale·q·k`, then the score modification, then the mask (masked
/// keys are left out of the softmax), then `softmax(s)·v`.
///
/// A causal problem of two positions: query 0 sees only key 0, so its output is `v[0]` and its
/// LSE is its one score.
///
/// ```
/// use flash_dsl::eval::ParamValues;
/// use flash_dsl::model::reference::{forward, Problem};
///
/// let spec = flash_dsl::parse::parse_str("Causal { head_dim: 8, dtype: f16, mask: causal }")
///     .unwrap()
///     .remove(0);
/// let p = Problem::random(&spec, 1, 1, 1, 2, 2, ParamValues::none(), 7);
/// let out = forward(&spec, &p);
/// assert_eq!(out.o.len(), 2 * 8); // [batch, seq_q, heads_q, head_dim_v]
/// assert_eq!(&out.o[..8], &p.v[..8]);
/// let s00: f64 = p.q[..8].iter().zip(&p.k[..8]).map(|(a, b)| a * b).sum::<f64>()
///     * spec.softmax_scale();
/// assert!((out.lse[0] - s00).abs() < 1e-12);
/// ```
pub fn forward(spec: &VariantSpec, p: &Problem) -> Output {
    p.check(spec);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let env = Env::new(spec, &p.params, p.sizes());
    let drop = DropoutFactor::new(spec, &p.params, p.rng, p.heads_q);
    let scale = spec.softmax_scale();
    let mut out = Output {
        o: vec![0.0; p.batch * p.seq_q * p.heads_q * dv],
        lse: vec![f64::NEG_INFINITY; p.batch * p.heads_q * p.seq_q],
        ..Output::default()
    };
    let mut scores: Vec<(usize, f64)> = Vec::with_capacity(p.seq_k);
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let kvh = p.kv_head(h);
            for i in 0..p.seq_q {
                let qrow = &p.q[Problem::row(b, i, h, p.seq_q, p.heads_q, dqk)..][..dqk];
                scores.clear();
                for (j, mut pt) in visible_keys(&env, p.seq_k, b, h, i) {
                    let krow = &p.k[Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dqk)..][..dqk];
                    pt.s = scale * dot(qrow, krow);
                    scores.push((j, env.score(&pt)));
                }
                let m = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue; // no visible key: o stays 0, lse stays -inf
                }
                let orow = Problem::row(b, i, h, p.seq_q, p.heads_q, dv);
                let mut l = 0.0;
                for &(j, s) in &scores {
                    let w = (s - m).exp();
                    l += w;
                    let w = w * drop.at(b, h, i, j);
                    let vrow = &p.v[Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dv)..][..dv];
                    for (o, v) in out.o[orow..orow + dv].iter_mut().zip(vrow) {
                        *o += w * v;
                    }
                }
                out.o[orow..orow + dv].iter_mut().for_each(|o| *o /= l);
                out.lse[(b * p.heads_q + h) * p.seq_q + i] = m + l.ln();
            }
        }
    }
    out
}

/// The plain same-precision implementation (as a framework computes attention in bf16/f16
/// without fusion): inputs rounded to the dtype, `q·scale` rounded, `S = q·kᵀ` accumulated in
/// f32 then rounded (a half-precision matmul's output), the score modification applied in f32
/// and rounded, the softmax in f32, `P` rounded before `P·V`, and the output rounded. The LSE is
/// kept in f32. `round` is [`round_bf16`] or [`round_f16`].
pub fn forward_lowp(spec: &VariantSpec, p: &Problem, round: fn(f32) -> f32) -> Output {
    forward_plain(
        spec,
        p,
        PlainRounding {
            input: round,
            dot: dot_f32,
            score: round,
            p: round,
            out: round,
            tiles: None,
        },
    )
}

/// Where a plain implementation rounds: the inputs (and `q·scale`), the score (after the
/// product and after the score modification), the normalised probabilities before `P·V`, the
/// output.
struct PlainRounding {
    input: fn(f32) -> f32,
    /// Q·Kᵀ of one query row and one key row: [`dot_f32`], or how an e4m3 tensor core sums it
    /// ([`dot_e4m3_tensor_core`]).
    dot: fn(&[f32], &[f32]) -> f32,
    score: fn(f32) -> f32,
    p: fn(f32) -> f32,
    out: fn(f32) -> f32,
    /// `Some(n)`: the softmax as a flash kernel runs it, over tiles of `n` keys with a running
    /// max — `p` rounds each tile's unnormalised probabilities (relative to the running max),
    /// the output accumulates them rescaled, and the sum of the unrounded ones divides at the
    /// end. `None`: normalised probabilities, rounded once.
    tiles: Option<usize>,
}

/// The plain implementations' shared body (see [`forward_lowp`], [`forward_fp8_plain`]).
fn forward_plain(spec: &VariantSpec, p: &Problem, r: PlainRounding) -> Output {
    let PlainRounding {
        input: round,
        dot,
        score: round_s,
        p: round_p,
        out: round_out,
        tiles,
    } = r;
    p.check(spec);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let env = Env::new(spec, &p.params, p.sizes());
    let drop = DropoutFactor::new(spec, &p.params, p.rng, p.heads_q);
    let scale = spec.softmax_scale() as f32;
    let q: Vec<f32> =
        p.q.iter()
            .map(|&x| round(round(x as f32) * scale))
            .collect();
    let k: Vec<f32> = p.k.iter().map(|&x| round(x as f32)).collect();
    let v: Vec<f32> = p.v.iter().map(|&x| round(x as f32)).collect();
    let mut out = Output {
        o: vec![0.0; p.batch * p.seq_q * p.heads_q * dv],
        lse: vec![f64::NEG_INFINITY; p.batch * p.heads_q * p.seq_q],
        ..Output::default()
    };
    let mut scores: Vec<(usize, f32)> = Vec::with_capacity(p.seq_k);
    let mut acc = vec![0f32; dv];
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let kvh = p.kv_head(h);
            for i in 0..p.seq_q {
                let qrow = &q[Problem::row(b, i, h, p.seq_q, p.heads_q, dqk)..][..dqk];
                scores.clear();
                for (j, mut pt) in visible_keys(&env, p.seq_k, b, h, i) {
                    let krow = &k[Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dqk)..][..dqk];
                    let s = round_s(dot(qrow, krow));
                    let s = if spec.score.is_some() {
                        pt.s = s as f64;
                        round_s(env.score(&pt) as f32)
                    } else {
                        s
                    };
                    scores.push((j, s));
                }
                let m = scores.iter().map(|s| s.1).fold(f32::NEG_INFINITY, f32::max);
                if m == f32::NEG_INFINITY {
                    continue;
                }
                let orow = Problem::row(b, i, h, p.seq_q, p.heads_q, dv);
                if let Some(n) = tiles {
                    // Tile by tile (keys in order), as the kernel walks them.
                    let (mut m_run, mut l) = (f32::NEG_INFINITY, 0f32);
                    acc.iter_mut().for_each(|a| *a = 0.0);
                    for tile in scores.chunk_by(|a, b| a.0 / n == b.0 / n) {
                        let m_tile = tile.iter().map(|s| s.1).fold(f32::NEG_INFINITY, f32::max);
                        let m_new = m_run.max(m_tile);
                        if m_new == f32::NEG_INFINITY {
                            continue;
                        }
                        let alpha = (m_run - m_new).exp();
                        l *= alpha;
                        acc.iter_mut().for_each(|a| *a *= alpha);
                        for &(j, s) in tile {
                            let e = (s - m_new).exp();
                            l += e;
                            let w = round_p(e);
                            let vrow = &v[Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dv)..][..dv];
                            for (a, v) in acc.iter_mut().zip(vrow) {
                                *a += w * v;
                            }
                        }
                        m_run = m_new;
                    }
                    for (o, a) in out.o[orow..orow + dv].iter_mut().zip(&acc) {
                        *o = round_out(*a / l) as f64;
                    }
                    out.lse[(b * p.heads_q + h) * p.seq_q + i] = (m_run + l.ln()) as f64;
                    continue;
                }
                let l: f32 = scores.iter().map(|&(_, s)| (s - m).exp()).sum();
                acc.iter_mut().for_each(|a| *a = 0.0);
                for &(j, s) in &scores {
                    let mut w = round_p((s - m).exp() / l);
                    if spec.dropout.is_some() {
                        // dropout(P) = P·mask/(1 − p), one more half-precision op.
                        w = round_p(w * drop.at(b, h, i, j) as f32);
                    }
                    let vrow = &v[Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dv)..][..dv];
                    for (a, v) in acc.iter_mut().zip(vrow) {
                        *a += w * v;
                    }
                }
                for (o, a) in out.o[orow..orow + dv].iter_mut().zip(&acc) {
                    *o = round_out(*a) as f64;
                }
                out.lse[(b * p.heads_q + h) * p.seq_q + i] = (m + l.ln()) as f64;
            }
        }
    }
    out
}

/// The plain same-precision implementation of an fp8 variant (FlashAttention's 2× rule for the
/// fp8 forward): `p` holds the *dequantised* inputs (codes times scales), used in f32; `q·scale`
/// and `S` in f32, the score modification applied in f32, the softmax in f32,
/// then `P` — as an fp8 `P·V` product needs it — multiplied by 256, rounded to e4m3 and scaled
/// back before `P·V` in f32; the output is rounded to the output dtype (bf16). The LSE is kept
/// in f32. Dropout is not part of fp8 variants. With `v: bf16` P is rounded to bf16 instead
/// (a bf16 `P·V` product; the ×256 is exact there).
pub fn forward_fp8_plain(spec: &VariantSpec, p: &Problem) -> Output {
    forward_plain(spec, p, fp8_rounding(spec, None))
}

/// [`forward_fp8_plain`] with the softmax as the fp8 kernel runs it: tiles of `block_n` keys, a
/// running max, each tile's probabilities relative to the running max ×256 rounded to e4m3
/// (bf16 with `v: bf16`), the output rescaled as the max moves, divided at the end by the sum
/// of the unrounded probabilities. The same rounding as the plain implementation at another
/// point: the spread between the two is the spread of the fp8 rule's comparison
/// (`06_fp8_rule_spread`).
pub fn forward_fp8_tiled(spec: &VariantSpec, p: &Problem, block_n: usize) -> Output {
    forward_plain(spec, p, fp8_rounding(spec, Some(block_n)))
}

/// [`forward_fp8_tiled`] with Q·Kᵀ summed as an fp8 tensor core sums it where Q and K are e4m3
/// codes ([`dot_e4m3_tensor_core`]; int8 codes sum exactly on the integer tensor cores, and
/// keep [`dot_f32`]): the plain same-precision implementation of an fp8 forward on Hopper,
/// whose products any fp8 implementation runs there. Its LSE carries the accumulator's error —
/// up to ~2·10⁻³ relative with outliers where f32 sums give 10⁻⁷ — the size the GPU check's LSE
/// bound for e4m3 Q·Kᵀ was set from (it is a model of that size, not of each case's bits).
pub fn forward_fp8_tensor_core(spec: &VariantSpec, p: &Problem, block_n: usize) -> Output {
    let mut r = fp8_rounding(spec, Some(block_n));
    if spec
        .fp8
        .is_some_and(|f| f.qk_format == crate::fp8::Fp8Format::E4m3)
    {
        r.dot = dot_e4m3_tensor_core;
    }
    forward_plain(spec, p, r)
}

/// A dot product summed in f32, in order (the plain implementations' Q·Kᵀ).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// A dot product as Hopper's fp8 tensor cores sum it, as a model: 32 products an instruction
/// (the k extent of an e4m3 `wgmma` or `mma`) added to the running sum in an accumulator of 13
/// fraction bits (e8m13, the FP22 format reported for these units), every term — the products
/// and the running sum — cut toward zero at the 13th fraction bit of the largest of them, and
/// the sum cut to 13 fraction bits again. The products themselves are exact (e4m3 × e4m3 needs
/// 8 bits); here they are the dequantised inputs' (codes times scales), whose cuts fall where
/// the codes' would up to the scales' mantissas. What it models is the size of the error — a
/// small product beside a large one (an outlier) losing its low bits — not the unit's exact
/// bits, which are not documented.
pub fn dot_e4m3_tensor_core(a: &[f32], b: &[f32]) -> f32 {
    const FRACTION_BITS: i32 = 13;
    if a.iter().zip(b).any(|(x, y)| !(x * y).is_finite()) {
        return dot_f32(a, b); // NaN and ±inf as f32 sums give them
    }
    let cut = |x: f64, unit: f64| (x / unit).trunc() * unit;
    // A product of two f32 values is a normal f64 (or zero, never passed here): its exponent
    // is in its bits.
    let unit_of = |m: f64| 2f64.powi(((m.to_bits() >> 52) & 0x7ff) as i32 - 1023 - FRACTION_BITS);
    let mut acc = 0f64;
    for (ca, cb) in a.chunks(32).zip(b.chunks(32)) {
        let largest = ca
            .iter()
            .zip(cb)
            .fold(acc.abs(), |m, (&x, &y)| m.max((x as f64 * y as f64).abs()));
        if largest == 0.0 {
            continue;
        }
        // Exact in f64: at most 33 multiples of `unit`, each below 2¹⁴ units.
        let unit = unit_of(largest);
        acc = cut(acc, unit)
            + ca.iter()
                .zip(cb)
                .map(|(&x, &y)| cut(x as f64 * y as f64, unit))
                .sum::<f64>();
        if acc != 0.0 {
            acc = cut(acc, unit_of(acc.abs()));
        }
    }
    acc as f32
}

fn fp8_rounding(spec: &VariantSpec, tiles: Option<usize>) -> PlainRounding {
    fn e4m3_p(w: f32) -> f32 {
        let f = crate::fp8::Fp8Format::E4m3;
        f.decode(f.encode(w * 256.0)) / 256.0
    }
    let v_bf16 = spec.fp8.is_some_and(|f| f.v_bf16);
    PlainRounding {
        input: |x| x,
        dot: dot_f32,
        score: |x| x,
        p: if v_bf16 { round_bf16 } else { e4m3_p },
        out: rounding(spec.dtype),
        tiles,
    }
}

/// Rounds to the nearest bfloat16 (ties to even).
pub fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// Rounds to the nearest IEEE half (ties to even).
pub fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// The rounding of a dtype, for [`forward_lowp`].
pub fn rounding(dtype: crate::spec::DType) -> fn(f32) -> f32 {
    match dtype {
        crate::spec::DType::Bf16 => round_bf16,
        crate::spec::DType::F16 => round_f16,
    }
}

/// Largest absolute elementwise difference, treating two equal infinities as 0 apart and a NaN
/// anywhere as infinitely far.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x == y {
                0.0
            } else if x.is_nan() || y.is_nan() {
                f64::INFINITY
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f64::max)
}

pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{DType, VariantSpec};

    fn dense(d: u32) -> VariantSpec {
        VariantSpec {
            name: "Dense".into(),
            doc: String::new(),
            head_dim_qk: d,
            head_dim_v: d,
            dtype: DType::Bf16,
            scale: None,
            params: vec![],
            mask: None,
            score: None,
            dropout: None,
            sparsity: None,
            fp8: None,
        }
    }

    #[test]
    fn single_key_returns_its_value() {
        let spec = dense(8);
        let p = Problem::random(&spec, 1, 2, 1, 3, 1, ParamValues::none(), 7);
        let out = forward(&spec, &p);
        for i in 0..3 {
            for h in 0..2 {
                let o = &out.o[Problem::row(0, i, h, 3, 2, 8)..][..8];
                assert_eq!(o, &p.v[..8]);
                let s = dot(&p.q[Problem::row(0, i, h, 3, 2, 8)..][..8], &p.k[..8]) / (8f64).sqrt();
                assert!((out.lse[h * 3 + i] - s).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn lowp_error_is_small_but_nonzero() {
        let spec = dense(64);
        let p = Problem::random(&spec, 1, 2, 2, 17, 33, ParamValues::none(), 3);
        let exact = forward(&spec, &p);
        let low = forward_lowp(&spec, &p, round_bf16);
        let err = max_abs_diff(&exact.o, &low.o);
        assert!(err > 0.0 && err < 0.05, "bf16 error {err}");
        let low16 = forward_lowp(&spec, &p, round_f16);
        let err16 = max_abs_diff(&exact.o, &low16.o);
        assert!(
            err16 > 0.0 && err16 < err,
            "f16 error {err16} vs bf16 {err}"
        );
    }

    /// The fp8 kernel's rounding model against the normalised one: both near float64, the tiled
    /// one exact in the LSE (its sum is of unrounded probabilities) and, with the rounding of P
    /// its only error, no worse in RMSE; and with no rounding of P its tiles (running max,
    /// rescales) give the float64 answer up to f32 arithmetic.
    #[test]
    fn fp8_tiled_model_rounds_like_the_plain_one() {
        let spec = dense(64); // no `v: bf16`: P rounded to e4m3
        let rms = |a: &[f64], b: &[f64]| {
            (a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>() / a.len() as f64).sqrt()
        };
        for seed in 0..3 {
            let p = Problem::random(&spec, 1, 2, 2, 200, 300, ParamValues::none(), seed);
            let exact = forward(&spec, &p);
            let plain = forward_fp8_plain(&spec, &p);
            let tiled = forward_fp8_tiled(&spec, &p, 128);
            let (e_plain, e_tiled) = (rms(&plain.o, &exact.o), rms(&tiled.o, &exact.o));
            assert!(
                e_tiled > 0.0 && e_tiled <= 1.25 * e_plain,
                "{e_tiled} vs {e_plain}"
            );
            assert!(max_abs_diff(&tiled.lse, &exact.lse) < 1e-5);
            let exact_p = PlainRounding {
                input: |x| x,
                dot: dot_f32,
                score: |x| x,
                p: |x| x,
                out: |x| x,
                tiles: Some(128),
            };
            let unrounded = forward_plain(&spec, &p, exact_p);
            assert!(max_abs_diff(&unrounded.o, &exact.o) < 1e-5);
        }
    }

    /// The tensor-core model: exact while every term keeps its bits, a small product beside a
    /// large one cut at the large one's 13th fraction bit (f32 keeps it), the running sum taking
    /// part in the cut; and an fp8 plain forward through it: int8 Q·Kᵀ unchanged (exact on the
    /// integer tensor cores), e4m3 Q·Kᵀ off float64 in the LSE by more than the f32 sums, and
    /// still close.
    #[test]
    fn tensor_core_dot_cuts_small_terms_beside_large_ones() {
        let small = [3.0f32, -5.0, 0.5, 7.25];
        assert_eq!(dot_e4m3_tensor_core(&small, &[1.0; 4]), 5.75);
        // 2¹⁴ beside 1: the unit is 2, the 1 is lost; f32 keeps it.
        let (a, b) = ([128.0f32, 1.0], [128.0f32, 1.0]);
        assert_eq!(dot_e4m3_tensor_core(&a, &b), 16384.0);
        assert_eq!(dot_f32(&a, &b), 16385.0);
        // 40 ones then 2¹⁴ in the next instruction: the first 32 sum exactly; in the second
        // the unit is 2, each of its eight ones is lost and the running sum is cut to even.
        let mut x = vec![1.0f32; 41];
        x.extend([0.0f32; 23]);
        let mut y = vec![1.0f32; 40];
        y.push(16384.0);
        y.extend([0.0f32; 23]);
        assert_eq!(dot_e4m3_tensor_core(&x, &y), 16384.0 + 32.0);
        x[0] = 0.0; // a running sum of 31 → 30
        assert_eq!(dot_e4m3_tensor_core(&x, &y), 16384.0 + 30.0);
        assert_eq!(dot_f32(&x, &y), 16384.0 + 39.0);
        // Non-finite products as f32 sums give them.
        assert!(dot_e4m3_tensor_core(&[f32::NAN, 0.0], &[1.0, 0.0]).is_nan());
        assert_eq!(
            dot_e4m3_tensor_core(&[f32::INFINITY, 1.0], &[2.0, 1.0]),
            f32::INFINITY
        );

        let e4m3 = crate::parse::parse_str("V { head_dim: 64, dtype: e4m3, scales: per_head }")
            .unwrap()
            .remove(0);
        let int8 =
            crate::parse::parse_str("V { head_dim: 64, dtype: e4m3, qk: int8, scales: per_head }")
                .unwrap()
                .remove(0);
        for spec in [&e4m3, &int8] {
            let p = Problem::random(spec, 1, 2, 2, 100, 300, ParamValues::none(), 5);
            let exact = forward(spec, &p);
            let f32_sums = forward_fp8_tiled(spec, &p, 128);
            let tc = forward_fp8_tensor_core(spec, &p, 128);
            let lse_f32 = max_abs_diff(&f32_sums.lse, &exact.lse);
            let lse_tc = max_abs_diff(&tc.lse, &exact.lse);
            if spec.fp8.unwrap().qk_format == crate::fp8::Fp8Format::Int8 {
                assert_eq!(tc.lse, f32_sums.lse);
            } else {
                assert!(lse_tc > lse_f32 && lse_tc < 1e-2, "{lse_tc} vs {lse_f32}");
            }
        }
    }

    #[test]
    fn rounding_helpers() {
        assert_eq!(round_bf16(1.0 + 1.0 / 512.0), 1.0);
        assert_eq!(round_f16(1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(round_f16(0.1), half::f16::from_f32(0.1).to_f32());
    }
}
