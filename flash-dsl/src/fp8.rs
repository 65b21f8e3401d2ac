//! FP8 on the host, bit for bit as Hopper converts: the e4m3 and e5m2 formats, block
//! quantisation with f32 scales, the random Hadamard rotation of incoherent processing, and the
//! smoothing of K — the CPU side of FP8 attention, which the kernels must reproduce and the
//! accuracy of every scaling scheme is measured with.
//!
//! **Formats.** `e4m3` is the OCP "FN" format Hopper implements: bias 7, 3 mantissa bits,
//! subnormals down to 2⁻⁹, largest finite ±448, no infinities, `0x7F` / `0xFF` NaN. `e5m2`: bias
//! 15, 2 mantissa bits, largest finite ±57344, infinities and NaNs as in IEEE. [`Fp8Format::encode`]
//! is PTX's `cvt.rn.satfinite.{e4m3,e5m2}x2.f32`: round to nearest, ties to even; magnitudes at or
//! above the largest finite value (infinities included) saturate to it; NaN becomes the canonical
//! NaN `0x7F`.
//!
//! **Scaling.** A quantised tensor holds fp8 codes and one f32 scale per group of elements
//! ([`Scaling`]: the whole tensor, one (batch, head), a block of consecutive rows of one
//! (batch, head), or — V only — one channel of one (batch, head)): `x ≈ decode(code) · scale`, with `scale = amax / max` (1 for an all-zero group)
//! and `code = encode(x · (max / amax))` in f32, so each group's largest magnitude lands on the
//! format's largest finite value (a group so small that `max / amax` overflows keeps scale 1).
//!
//! **Incoherent processing** ([`hadamard_rotate`]): Q and K multiplied along the head dimension by
//! the same orthogonal matrix `H·diag(signs) / √d` (a Walsh–Hadamard matrix with random signs)
//! leave `Q·Kᵀ` unchanged but spread an outlier channel over all channels, so a block's scale is
//! no longer set by one large entry. **Smoothing** ([`smooth_keys`]): subtracting from K its mean
//! over the keys of each (batch, head) changes every score of a query row by the same amount,
//! which the softmax cancels (O is unchanged; the LSE moves by `scale · q·mean`).

use crate::rng::SplitMix;

/// An 8-bit code format: the two fp8 formats, or symmetric int8 (Q and K of an fp8 variant
/// declared `qk: int8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Fp8Format {
    /// 4 exponent bits (bias 7), 3 mantissa bits, ±448, no infinities.
    E4m3,
    /// 5 exponent bits (bias 15), 2 mantissa bits, ±57344.
    E5m2,
    /// Two's-complement integers −127 … 127 (−128 is never written: the grid is symmetric).
    /// Uniform steps: after the Hadamard rotation has spread the outliers, a block's values use
    /// all 8 bits, where e4m3 keeps 3 bits of precision at every magnitude.
    Int8,
}

impl Fp8Format {
    /// The format's name in the language and in kernel names.
    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4m3 => "e4m3",
            Fp8Format::E5m2 => "e5m2",
            Fp8Format::Int8 => "int8",
        }
    }

    /// The operand type of a wgmma over these codes (`e4m3`, `e5m2`, `s8`).
    pub fn mma_type(self) -> &'static str {
        match self {
            Fp8Format::Int8 => "s8",
            f => f.name(),
        }
    }

    /// Mantissa bits (the float formats; int8 returns before asking).
    fn mbits(self) -> i32 {
        match self {
            Fp8Format::E4m3 => 3,
            Fp8Format::E5m2 => 2,
            Fp8Format::Int8 => unreachable!("int8 has no mantissa"),
        }
    }

    /// Exponent bias (the float formats; int8 returns before asking).
    fn bias(self) -> i32 {
        match self {
            Fp8Format::E4m3 => 7,
            Fp8Format::E5m2 => 15,
            Fp8Format::Int8 => unreachable!("int8 has no exponent"),
        }
    }

    /// The largest finite magnitude: 448 (e4m3), 57344 (e5m2), 127 (int8).
    pub fn max(self) -> f32 {
        match self {
            Fp8Format::E4m3 => 448.0,
            Fp8Format::E5m2 => 57344.0,
            Fp8Format::Int8 => 127.0,
        }
    }

    /// The code of the largest finite magnitude (positive).
    fn max_code(self) -> u8 {
        match self {
            Fp8Format::E4m3 => 0x7E,
            Fp8Format::E5m2 => 0x7B,
            Fp8Format::Int8 => 0x7F,
        }
    }

    /// `x` as this format, as `cvt.rn.satfinite` rounds it (see the module docs).
    ///
    /// ```
    /// use flash_dsl::fp8::Fp8Format::{E4m3, E5m2};
    ///
    /// assert_eq!(E4m3.encode(1.0), 0x38);
    /// assert_eq!(E4m3.encode(448.0), 0x7E);
    /// assert_eq!(E4m3.encode(1e9), 0x7E); // saturates
    /// assert_eq!(E4m3.encode(-f32::INFINITY), 0xFE);
    /// assert_eq!(E4m3.encode(f32::NAN), 0x7F);
    /// assert_eq!(E4m3.encode(2f32.powi(-9)), 0x01); // the smallest subnormal
    /// assert_eq!(E4m3.encode(1.0625), 0x38); // a tie between 1 and 1.125: to even
    /// assert_eq!(E5m2.encode(57344.0), 0x7B);
    ///
    /// // int8: nearest, ties to even, saturating at ±127, NaN to 0 — as the kernels'
    /// // `__float2int_rn` of the clamped value.
    /// use flash_dsl::fp8::Fp8Format::Int8;
    /// assert_eq!(Int8.encode(2.5), 2);
    /// assert_eq!(Int8.encode(-3.5), (-4i8) as u8);
    /// assert_eq!(Int8.encode(-1e9), (-127i8) as u8);
    /// assert_eq!(Int8.encode(f32::NAN), 0);
    /// ```
    pub fn encode(self, x: f32) -> u8 {
        if self == Fp8Format::Int8 {
            if x.is_nan() {
                return 0;
            }
            return x.clamp(-127.0, 127.0).round_ties_even() as i8 as u8;
        }
        if x.is_nan() {
            return 0x7F;
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs() as f64;
        if a >= self.max() as f64 {
            return sign | self.max_code();
        }
        let (m, bias) = (self.mbits(), self.bias());
        let emin = 1 - bias; // exponent of the smallest normal
        let e = if a == 0.0 {
            emin
        } else {
            (a.log2().floor() as i32).max(emin)
        };
        // `a` in units of the spacing at exponent e (exact: a power-of-two scaling).
        let quantum = 2f64.powi(e - m);
        let q = (a / quantum).round_ties_even() as u32;
        // Subnormals (e = emin, q < 2^m) encode as q with exponent field 0; q = 2^m is the
        // smallest normal, which the same formula gives. A normal that rounds up to 2^(m+1)
        // carries into the next exponent, which the formula also gives.
        let code = if e == emin && q < (1 << m) {
            q
        } else {
            (((e + bias) as u32) << m) + (q - (1 << m))
        };
        // Below the largest finite value before rounding, at most it after (checked above).
        sign | code.min(self.max_code() as u32) as u8
    }

    /// The value of a code (NaN codes give NaN, e5m2's infinity codes ±∞).
    ///
    /// ```
    /// use flash_dsl::fp8::Fp8Format::{E4m3, E5m2};
    ///
    /// assert_eq!(E4m3.decode(0x7E), 448.0);
    /// assert_eq!(E4m3.decode(0x01), 2f32.powi(-9));
    /// assert!(E4m3.decode(0xFF).is_nan());
    /// assert_eq!(E5m2.decode(0x7C), f32::INFINITY);
    /// ```
    pub fn decode(self, b: u8) -> f32 {
        if self == Fp8Format::Int8 {
            return b as i8 as f32;
        }
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let (m, bias) = (self.mbits(), self.bias());
        let ebits = (b as u32 & 0x7F) >> m;
        let mant = b as u32 & ((1 << m) - 1);
        let emax_field = (1u32 << (7 - m)) - 1;
        match self {
            Fp8Format::E4m3 if b & 0x7F == 0x7F => return f32::NAN,
            Fp8Format::E5m2 if ebits == emax_field => {
                return if mant == 0 {
                    sign * f32::INFINITY
                } else {
                    f32::NAN
                };
            }
            _ => {}
        }
        let v = if ebits == 0 {
            mant as f32 * 2f32.powi(1 - bias - m)
        } else {
            (1.0 + mant as f32 / (1 << m) as f32) * 2f32.powi(ebits as i32 - bias)
        };
        sign * v
    }
}

/// What an fp8 variant declares: the codes' format (`dtype: e4m3`) and the grouping of Q's, K's
/// and V's scales (`scales: per_block(128)`, the default, `per_head` or `per_tensor`; V's may be
/// grouped apart, `v_scales:`, and per channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Fp8Spec {
    /// The format of V's codes, and of Q's and K's unless `qk_format` says otherwise.
    pub format: Fp8Format,
    /// The format of Q's and K's codes: `format`, or [`Fp8Format::Int8`] (`qk: int8`), whose
    /// Q·Kᵀ runs on the integer tensor cores (s8 × s8 → s32, the e4m3 rate on Hopper). Absent
    /// from records written before it existed: those are e4m3 throughout (the only format the
    /// language accepts for `format`).
    #[serde(default = "e4m3")]
    pub qk_format: Fp8Format,
    /// V in bf16 instead of codes (`v: bf16`): P·V runs as a bf16 product (half the e4m3 rate)
    /// with P in bf16, and V has no scales — what removes V's e4m3 error, the floor of the
    /// accuracy of every Q/K scheme (`05_int8_qk_accuracy`).
    #[serde(default)]
    pub v_bf16: bool,
    /// V's codes in rows, `[batch, seq_k, heads_kv, d]` as K's (`v_layout: rows`), transposed
    /// by the kernel in shared memory for the P·V product, instead of transposed beforehand
    /// (`v_layout: transposed`, the default: a transposing quantisation writes that). An fp8
    /// KV cache kept in rows is read as it is.
    #[serde(default)]
    pub v_rows: bool,
    /// One scale per block of 128 positions of each (batch, head), per (batch, head), or one for
    /// the whole tensor; the scale tensors' shapes are [`Scaling::scale_shape`]'s. V's too,
    /// unless `v_scales` says otherwise.
    pub scaling: Scaling,
    /// V's grouping where it differs from `scaling` (`v_scales:`): any of Q's and K's, or
    /// [`Scaling::PerChannel`], which only V can take (Q·Kᵀ sums over the channels, so per-channel
    /// scales of Q or K cannot leave the product; P·V does not, so V's leave it as one factor
    /// per output column). `None`: as `scaling` (also for records written before it existed).
    #[serde(default)]
    pub v_scales: Option<Scaling>,
}

fn e4m3() -> Fp8Format {
    Fp8Format::E4m3
}

impl Fp8Spec {
    /// The variant's code formats in kernel names: `e4m3`, `e4m3_qkint8` with int8 Q and K,
    /// and `_vbf16` after either with bf16 V.
    pub fn tag(&self) -> String {
        let mut t = if self.qk_format == self.format {
            self.format.name().to_string()
        } else {
            format!("{}_qk{}", self.format.name(), self.qk_format.name())
        };
        if self.v_bf16 {
            t.push_str("_vbf16");
        }
        if self.v_rows {
            t.push_str("_vrows");
        }
        if let Some(v) = self.v_own() {
            t.push_str(match v {
                Scaling::PerBlock { .. } => "_vblock",
                Scaling::PerHead => "_vhead",
                Scaling::PerTensor => "_vtensor",
                Scaling::PerChannel => "_vchannel",
            });
        }
        t
    }

    /// How V's scales are grouped: `v_scales`, else `scaling`.
    pub fn v_scaling(&self) -> Scaling {
        self.v_scales.unwrap_or(self.scaling)
    }

    /// V's grouping where it is one of its own: `v_scales` unless it equals `scaling` (or V is
    /// bf16, without scales). Kernel names and the generated source follow this, so a spec that
    /// spells out Q's grouping for V builds the plain kernel.
    pub fn v_own(&self) -> Option<Scaling> {
        self.v_scales.filter(|&v| v != self.scaling && !self.v_bf16)
    }

    /// Whether a tile's V codes share one scale with every other tile of the (batch, head): V
    /// scaled per head, per tensor or per channel (bf16 V has none). Then the output accumulates
    /// P·V in fixed units, the kernel never rescales it for a new V scale, and the scale (or
    /// each channel's) is applied once, in the epilogue.
    pub fn v_fixed(&self) -> bool {
        self.v_bf16 || !matches!(self.v_scaling(), Scaling::PerBlock { .. })
    }
}

/// How a tensor's elements are grouped under one scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Scaling {
    /// One scale for the whole tensor (cuDNN's FP8 attention).
    PerTensor,
    /// One scale per (batch, head).
    PerHead,
    /// One scale per block of `rows` consecutive positions of one (batch, head) (FlashAttention-3's
    /// block quantisation with 128 queries / keys).
    PerBlock {
        /// Positions per block.
        rows: usize,
    },
    /// One scale per channel (column of the head dim) of each (batch, head), over every
    /// position: V only (`v_scales: per_channel`; SageAttention's grouping for V).
    PerChannel,
}

impl Scaling {
    /// The shape of the scale tensor of a `[batch, seq, heads, d]` tensor.
    ///
    /// ```
    /// use flash_dsl::fp8::Scaling;
    ///
    /// assert_eq!(Scaling::PerTensor.scale_shape([2, 1000, 8, 128]), vec![1]);
    /// assert_eq!(Scaling::PerHead.scale_shape([2, 1000, 8, 128]), vec![2, 8]);
    /// assert_eq!(Scaling::PerBlock { rows: 128 }.scale_shape([2, 1000, 8, 128]), vec![2, 8, 8]);
    /// assert_eq!(Scaling::PerChannel.scale_shape([2, 1000, 8, 128]), vec![2, 8, 128]);
    /// ```
    pub fn scale_shape(self, [b, s, h, d]: [usize; 4]) -> Vec<usize> {
        match self {
            Scaling::PerTensor => vec![1],
            Scaling::PerHead => vec![b, h],
            Scaling::PerBlock { rows } => vec![b, h, s.div_ceil(rows.max(1))],
            Scaling::PerChannel => vec![b, h, d],
        }
    }

    /// The scale index of element (b, pos, h, c) (row-major over [`Scaling::scale_shape`]).
    fn group(self, [_, s, h, d]: [usize; 4], b: usize, pos: usize, head: usize, c: usize) -> usize {
        match self {
            Scaling::PerTensor => 0,
            Scaling::PerHead => b * h + head,
            Scaling::PerBlock { rows } => {
                let rows = rows.max(1);
                (b * h + head) * s.div_ceil(rows) + pos / rows
            }
            Scaling::PerChannel => (b * h + head) * d + c,
        }
    }
}

/// A quantised `[batch, seq, heads, d]` tensor: fp8 codes (same layout) and f32 scales.
#[derive(Debug, Clone, PartialEq)]
pub struct Quantized {
    /// The format of the codes.
    pub format: Fp8Format,
    /// The grouping of the scales.
    pub scaling: Scaling,
    /// `[batch, seq, heads, d]`.
    pub shape: [usize; 4],
    /// One code per element, row-major over `shape`.
    pub codes: Vec<u8>,
    /// One scale per group, row-major over [`Scaling::scale_shape`].
    pub scales: Vec<f32>,
}

/// Quantises `x` (`[batch, seq, heads, d]`, row-major, values as f32) with one scale per group of
/// `scaling` (see the module docs for the rule).
pub fn quantize(x: &[f32], shape: [usize; 4], scaling: Scaling, format: Fp8Format) -> Quantized {
    let [b, s, h, d] = shape;
    assert_eq!(
        x.len(),
        b * s * h * d,
        "x has {} elements for shape {shape:?}",
        x.len()
    );
    let n_groups: usize = scaling.scale_shape(shape).iter().product();
    let mut amax = vec![0f32; n_groups];
    let index = |bi: usize, pos: usize, hi: usize| ((bi * s + pos) * h + hi) * d;
    for bi in 0..b {
        for pos in 0..s {
            for hi in 0..h {
                let row = &x[index(bi, pos, hi)..][..d];
                for (c, v) in row.iter().enumerate() {
                    let g = scaling.group(shape, bi, pos, hi, c);
                    amax[g] = amax[g].max(v.abs());
                }
            }
        }
    }
    // A group too small for `max / amax` to be finite keeps the scale 1, like an all-zero one.
    let usable = |a: f32| a > 0.0 && a.is_finite() && (format.max() / a).is_finite();
    let scales: Vec<f32> = amax
        .iter()
        .map(|&a| if usable(a) { a / format.max() } else { 1.0 })
        .collect();
    let inv: Vec<f32> = amax
        .iter()
        .map(|&a| if usable(a) { format.max() / a } else { 1.0 })
        .collect();
    let mut codes = vec![0u8; x.len()];
    for bi in 0..b {
        for pos in 0..s {
            for hi in 0..h {
                let at = index(bi, pos, hi);
                for j in 0..d {
                    let g = scaling.group(shape, bi, pos, hi, j);
                    codes[at + j] = format.encode(x[at + j] * inv[g]);
                }
            }
        }
    }
    Quantized {
        format,
        scaling,
        shape,
        codes,
        scales,
    }
}

impl Quantized {
    /// The values the codes and scales stand for, `decode(code) · scale`, in float64.
    pub fn dequantize(&self) -> Vec<f64> {
        let [b, s, h, d] = self.shape;
        let mut out = vec![0f64; self.codes.len()];
        for bi in 0..b {
            for pos in 0..s {
                for hi in 0..h {
                    let at = ((bi * s + pos) * h + hi) * d;
                    for j in 0..d {
                        let sc = self.scales[self.scaling.group(self.shape, bi, pos, hi, j)] as f64;
                        out[at + j] = self.format.decode(self.codes[at + j]) as f64 * sc;
                    }
                }
            }
        }
        out
    }
}

/// The position, inside its group of 32, at which an fp8 P·V product wants key `c % 32` of V.
///
/// The first product leaves thread `t` of a quad (`t = lane % 4`) holding, for each of the four
/// 8-column tiles `j` of a 32-key chunk, columns `8j + 2t` and `8j + 2t + 1` of P; an 8-bit A
/// operand wants thread `t` to hold columns `4t … 4t + 3` and `16 + 4t … 16 + 4t + 3`. Rather than
/// exchange bytes between threads, the keys are renumbered: the thread's eight columns, in
/// register order, become its eight A positions, and V is stored in the same order (the product
/// sums over keys, so any order used by both operands gives the same O). The A layout assumed is
/// `mma.sync.m16n8k32`'s for 8-bit types, which a warp's slice of a wgmma register operand
/// follows; no FP8 attention kernel uses it yet, and its GPU check is what will confirm it.
///
/// ```
/// use flash_dsl::fp8::mma_key_order;
///
/// // Thread 1 holds columns 2, 3, 10, 11, 18, 19, 26, 27: they become positions 4…7, 20…23.
/// let got: Vec<usize> = [2, 3, 10, 11, 18, 19, 26, 27].iter().map(|&c| mma_key_order(c)).collect();
/// assert_eq!(got, [4, 5, 6, 7, 20, 21, 22, 23]);
/// // A permutation of each group of 32.
/// let mut all: Vec<usize> = (0..32).map(mma_key_order).collect();
/// all.sort();
/// assert_eq!(all, (0..32).collect::<Vec<_>>());
/// assert_eq!(mma_key_order(32 + 2), 32 + 4);
/// ```
pub fn mma_key_order(c: usize) -> usize {
    let (group, cc) = (c / 32 * 32, c % 32);
    let (j, t, i) = (cc / 8, (cc % 8) / 2, cc % 2);
    group
        + if j < 2 {
            4 * t + 2 * j + i
        } else {
            16 + 4 * t + 2 * (j - 2) + i
        }
}

/// Q, K and V quantised on the host as an fp8 variant declares them ([`Fp8Spec`]): Q's and K's
/// codes in their format, V's e4m3 codes (none with `v: bf16`), every scale grouped as
/// declared — what the quantisation kernels write (their GPU check compares the two bit for
/// bit). The tuner's fp8 timer and the GPU check draw their inputs through it.
#[derive(Debug, Clone)]
pub struct QuantizedOperands {
    /// Q's codes (`qk_format`) and scales.
    pub q: Quantized,
    /// K's codes (`qk_format`) and scales.
    pub k: Quantized,
    /// `None` with `v: bf16` (V is passed as bf16, without scales).
    pub v: Option<Quantized>,
}

/// Quantises `q` (`shape_q`), `k` and `v` (`shape_k`, all `[batch, seq, heads, d]` row-major) as
/// `f` declares.
pub fn quantize_operands(
    f: &Fp8Spec,
    [q, k, v]: [&[f32]; 3],
    shape_q: [usize; 4],
    shape_k: [usize; 4],
) -> QuantizedOperands {
    QuantizedOperands {
        q: quantize(q, shape_q, f.scaling, f.qk_format),
        k: quantize(k, shape_k, f.scaling, f.qk_format),
        v: (!f.v_bf16).then(|| quantize(v, shape_k, f.v_scaling(), Fp8Format::E4m3)),
    }
}

impl QuantizedOperands {
    /// V's codes as the kernel reads them: in rows (`v_layout: rows`), or transposed for the
    /// P·V product ([`transpose_for_pv`], blocks of 128 keys); `None` with `v: bf16`.
    pub fn v_codes(&self, rows: bool) -> Option<Vec<u8>> {
        self.v.as_ref().map(|v| {
            if rows {
                v.codes.clone()
            } else {
                transpose_for_pv(&v.codes, v.shape, crate::spec::FP8_SCALE_BLOCK as usize)
            }
        })
    }
}

/// Codes `[batch, seq, heads, d]` (row-major) as the transposed V of an fp8 P·V product:
/// `[batch, heads, d, seq_padded]`, `seq_padded` the sequence rounded up to whole blocks of
/// `block_rows` (padding zeros), positions reordered by [`mma_key_order`].
pub fn transpose_for_pv(codes: &[u8], [b, s, h, d]: [usize; 4], block_rows: usize) -> Vec<u8> {
    let sp = s.div_ceil(block_rows.max(1)) * block_rows.max(1);
    let mut out = vec![0u8; b * h * d * sp];
    for bi in 0..b {
        for pos in 0..s {
            for hi in 0..h {
                for c in 0..d {
                    out[((bi * h + hi) * d + c) * sp + mma_key_order(pos)] =
                        codes[((bi * s + pos) * h + hi) * d + c];
                }
            }
        }
    }
    out
}

/// `d` random signs (±1) from `seed`: the diagonal of incoherent processing's rotation.
pub fn random_signs(d: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix(seed);
    (0..d)
        .map(|_| if rng.below(2) == 0 { 1.0 } else { -1.0 })
        .collect()
}

/// Multiplies every row of `x` (rows of `d = signs.len()` values, a power of two) by the
/// orthogonal matrix `diag(signs)·H / √d`, `H` the Walsh–Hadamard matrix (a fast transform,
/// `d log d` per row). Applied to Q and K with the same signs it leaves `Q·Kᵀ` unchanged.
///
/// ```
/// use flash_dsl::fp8::{hadamard_rotate, random_signs};
///
/// let signs = random_signs(8, 1);
/// let (mut q, mut k) = (vec![3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], vec![0.5; 8]);
/// let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
/// let before = dot(&q, &k);
/// hadamard_rotate(&mut q, &signs);
/// hadamard_rotate(&mut k, &signs);
/// assert!((dot(&q, &k) - before).abs() < 1e-12);
/// // The outlier is spread over every channel.
/// assert!(q.iter().all(|x| (x.abs() - 3.0 / 8f64.sqrt()).abs() < 1e-12));
/// ```
pub fn hadamard_rotate(x: &mut [f64], signs: &[f64]) {
    let norm = 1.0 / (signs.len() as f64).sqrt();
    rotate_rows(x, signs, norm);
}

/// [`hadamard_rotate`] in f32, operation for operation as the quantisation kernel does it (each
/// value times its sign, the butterflies stage by stage, then times `norm`, every step rounded to
/// f32), so that the kernel's codes can be checked bit for bit.
pub fn hadamard_rotate_f32(x: &mut [f32], signs: &[f32], norm: f32) {
    rotate_rows(x, signs, norm);
}

/// Each row of `d = signs.len()` values times its signs, the Walsh–Hadamard butterflies stage by
/// stage, then times `norm`, in the arithmetic of `T` (f64 for the model, f32 for the kernel's
/// operation order).
fn rotate_rows<T>(x: &mut [T], signs: &[T], norm: T)
where
    T: Copy + std::ops::Add<Output = T> + std::ops::Sub<Output = T> + std::ops::MulAssign,
{
    let d = signs.len();
    assert!(
        d.is_power_of_two(),
        "the Hadamard rotation needs a power-of-two head dim; got {d}"
    );
    assert_eq!(x.len() % d, 0, "rows of {d} values");
    for row in x.chunks_mut(d) {
        for (v, s) in row.iter_mut().zip(signs) {
            *v *= *s;
        }
        let mut len = 1;
        while len < d {
            for i in (0..d).step_by(2 * len) {
                for j in i..i + len {
                    let (a, b) = (row[j], row[j + len]);
                    row[j] = a + b;
                    row[j + len] = a - b;
                }
            }
            len *= 2;
        }
        for v in row.iter_mut() {
            *v *= norm;
        }
    }
}

/// Subtracts from K (`[batch, seq, heads, d]`) its mean over the keys of each (batch, head) and
/// returns the means (`[batch, heads, d]`): the softmax of every query row is unchanged.
pub fn smooth_keys(k: &mut [f64], shape: [usize; 4]) -> Vec<f64> {
    let [b, s, h, d] = shape;
    let mut means = vec![0f64; b * h * d];
    for bi in 0..b {
        for hi in 0..h {
            let m = &mut means[(bi * h + hi) * d..][..d];
            for pos in 0..s {
                let row = &k[((bi * s + pos) * h + hi) * d..][..d];
                for (acc, v) in m.iter_mut().zip(row) {
                    *acc += v;
                }
            }
            for v in m.iter_mut() {
                *v /= s.max(1) as f64;
            }
            for pos in 0..s {
                let row = &mut k[((bi * s + pos) * h + hi) * d..][..d];
                for (v, mu) in row.iter_mut().zip(m.iter()) {
                    *v -= mu;
                }
            }
        }
    }
    means
}

/// [`smooth_keys`] in f32, operation for operation as the quantisation kernel does it
/// (`QuantSpec::smooth`): per (batch, head) and block of `block_rows` positions, each column's
/// sum in row order; the blocks' sums in block order; `mean = sum / seq`; each value minus its
/// column's mean — every step one f32 operation rounded to nearest, so the kernel's codes can be
/// checked bit for bit. `x` is `[batch, seq, heads, d]`; returns the means `[batch, heads, d]`.
pub fn smooth_keys_f32(x: &mut [f32], shape: [usize; 4], block_rows: usize) -> Vec<f32> {
    let [b, s, h, d] = shape;
    let mut means = vec![0f32; b * h * d];
    for bi in 0..b {
        for hi in 0..h {
            let at = |pos: usize| ((bi * s + pos) * h + hi) * d;
            let m = &mut means[(bi * h + hi) * d..][..d];
            for (c, mean) in m.iter_mut().enumerate() {
                let mut total = 0f32;
                for r0 in (0..s).step_by(block_rows.max(1)) {
                    let mut sum = 0f32;
                    for pos in r0..(r0 + block_rows).min(s) {
                        sum += x[at(pos) + c];
                    }
                    total += sum;
                }
                *mean = total / s.max(1) as f32;
            }
            for pos in 0..s {
                for (v, mu) in x[at(pos)..][..d].iter_mut().zip(m.iter()) {
                    *v -= mu;
                }
            }
        }
    }
    means
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operands of a declaration: Q and K in `qk_format`, V in e4m3 (rows or transposed
    /// for P·V, the same codes), none with bf16 V; every scale grouped as declared.
    #[test]
    fn operands_quantize_as_declared() {
        let (sq, sk) = ([1, 3, 2, 8], [1, 5, 1, 8]);
        let draw = |n: usize, k: f32| (0..n).map(|i| ((i as f32) * k).sin()).collect::<Vec<_>>();
        let (q, k, v) = (draw(48, 0.7), draw(40, 1.3), draw(40, 2.1));
        let f = Fp8Spec {
            format: Fp8Format::E4m3,
            qk_format: Fp8Format::Int8,
            v_bf16: false,
            v_rows: false,
            scaling: Scaling::PerHead,
            v_scales: None,
        };
        let x = quantize_operands(&f, [&q, &k, &v], sq, sk);
        assert_eq!(
            x.q.codes,
            quantize(&q, sq, Scaling::PerHead, Fp8Format::Int8).codes
        );
        assert_eq!(x.k.scales.len(), 1);
        let vq = x.v.as_ref().expect("e4m3 V");
        assert_eq!(vq.format, Fp8Format::E4m3);
        assert_eq!(x.v_codes(true).unwrap(), vq.codes);
        assert_eq!(
            x.v_codes(false).unwrap(),
            transpose_for_pv(&vq.codes, sk, 128)
        );
        let b16 = quantize_operands(&Fp8Spec { v_bf16: true, ..f }, [&q, &k, &v], sq, sk);
        assert!(b16.v.is_none() && b16.v_codes(false).is_none());
        // `v_scales: per_channel`: V alone per channel, Q and K as before.
        let fc = Fp8Spec {
            v_scales: Some(Scaling::PerChannel),
            ..f
        };
        let xc = quantize_operands(&fc, [&q, &k, &v], sq, sk);
        assert_eq!(xc.q.codes, x.q.codes);
        let vc = xc.v.expect("e4m3 V");
        assert_eq!(vc.scaling, Scaling::PerChannel);
        assert_eq!(vc, quantize(&v, sk, Scaling::PerChannel, Fp8Format::E4m3));
        assert_eq!(vc.scales.len(), 8);
    }

    #[test]
    fn smoothing_in_f32_matches_the_f64_model() {
        let shape = [2, 300, 3, 16];
        let x64 = attention_inputs(shape.iter().product(), true, 9);
        let mut k64 = x64.clone();
        let mu64 = smooth_keys(&mut k64, shape);
        let mut k32: Vec<f32> = x64.iter().map(|&v| v as f32).collect();
        let mu32 = smooth_keys_f32(&mut k32, shape, 128);
        for (a, e) in mu32.iter().zip(&mu64) {
            assert!((*a as f64 - e).abs() < 1e-5, "{a} vs {e}");
        }
        for (a, e) in k32.iter().zip(&k64) {
            assert!((*a as f64 - e).abs() < 1e-5, "{a} vs {e}");
        }
        // Each (batch, head, column) of the smoothed keys sums to about zero.
        let [b, s, h, d] = shape;
        for i in 0..b * h * d {
            let (bi, hi, c) = (i / (h * d), (i / d) % h, i % d);
            let sum: f64 = (0..s)
                .map(|p| k32[((bi * s + p) * h + hi) * d + c] as f64)
                .sum();
            assert!(sum.abs() < 1e-3, "{sum}");
        }
    }

    #[test]
    fn every_code_round_trips_and_ties_go_to_even() {
        for f in [Fp8Format::E4m3, Fp8Format::E5m2] {
            let mut finite = Vec::new();
            for c in 0..=255u8 {
                let v = f.decode(c);
                if v.is_finite() {
                    // -0.0 and 0.0 keep their sign bit.
                    assert_eq!(f.encode(v), c, "{f:?} {c:#04x} = {v}");
                    if c < 0x80 {
                        finite.push((v, c));
                    }
                }
            }
            finite.sort_by(|a, b| a.0.total_cmp(&b.0));
            assert_eq!(finite.last().unwrap().0, f.max());
            // Between neighbours: below the midpoint to the lower, above it to the upper, at it
            // to the one with an even code.
            for w in finite.windows(2) {
                let ((lo, cl), (hi, ch)) = (w[0], w[1]);
                let mid = (lo as f64 + hi as f64) / 2.0;
                let even = if cl % 2 == 0 { cl } else { ch };
                assert_eq!(f.encode(mid as f32), even, "{f:?} tie {lo}..{hi}");
                let below = (mid - (hi as f64 - lo as f64) / 8.0) as f32;
                let above = (mid + (hi as f64 - lo as f64) / 8.0) as f32;
                assert_eq!(f.encode(below), cl, "{f:?} below {mid}");
                assert_eq!(f.encode(above), ch, "{f:?} above {mid}");
                assert_eq!(f.encode(-below), cl | 0x80);
            }
            // Saturation, infinities, NaN.
            for x in [f.max() * 1.01, 1e30, f32::INFINITY] {
                assert_eq!(f.decode(f.encode(x)), f.max());
                assert_eq!(f.decode(f.encode(-x)), -f.max());
            }
            assert_eq!(f.encode(f32::NAN), 0x7F);
            // Below half the smallest subnormal: zero.
            assert_eq!(f.encode(f.decode(1) / 2.0 * 0.99), 0);
        }
    }

    #[test]
    fn int8_codes_round_trip_and_round_to_nearest_even() {
        let f = Fp8Format::Int8;
        // Every code but −128 (never written: the grid is symmetric) decodes to its integer and
        // encodes back.
        for c in 0..=255u8 {
            let v = f.decode(c);
            assert_eq!(v, c as i8 as f32);
            if c != 0x80 {
                assert_eq!(f.encode(v), c, "{c:#04x}");
            }
        }
        // Ties to even, below and above the midpoint to the nearer, saturation at ±127.
        for (x, want) in [
            (0.5f32, 0i8),
            (1.5, 2),
            (-2.5, -2),
            (2.4999, 2),
            (2.5001, 3),
            (126.5, 126),
            (127.4, 127),
            (1e9, 127),
            (-1e9, -127),
            (f32::INFINITY, 127),
            (f32::NEG_INFINITY, -127),
        ] {
            assert_eq!(f.encode(x), want as u8, "{x}");
        }
        assert_eq!(f.encode(f32::NAN), 0);
        // Block scales land each group's largest magnitude on 127.
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.37).collect();
        let q = quantize(&x, [1, 4, 1, 16], Scaling::PerTensor, f);
        assert_eq!(q.scales, [x[63] / 127.0]);
        assert_eq!(q.codes[63], 127);
        assert!(q.codes.iter().all(|&c| c != 0x80));
    }

    #[test]
    fn block_scales_map_each_group_max_to_the_format_max() {
        let shape = [2, 300, 3, 16];
        let mut rng = SplitMix(3);
        let x: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|_| rng.normal() as f32 * 5.0)
            .collect();
        for scaling in [
            Scaling::PerTensor,
            Scaling::PerHead,
            Scaling::PerBlock { rows: 128 },
            Scaling::PerChannel,
        ] {
            let q = quantize(&x, shape, scaling, Fp8Format::E4m3);
            assert_eq!(
                q.scales.len(),
                scaling.scale_shape(shape).iter().product::<usize>()
            );
            let back = q.dequantize();
            // Each element within half a step of e4m3 (2⁻⁴ relative) of its group's scale grid.
            for (i, (&v, &w)) in x.iter().zip(&back).enumerate() {
                let [_, s, h, d] = shape;
                let (bi, pos, hi) = (i / (s * h * d), i / (h * d) % s, i / d % h);
                let sc = q.scales[scaling.group(shape, bi, pos, hi, i % d)] as f64;
                let err = (v as f64 - w).abs();
                assert!(
                    err <= (v.abs() as f64 / 16.0).max(sc * 2f64.powi(-10)),
                    "{v} vs {w}"
                );
            }
            // Every group's largest magnitude is exactly the format's largest value.
            let mut top = vec![0u8; q.scales.len()];
            for (i, &c) in q.codes.iter().enumerate() {
                let [_, s, h, d] = shape;
                let g = scaling.group(shape, i / (s * h * d), i / (h * d) % s, i / d % h, i % d);
                top[g] = top[g].max(c & 0x7F);
            }
            assert!(top.iter().all(|&c| c == 0x7E), "{scaling:?}");
        }
    }

    #[test]
    fn a_group_too_small_for_its_inverse_keeps_scale_one() {
        // amax 1e-37: 448 / amax overflows f32; the group keeps scale 1 (its codes flush to 0)
        // instead of saturating every element through an infinite inverse.
        let x = vec![1e-37f32, -5e-38, 0.0, 2e-38];
        let q = quantize(&x, [1, 1, 1, 4], Scaling::PerTensor, Fp8Format::E4m3);
        assert_eq!(q.scales, [1.0]);
        assert_eq!(q.codes, [0, 0x80, 0, 0]);
    }

    #[test]
    fn smoothing_leaves_every_row_of_scores_shifted_by_a_constant() {
        let shape = [1, 50, 2, 8];
        let mut rng = SplitMix(9);
        let k: Vec<f64> = (0..800).map(|_| rng.normal() + 3.0).collect();
        let q: Vec<f64> = (0..8).map(|_| rng.normal()).collect();
        let mut ks = k.clone();
        smooth_keys(&mut ks, shape);
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let shift: Vec<f64> = (0..50)
            .map(|p| dot(&q, &k[p * 16..][..8]) - dot(&q, &ks[p * 16..][..8]))
            .collect();
        assert!(shift.iter().all(|s| (s - shift[0]).abs() < 1e-9));
    }

    #[test]
    fn the_p_cast_attention_is_the_reference_attention_when_p_is_exact() {
        use crate::model::reference::{forward, Problem};
        let (n, h, d) = (37usize, 2usize, 16usize);
        let spec = crate::parse::parse_str("Dense { head_dim: 16, dtype: bf16 }")
            .unwrap()
            .remove(0);
        let len = n * h * d;
        let (q, k, v) = (
            attention_inputs(len, true, 4),
            attention_inputs(len, true, 5),
            attention_inputs(len, true, 6),
        );
        let problem = Problem {
            batch: 1,
            heads_q: h,
            heads_kv: h,
            seq_q: n,
            seq_k: n,
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            params: crate::eval::ParamValues::none(),
            rng: Default::default(),
        };
        let want = forward(&spec, &problem).o;
        let got = attention_p_cast((&q, &k, &v), [1, n, h, d], n, d, PCast::Exact);
        let diff = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(diff < 1e-12, "{diff}");
        // P in e4m3 moves O, by at most a few e4m3 steps of P's share.
        let cast = attention_p_cast(
            (&q, &k, &v),
            [1, n, h, d],
            n,
            d,
            PCast::E4m3 { scale: 256.0 },
        );
        let moved = got
            .iter()
            .zip(&cast)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(moved > 0.0 && moved < 0.5, "{moved}");
    }

    #[test]
    fn the_f32_rotation_is_the_f64_one_rounded() {
        for d in [64usize, 128, 256] {
            let signs = random_signs(d, d as u64);
            let x: Vec<f64> = attention_inputs(3 * d, true, 1);
            let (mut a, mut b) = (x.clone(), x.iter().map(|&v| v as f32).collect::<Vec<f32>>());
            hadamard_rotate(&mut a, &signs);
            let s32: Vec<f32> = signs.iter().map(|&s| s as f32).collect();
            hadamard_rotate_f32(&mut b, &s32, (1.0 / (d as f64).sqrt()) as f32);
            for (u, v) in a.iter().zip(&b) {
                assert!(
                    (u - *v as f64).abs() <= 1e-5 * (1.0 + u.abs()),
                    "d{d}: {u} vs {v}"
                );
            }
        }
    }

    #[test]
    fn rotation_lowers_the_error_of_attention_on_outlier_inputs() {
        // The accuracy table's headline (examples/examples/04_fp8_accuracy.rs has the whole table):
        // on inputs with outliers, block scales with the Hadamard rotation give O a lower RMSE
        // than per-tensor scales; on plain normal inputs the schemes are within a few percent.
        use crate::model::reference::{forward, Problem};
        let (n, h, d) = (256usize, 1usize, 128usize);
        let spec = crate::parse::parse_str("Dense { head_dim: 128, dtype: bf16 }")
            .unwrap()
            .remove(0);
        let shape = [1, n, h, d];
        let problem = |q: Vec<f64>, k: Vec<f64>, v: Vec<f64>| Problem {
            batch: 1,
            heads_q: h,
            heads_kv: h,
            seq_q: n,
            seq_k: n,
            q,
            k,
            v,
            params: crate::eval::ParamValues::none(),
            rng: Default::default(),
        };
        for (outliers, at_least) in [(true, 1.2), (false, 0.9)] {
            let len = n * h * d;
            let (q, k, v) = (
                attention_inputs(len, outliers, 1),
                attention_inputs(len, outliers, 2),
                attention_inputs(len, outliers, 3),
            );
            let exact = forward(&spec, &problem(q.clone(), k.clone(), v.clone())).o;
            let rmse = |scheme: &Fp8Scheme| {
                let (qq, kq, vq) =
                    quantize_qkv(scheme, Fp8Format::E4m3, (&q, &k, &v), (shape, shape), 5);
                let o = forward(&spec, &problem(qq, kq, vq)).o;
                let se: f64 = o.iter().zip(&exact).map(|(a, e)| (a - e) * (a - e)).sum();
                (se / o.len() as f64).sqrt()
            };
            let ratio = rmse(&SCHEMES[0]) / rmse(&SCHEMES[3]);
            assert!(ratio >= at_least, "outliers {outliers}: {ratio}");
        }
    }
}

/// One quantisation scheme of FP8 attention: the scales' grouping, and whether Q and K are
/// rotated (incoherent processing) and K smoothed before they are quantised. V is quantised with
/// the same grouping (over keys), never rotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Scheme {
    /// A short label for tables.
    pub name: &'static str,
    /// How Q, K and V are grouped under scales.
    pub scaling: Scaling,
    /// Rotate Q and K by the same random Hadamard matrix first.
    pub hadamard: bool,
    /// Subtract from K its mean over the keys first.
    pub smooth: bool,
}

/// The schemes of the accuracy table (issue 11's list), per-tensor first.
pub const SCHEMES: [Fp8Scheme; 5] = [
    Fp8Scheme {
        name: "per-tensor",
        scaling: Scaling::PerTensor,
        hadamard: false,
        smooth: false,
    },
    Fp8Scheme {
        name: "per-head",
        scaling: Scaling::PerHead,
        hadamard: false,
        smooth: false,
    },
    Fp8Scheme {
        name: "per-block128",
        scaling: Scaling::PerBlock { rows: 128 },
        hadamard: false,
        smooth: false,
    },
    Fp8Scheme {
        name: "per-block128+hadamard",
        scaling: Scaling::PerBlock { rows: 128 },
        hadamard: true,
        smooth: false,
    },
    Fp8Scheme {
        name: "per-block128+hadamard+smooth",
        scaling: Scaling::PerBlock { rows: 128 },
        hadamard: true,
        smooth: true,
    },
];

/// `n` inputs of attention as FlashAttention-3's FP8 evaluation draws them: standard normal, and
/// with `outliers` 0.1 % of the entries (chosen at random) multiplied by 10.
pub fn attention_inputs(n: usize, outliers: bool, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix(seed);
    (0..n)
        .map(|_| {
            let x = rng.normal();
            if outliers && rng.below(1000) == 0 {
                10.0 * x
            } else {
                x
            }
        })
        .collect()
}

/// Q, K and V after a scheme's quantisation, dequantised (float64, `[batch, seq, heads, d]`),
/// with the rotation already applied to Q and K (which leaves `Q·Kᵀ` unchanged, so attention of
/// the returned tensors approximates attention of the originals) and K smoothed (which leaves the
/// softmax unchanged).
pub fn quantize_qkv(
    scheme: &Fp8Scheme,
    format: Fp8Format,
    (q, k, v): (&[f64], &[f64], &[f64]),
    (shape_q, shape_k): ([usize; 4], [usize; 4]),
    seed: u64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut q, mut k) = (q.to_vec(), k.to_vec());
    if scheme.hadamard {
        let signs = random_signs(shape_q[3], seed);
        hadamard_rotate(&mut q, &signs);
        hadamard_rotate(&mut k, &signs);
    }
    if scheme.smooth {
        smooth_keys(&mut k, shape_k);
    }
    let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let dq = |x: &[f64], shape| quantize(&f32s(x), shape, scheme.scaling, format).dequantize();
    (dq(&q, shape_q), dq(&k, shape_k), dq(v, shape_k))
}

/// How an FP8 kernel's second product sees P: exact (the input quantisation alone), or each
/// probability scaled by `scale`, rounded to e4m3 and scaled back (a power of two keeps the
/// scaling exact; 256 moves the smallest probabilities that matter out of e4m3's subnormals).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PCast {
    /// P stays in float64.
    Exact,
    /// P is rounded to e4m3 after multiplying by this scale.
    E4m3 {
        /// The scale applied before the rounding (1 or a power of two).
        scale: f64,
    },
}

/// Dense attention in float64 (`[batch, seq, heads, d]` inputs, MHA, scale 1/√d), with P cast as
/// `p_cast` says: probabilities relative to each row's final maximum (the best case of an online
/// softmax, whose running maximum only grows), the row sums from the unrounded probabilities as
/// a kernel accumulates them in fp32. Returns O `[batch, seq_q, heads, dv]`.
pub fn attention_p_cast(
    (q, k, v): (&[f64], &[f64], &[f64]),
    [b, sq, h, d]: [usize; 4],
    sk: usize,
    dv: usize,
    p_cast: PCast,
) -> Vec<f64> {
    let scale = 1.0 / (d as f64).sqrt();
    let mut o = vec![0f64; b * sq * h * dv];
    let mut s = vec![0f64; sk];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..sq {
                let qr = &q[((bi * sq + i) * h + hi) * d..][..d];
                let mut m = f64::NEG_INFINITY;
                for (j, sj) in s.iter_mut().enumerate() {
                    let kr = &k[((bi * sk + j) * h + hi) * d..][..d];
                    *sj = scale * qr.iter().zip(kr).map(|(x, y)| x * y).sum::<f64>();
                    m = m.max(*sj);
                }
                let mut l = 0.0;
                let out = &mut o[((bi * sq + i) * h + hi) * dv..][..dv];
                for (j, &sj) in s.iter().enumerate() {
                    let p = (sj - m).exp();
                    l += p;
                    let pc = match p_cast {
                        PCast::Exact => p,
                        PCast::E4m3 { scale } => {
                            Fp8Format::E4m3.decode(Fp8Format::E4m3.encode((p * scale) as f32))
                                as f64
                                / scale
                        }
                    };
                    let vr = &v[((bi * sk + j) * h + hi) * dv..][..dv];
                    for (acc, x) in out.iter_mut().zip(vr) {
                        *acc += pc * x;
                    }
                }
                for acc in out.iter_mut() {
                    *acc /= l;
                }
            }
        }
    }
    o
}
