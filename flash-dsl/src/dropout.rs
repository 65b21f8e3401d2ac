//! Dropout's random numbers: Philox4x32-7 ([`ROUNDS`]) keyed by the user's seed and offset and counted by
//! the element's (batch, head, query, key), so the keep mask is a pure function of those and of
//! the probability — the same for every kernel family, tile size, launch order and pass
//! (the backward regenerates it; no N×N mask is ever stored). The kernels' generator
//! (`templates/prelude.cuh`, `flash::philox`) and this one are the same function, bit for bit;
//! the GPU check compares their masks.
//!
//! # How positions map to Philox calls
//!
//! One call gives 128 bits, eight 16-bit halves, so one call decides eight elements: the
//! eight a thread of a tensor-core accumulator holds for a 16 × 16 block of (query, key) —
//! queries `a` and `a + 8`, keys `2c`, `2c + 1`, `2c + 8`, `2c + 9` (a in 0..8, c in 0..4, both
//! relative to the block). With `q = 16·qb + 8·qh + a` and `k = 16·kb + 8·kh + 2c + kl`:
//!
//! - counter = (`4·kb + c`, `8·qb + a`, `b·heads_q + h`, low 32 bits of the offset),
//! - key = (low 32 bits of the seed, high 32 bits of the seed ⊕ high 32 bits of the offset),
//! - element (qh, kh, kl) takes the 16-bit half `kl` (low half first) of output word `2·qh + kh`,
//!   and its uniform is the low 15 bits of that half.
//!
//! 15-bit uniforms keep the kept fraction within 2⁻¹⁶ of 1 − p (8-bit decisions, as some
//! kernels use, are off by up to 0.002 at p = 0.1), and leave each half's top bit free: the
//! kernels compare both halves of a word at once, in three instructions, with that bit as the
//! guard that stops a borrow crossing halves. An element is kept when its uniform is at least the
//! threshold `round(p · 32768)`, so p = 0 keeps everything. Kept elements are scaled by
//! 1/(1 − p) while the kept fraction is 1 − thr/32768; the two differ by at most 2⁻¹⁶/(1 − p)
//! relative (7·10⁻⁶ at p = 0.1, 1.5 % at p = 0.999), and above p ≈ 0.99998 the threshold is
//! capped at 32767, so 1/32768 of the elements is still kept.
//!
//! The seed and the offset's high words meet in the key by exclusive or, so two states whose
//! seeds and offsets differ by the same value in their high 32 bits share a mask; frameworks
//! advance the offset's low word, and the seed is theirs to choose.

use serde::{Deserialize, Serialize};

use crate::eval::{ParamValue, ParamValues};
use crate::spec::{Dropout, VariantSpec};

/// The dropout generator's state of one launch: `seed` picks the stream, `offset` the
/// sub-stream (advance it between launches that must not share a mask, as frameworks do).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DropoutRng {
    /// The user's seed: its low word and (xor the offset's high word) its high word form the
    /// Philox key.
    pub seed: u64,
    /// The sub-stream: its low word is the Philox counter's last word, its high word is mixed
    /// into the key.
    pub offset: u64,
}

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// The rounds of dropout's Philox4x32. Salmon et al. (SC'11) found Philox4x32 passing all of
/// TestU01's BigCrush from 7 rounds; Random123's default of 10 adds a safety margin of three.
/// Dropout takes 7, as FlashAttention-2's dropout does: the generator is most of a dropout
/// kernel's extra instructions (two wide multiplies and two three-way exclusive ors per round),
/// and its statistics are tested here (`tests/dropout_stats.rs`: kept fraction, neighbour
/// correlations, seeds) on these 7-round streams.
pub const ROUNDS: usize = 7;

/// Philox4x32 with `rounds` rounds (Salmon et al., SC'11), as Random123 defines it.
pub fn philox4x32(ctr: [u32; 4], key: [u32; 2], rounds: usize) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for round in 0..rounds {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 as u64 * c[0] as u64;
        let p1 = M1 as u64 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// The number of 15-bit uniform values (`0..UNIFORMS`) a decision draws from.
pub const UNIFORMS: u32 = 1 << 15;

/// The threshold of probability `p` (an `f32`, as the kernels receive it): elements whose
/// 15-bit uniform is below it are dropped. `round(p·32768)` computed in `f32` exactly as the
/// kernels do (`p·32768` is exact; `+ 0.5` then `floor`), capped at 32767.
pub fn threshold(p: f32) -> u32 {
    let t = (p * UNIFORMS as f32 + 0.5).floor();
    if t <= 0.0 {
        0
    } else {
        (t as u32).min(UNIFORMS - 1)
    }
}

/// `1 / (1 − p)`, the factor kept elements are scaled by, as the kernels compute it (f32).
pub fn keep_scale(p: f32) -> f32 {
    1.0 / (1.0 - p)
}

impl DropoutRng {
    /// The Philox key of this state.
    pub fn key(self) -> [u32; 2] {
        [
            self.seed as u32,
            (self.seed >> 32) as u32 ^ (self.offset >> 32) as u32,
        ]
    }

    /// The eight uniforms of the call that covers (`q`, `k`) of head `head = b·heads_q + h`.
    pub fn block(self, head: u64, q: u64, k: u64) -> [u32; 4] {
        let ctr = [
            ((k >> 4) * 4 + ((k >> 1) & 3)) as u32,
            ((q >> 4) * 8 + (q & 7)) as u32,
            head as u32,
            self.offset as u32,
        ];
        philox4x32(ctr, self.key(), ROUNDS)
    }

    /// The 15-bit uniform of element (`q`, `k`) of head `head = b·heads_q + h`.
    pub fn uniform(self, head: u64, q: u64, k: u64) -> u32 {
        let r = self.block(head, q, k);
        let word = r[(2 * ((q >> 3) & 1) + ((k >> 3) & 1)) as usize];
        (word >> (16 * (k & 1))) & (UNIFORMS - 1)
    }

    /// Whether element (`q`, `k`) of head `head` survives dropout with threshold `thr`
    /// ([`threshold`]).
    pub fn keep(self, head: u64, q: u64, k: u64, thr: u32) -> bool {
        self.uniform(head, q, k) >= thr
    }

    /// The keep mask of a whole launch, `[batch, heads_q, seq_q, seq_k]`, 1 = kept (one call per
    /// key pair, which shares it, rather than one per element).
    pub fn mask(self, p: f32, batch: usize, heads_q: usize, seq_q: usize, seq_k: usize) -> Vec<u8> {
        let thr = threshold(p);
        let mut out = Vec::with_capacity(batch * heads_q * seq_q * seq_k);
        for head in 0..(batch * heads_q) as u64 {
            for q in 0..seq_q as u64 {
                let word_q = 2 * ((q >> 3) & 1);
                let mut r = [0u32; 4];
                for k in 0..seq_k as u64 {
                    if k & 1 == 0 {
                        r = self.block(head, q, k); // the call of keys k and k + 1
                    }
                    let word = r[(word_q + ((k >> 3) & 1)) as usize];
                    out.push((((word >> (16 * (k & 1))) & (UNIFORMS - 1)) >= thr) as u8);
                }
            }
        }
        out
    }
}

/// Whether param `i` of `spec` is its dropout probability.
pub fn is_probability(spec: &VariantSpec, i: usize) -> bool {
    spec.dropout == Some(Dropout::Param(i))
}

/// The probability of `spec`'s dropout for these parameter values (`None` without dropout), as
/// the `f32` the kernels receive.
pub fn probability(spec: &VariantSpec, params: &ParamValues) -> Option<f32> {
    match spec.dropout? {
        Dropout::Const(v) => Some(v.get() as f32),
        Dropout::Param(i) => match params.0.get(i) {
            Some(ParamValue::Float(x)) => Some(*x as f32),
            other => panic!(
                "dropout parameter `{}` needs a float value, got {other:?}",
                spec.params[i].name
            ),
        },
    }
}

/// Dropout as the CPU models apply it: the factor each probability is multiplied by before
/// P·V — 0 for a dropped element, 1/(1 − p) for a kept one, 1 without dropout.
#[derive(Debug, Clone, Copy)]
pub struct DropoutFactor {
    rng: DropoutRng,
    /// `None` without dropout.
    thr: Option<u32>,
    scale: f64,
    heads_q: usize,
}

impl DropoutFactor {
    /// The factors of one launch: `spec`'s probability for these `params` (panics unless it lies
    /// in `[0, 1)`), the generator state `rng`, and the number of query heads `heads_q`, which
    /// flattens (b, h) into the generator's head counter `b·heads_q + h`.
    pub fn new(spec: &VariantSpec, params: &ParamValues, rng: DropoutRng, heads_q: usize) -> Self {
        let p = probability(spec, params);
        if let Some(p) = p {
            assert!(
                (0.0..1.0).contains(&p),
                "dropout probability {p} of `{}` must lie in [0, 1)",
                spec.name
            );
        }
        DropoutFactor {
            rng,
            thr: p.map(threshold),
            scale: p.map_or(1.0, |p| keep_scale(p) as f64),
            heads_q,
        }
    }
    /// The factor of element (`b`, `h`, `q`, `k`).
    pub fn at(&self, b: usize, h: usize, q: usize, k: usize) -> f64 {
        match self.thr {
            None => 1.0,
            Some(thr) => {
                let head = (b * self.heads_q + h) as u64;
                if self.rng.keep(head, q as u64, k as u64, thr) {
                    self.scale
                } else {
                    0.0
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's published known-answer vectors for Philox4x32-7 (what dropout uses) and
    /// Philox4x32-10.
    #[test]
    fn philox_known_answers() {
        let pi = (
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0],
        );
        assert_eq!(ROUNDS, 7);
        assert_eq!(
            philox4x32([0; 4], [0; 2], 7),
            [0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48]
        );
        assert_eq!(
            philox4x32([u32::MAX; 4], [u32::MAX; 2], 7),
            [0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662]
        );
        assert_eq!(
            philox4x32(pi.0, pi.1, 7),
            [0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a]
        );
        assert_eq!(
            philox4x32([0; 4], [0; 2], 10),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32([u32::MAX; 4], [u32::MAX; 2], 10),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32(pi.0, pi.1, 10),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn thresholds() {
        assert_eq!(threshold(0.0), 0);
        assert_eq!(threshold(0.5), 16384);
        assert_eq!(threshold(0.1), 3277); // 3276.8 rounds up
        assert_eq!(threshold(0.99999999), 32767);
    }

    /// Every element of a 16 × 16 block reads a distinct (call, word, half), and the eight
    /// elements of one call are exactly one accumulator thread's: queries a, a + 8 and keys
    /// 2c, 2c + 1, 2c + 8, 2c + 9.
    #[test]
    fn one_call_covers_one_thread_fragment() {
        let rng = DropoutRng { seed: 7, offset: 3 };
        let mut seen = std::collections::HashSet::new();
        for q in 16..32u64 {
            for k in 32..48u64 {
                let r = rng.block(5, q, k);
                let (a, c) = (q & 7, (k >> 1) & 3);
                assert_eq!(r, rng.block(5, 16 + a, 32 + 2 * c), "q {q} k {k}");
                let slot = (2 * ((q >> 3) & 1) + ((k >> 3) & 1), k & 1);
                assert!(seen.insert((a, c, slot)));
            }
        }
        assert_eq!(seen.len(), 256);
    }
}
