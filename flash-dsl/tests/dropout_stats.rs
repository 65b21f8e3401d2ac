//! Statistics of the dropout generator (`flash_dsl::dropout`): the keep mask must be what
//! dropout promises — each element kept with probability 1 − p, independently of every other
//! element and of every other (seed, offset) — not merely a deterministic function of the
//! position. The kernels' generator is the same function bit for bit (the GPU check compares
//! masks), so these CPU statistics are the kernels' statistics.
//!
//! Every bound below is stated as a multiple of the standard deviation the statistic would
//! have if the generator were ideal, so a failure means a real defect rather than bad luck
//! (5σ or more: a false alarm about once in 1.7 million runs per assertion).
//!
//! The tests share one launch's uniforms (`[6 heads = 2 batches × 3 heads, 1023, 1637]`,
//! ≈ 1.0·10⁷ elements; odd sizes so partial 16 × 16 blocks at the edges are covered) built
//! with one Philox call per eight elements; `fast_path_matches_keep` pins that fast path to
//! [`DropoutRng::keep`]/[`DropoutRng::uniform`], so every statistic is about the real
//! generator (15-bit uniforms: the low 15 bits of each 16-bit half). Run with `--nocapture`
//! to see the measured values.

use flash_dsl::dropout::{threshold, DropoutRng, UNIFORMS};
use std::sync::OnceLock;

const BATCH: u64 = 2;
const HEADS_Q: u64 = 3;
const HEADS: u64 = BATCH * HEADS_Q;
const SEQ_Q: u64 = 1023;
const SEQ_K: u64 = 1637;

/// The state of the shared launch: seed and offset with nonzero high words, so the key's
/// second word and the counter's last word are both exercised.
const RNG: DropoutRng = DropoutRng {
    seed: 0x5EED_1234_89AB_CDEF,
    offset: 0x0000_0007_0000_0041,
};

/// The 15-bit uniforms of a `[heads, seq_q, seq_k]` launch (row-major), computed with one
/// Philox call per eight elements: the call of (`q0 + a`, `k0 + 2c`) in the 16 × 16 block at
/// (`q0`, `k0`) covers queries `q0 + a`, `q0 + 8 + a` and keys `k0 + 2c + {0, 1, 8, 9}`;
/// element (qh, kh, kl) takes the low 15 bits of half `kl` of word `2·qh + kh` (each half's top
/// bit is unused). Elements outside the launch (edge blocks of odd sizes) are skipped.
fn uniforms(rng: DropoutRng, heads: u64, seq_q: u64, seq_k: u64) -> Vec<u16> {
    let mut out = vec![0u16; (heads * seq_q * seq_k) as usize];
    for head in 0..heads {
        for q0 in (0..seq_q).step_by(16) {
            for a in 0..8 {
                if q0 + a >= seq_q {
                    break;
                }
                for k0 in (0..seq_k).step_by(16) {
                    for c in 0..4 {
                        if k0 + 2 * c >= seq_k {
                            break;
                        }
                        let r = rng.block(head, q0 + a, k0 + 2 * c);
                        for qh in 0..2 {
                            let q = q0 + 8 * qh + a;
                            if q >= seq_q {
                                continue;
                            }
                            let row = ((head * seq_q + q) * seq_k) as usize;
                            for kh in 0..2 {
                                let word = r[(2 * qh + kh) as usize];
                                for kl in 0..2 {
                                    let k = k0 + 8 * kh + 2 * c + kl;
                                    if k < seq_k {
                                        out[row + k as usize] =
                                            ((word >> (16 * kl)) & 0x7fff) as u16;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The shared launch's uniforms, built once for all tests.
fn grid() -> &'static [u16] {
    static GRID: OnceLock<Vec<u16>> = OnceLock::new();
    GRID.get_or_init(|| uniforms(RNG, HEADS, SEQ_Q, SEQ_K))
}

fn at(head: u64, q: u64, k: u64) -> usize {
    ((head * SEQ_Q + q) * SEQ_K + k) as usize
}

/// The fast path the statistics use must be the generator itself: its uniforms equal
/// `uniform` (15-bit) and its decisions equal `keep` (and `mask`) element by element, over a
/// region with partial blocks at both edges, several heads and batches, and several
/// probabilities.
#[test]
fn fast_path_matches_keep() {
    let (batch, heads_q, seq_q, seq_k) = (2usize, 2usize, 37usize, 53usize);
    let heads = (batch * heads_q) as u64;
    let fast = uniforms(RNG, heads, seq_q as u64, seq_k as u64);
    for head in 0..heads {
        for q in 0..seq_q as u64 {
            for k in 0..seq_k as u64 {
                let u = fast[((head * seq_q as u64 + q) * seq_k as u64 + k) as usize] as u32;
                assert!(u < UNIFORMS, "head {head} q {q} k {k}: {u} is not 15-bit");
                assert_eq!(u, RNG.uniform(head, q, k), "head {head} q {q} k {k}");
            }
        }
    }
    for p in [0.1f32, 0.5, 0.9] {
        let thr = threshold(p);
        let mask = RNG.mask(p, batch, heads_q, seq_q, seq_k);
        for (i, (&u, &m)) in fast.iter().zip(&mask).enumerate() {
            let (i, sq, sk) = (i as u64, seq_q as u64, seq_k as u64);
            let (head, q, k) = (i / (sq * sk), (i / sk) % sq, i % sk);
            assert_eq!(u as u32 >= thr, RNG.keep(head, q, k, thr), "p {p} at {i}");
            assert_eq!(m, (u as u32 >= thr) as u8, "p {p} at {i}");
        }
    }
    // The shared grid's corner agrees too (it is built by the same function, with other sizes).
    let g = grid();
    for (head, q, k) in [(0, 0, 0), (5, 1022, 1636), (3, 1015, 1629), (1, 8, 9)] {
        assert_eq!(g[at(head, q, k)] as u32, RNG.uniform(head, q, k));
    }
}

/// Dropout's expectation is only right if the kept fraction is 1 − p: the kernels scale kept
/// elements by 1/(1 − p), so a biased fraction biases every output. Over ≈ 10⁷ decisions the
/// ideal fraction's standard deviation is at most 1.6·10⁻⁴, so the asserted 10⁻³ is > 6σ (and
/// the 15-bit threshold's own rounding error, ≤ 2⁻¹⁶, is far inside it).
#[test]
fn kept_fraction_is_one_minus_p() {
    let g = grid();
    let n = g.len() as f64;
    assert!(n >= 1e7, "{n} decisions");
    for p in [0.1f32, 0.5] {
        let thr = threshold(p);
        let kept = g.iter().filter(|&&u| u as u32 >= thr).count() as f64;
        let frac = kept / n;
        let want = 1.0 - p as f64;
        let sigma = (want * (1.0 - want) / n).sqrt();
        println!(
            "kept fraction p={p}: {frac:.6} (1-p = {want}, diff {:+.2e} = {:+.2}σ, N = {n})",
            frac - want,
            (frac - want) / sigma
        );
        assert!(
            (frac - want).abs() < 1e-3,
            "p {p}: kept {frac}, want {want}"
        );
    }
}

/// One neighbour relation: element (head, q, k) paired with (head + dh, q + dq, k + dk), over
/// the pairs where `only(q, k)` holds.
struct Shift {
    name: &'static str,
    dh: u64,
    dq: u64,
    dk: u64,
    only: fn(u64, u64) -> bool,
}

/// Query rows the correlation pairs start from (a multiple of 16, so "same call" relations
/// cover whole blocks): ≥ 1.8·10⁶ pairs per relation from 3/8 of the launch, which keeps the
/// debug build's runtime down.
const PHI_ROWS: u64 = 384;

/// The phi (Pearson) correlation of the keep indicators `u >= thr` at each of two thresholds
/// over a shift's pairs (first elements in query rows `0..PHI_ROWS`), and the number of pairs.
fn phi(g: &[u16], s: &Shift, thr: [u32; 2]) -> ([f64; 2], f64) {
    // Per threshold: count of x = 1, of y = 1, of x = y = 1.
    let (mut nx, mut ny, mut nxy) = ([0u64; 2], [0u64; 2], [0u64; 2]);
    let mut n = 0u64;
    for head in 0..HEADS - s.dh {
        for q in 0..PHI_ROWS {
            let xs = &g[at(head, q, 0)..at(head, q, SEQ_K - s.dk)];
            let ys = &g[at(head + s.dh, q + s.dq, s.dk)..at(head + s.dh, q + s.dq, SEQ_K)];
            for (k, (&x, &y)) in xs.iter().zip(ys).enumerate() {
                if !(s.only)(q, k as u64) {
                    continue;
                }
                n += 1;
                for i in 0..2 {
                    let (bx, by) = ((x as u32 >= thr[i]) as u64, (y as u32 >= thr[i]) as u64);
                    nx[i] += bx;
                    ny[i] += by;
                    nxy[i] += bx & by;
                }
            }
        }
    }
    let nf = n as f64;
    let r = |i: usize| {
        let (x, y, xy) = (nx[i] as f64, ny[i] as f64, nxy[i] as f64);
        (nf * xy - x * y) / (x * (nf - x) * y * (nf - y)).sqrt()
    };
    ([r(0), r(1)], nf)
}

/// Dropout assumes independent decisions; a generator whose neighbouring decisions correlate
/// (same Philox call, adjacent counters, adjacent heads or batches) would drop structured
/// patterns — whole rows, stripes, repeated tiles — and bias gradients. For each neighbour
/// relation the phi correlation of the keep indicators is checked at p = 0.5 and p = 0.1.
///
/// Bound: under independence the sample correlation of N pairs is r ~ N(0, 1/N), so
/// |r| < 5/√N is a 5σ bound. Relations named "same call" pair only elements of one Philox call
/// (other half of a word, other word); the others mix same-call and adjacent-counter pairs.
/// Every relation has ≥ 10⁶ pairs ([`PHI_ROWS`]).
#[test]
fn neighbours_are_uncorrelated() {
    fn all(_: u64, _: u64) -> bool {
        true
    }
    let shifts = [
        Shift {
            name: "k+1",
            dh: 0,
            dq: 0,
            dk: 1,
            only: all,
        },
        Shift {
            name: "k+1 (same call: other half of a word)",
            dh: 0,
            dq: 0,
            dk: 1,
            only: |_, k| k % 2 == 0,
        },
        Shift {
            name: "k+2 (next call)",
            dh: 0,
            dq: 0,
            dk: 2,
            only: all,
        },
        Shift {
            name: "k+8",
            dh: 0,
            dq: 0,
            dk: 8,
            only: all,
        },
        Shift {
            name: "k+8 (same call: other word)",
            dh: 0,
            dq: 0,
            dk: 8,
            only: |_, k| k & 8 == 0,
        },
        Shift {
            name: "k+16 (next key block)",
            dh: 0,
            dq: 0,
            dk: 16,
            only: all,
        },
        Shift {
            name: "q+1",
            dh: 0,
            dq: 1,
            dk: 0,
            only: all,
        },
        Shift {
            name: "q+8",
            dh: 0,
            dq: 8,
            dk: 0,
            only: all,
        },
        Shift {
            name: "q+8 (same call: other word)",
            dh: 0,
            dq: 8,
            dk: 0,
            only: |q, _| q & 8 == 0,
        },
        Shift {
            name: "q+16 (next query block)",
            dh: 0,
            dq: 16,
            dk: 0,
            only: all,
        },
        Shift {
            name: "head+1 (neighbouring heads)",
            dh: 1,
            dq: 0,
            dk: 0,
            only: all,
        },
        Shift {
            name: "head+heads_q (neighbouring batches)",
            dh: HEADS_Q,
            dq: 0,
            dk: 0,
            only: all,
        },
    ];
    let ps = [0.5f32, 0.1];
    let thrs = ps.map(threshold);
    let g = grid();
    let mut failures = Vec::new();
    for s in &shifts {
        let (rs, n) = phi(g, s, thrs);
        assert!(n >= 1e6, "{}: only {n} pairs", s.name);
        let bound = 5.0 / n.sqrt();
        for (&p, &r) in ps.iter().zip(&rs) {
            println!(
                "phi {:<38} p={p}: r = {r:+.2e} ({:+.2}σ, N = {n}, bound {bound:.2e})",
                s.name,
                r * n.sqrt()
            );
            if r.abs() >= bound {
                failures.push(format!("{} p={p}: r = {r}, bound {bound}", s.name));
            }
        }
    }
    assert!(failures.is_empty(), "correlated neighbours: {failures:#?}");
}

/// Launches must not share masks: advancing the seed or the offset (frameworks advance the
/// offset between launches) must give an independent mask, not just a different one. Two
/// independent masks with keep probability 1 − p agree on p² + (1 − p)² of their elements
/// (0.5 at p = 0.5, 0.82 at p = 0.1); a mask that is a shifted, complemented or partly reused
/// copy would not. Over ≈ 3.9·10⁵ elements the agreement's σ is at most 8.0·10⁻⁴, so the asserted
/// 0.01 is > 12σ. Covered: seed ± 1 (key word 0), seed high word (key word 1), offset ± 1 (counter
/// word 3), offset high word (key word 1 through the xor), a flipped top seed bit, and the
/// all-zero state against seed 1 and against offset 1.
#[test]
fn different_seeds_and_offsets_are_independent() {
    let (heads, seq_q, seq_k) = (HEADS, 127, 509);
    let base = RNG;
    let zero = DropoutRng { seed: 0, offset: 0 };
    let pairs = [
        (
            "seed s+1",
            base,
            DropoutRng {
                seed: base.seed + 1,
                ..base
            },
        ),
        (
            "seed s-1",
            base,
            DropoutRng {
                seed: base.seed - 1,
                ..base
            },
        ),
        (
            "seed high word +1",
            base,
            DropoutRng {
                seed: base.seed + (1 << 32),
                ..base
            },
        ),
        (
            "seed top bit flipped",
            base,
            DropoutRng {
                seed: base.seed ^ (1 << 63),
                ..base
            },
        ),
        (
            "offset o+1",
            base,
            DropoutRng {
                offset: base.offset + 1,
                ..base
            },
        ),
        (
            "offset high word +1",
            base,
            DropoutRng {
                offset: base.offset + (1 << 32),
                ..base
            },
        ),
        (
            "seed 0 vs 1, offset 0",
            zero,
            DropoutRng { seed: 1, offset: 0 },
        ),
        (
            "offset 0 vs 1, seed 0",
            zero,
            DropoutRng { seed: 0, offset: 1 },
        ),
    ];
    let ps = [0.5f32, 0.1];
    let base_u = uniforms(base, heads, seq_q, seq_k);
    let zero_u = uniforms(zero, heads, seq_q, seq_k);
    for (name, first, other) in pairs {
        let a = if first == base { &base_u } else { &zero_u };
        let b = uniforms(other, heads, seq_q, seq_k);
        let n = a.len() as f64;
        let identical = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        for p in ps {
            let thr = threshold(p) as u16;
            let agree = a
                .iter()
                .zip(&b)
                .filter(|(&x, &y)| (x >= thr) == (y >= thr))
                .count();
            let frac = agree as f64 / n;
            let pf = p as f64;
            let want = pf * pf + (1.0 - pf) * (1.0 - pf);
            println!(
                "agreement {name:<22} p={p}: {frac:.5} (independent: {want:.2}, N = {n}, \
                 identical uniforms {identical})"
            );
            assert!(
                (frac - want).abs() < 0.01,
                "{name} p={p}: agree {frac}, want {want}"
            );
        }
    }
}

/// The decisions are only as good as the 15-bit uniforms: the kept fraction at any p is the
/// uniforms' distribution function, so they must be uniform on 0..32768 at every scale.
/// - Mean: the ideal σ of the mean of N uniforms is √((32768² − 1)/12 / N) (≈ 3.0 at N ≈ 10⁷);
///   asserted within 5σ of 16383.5, overall and for each of the eight (word, half) slots of a
///   Philox call (a slot-dependent bias would make some accumulator positions drop more).
/// - Chi-square of the high byte (bits 8..15, 128 buckets: 127 degrees of freedom, mean 127,
///   σ = √254 ≈ 15.9) asserted < 220, > 5.8σ; of the low byte (bits 0..8, 256 buckets: 255
///   dof, σ = √510 ≈ 22.6) asserted < 400, > 6σ.
/// - Chi-square of the full 15-bit value over 32768 buckets (32767 dof, σ ≈ 256, ≈ 306 samples
///   per bucket): asserted < 32767 + 6·√(2·32767).
/// - No value reaches 32768: the unused top bit of each half never leaks into a uniform.
#[test]
fn uniforms_are_uniform() {
    let g = grid();
    let n = g.len() as f64;
    let buckets = UNIFORMS as f64;
    let ideal_mean = (buckets - 1.0) / 2.0;
    let sd_one = ((buckets * buckets - 1.0) / 12.0).sqrt();
    assert!(
        g.iter().all(|&u| (u as u32) < UNIFORMS),
        "a uniform is not 15-bit"
    );

    let mean = g.iter().map(|&u| u as f64).sum::<f64>() / n;
    let sigma = sd_one / n.sqrt();
    println!(
        "uniform mean: {mean:.3} (ideal {ideal_mean} ± {sigma:.3}: {:+.2}σ, N = {n})",
        (mean - ideal_mean) / sigma
    );
    assert!((mean - ideal_mean).abs() < 5.0 * sigma, "mean {mean}");

    // Per slot of a Philox call: word 2·((q >> 3) & 1) + ((k >> 3) & 1), half k & 1.
    let mut slot_sum = [0f64; 8];
    let mut slot_n = [0f64; 8];
    for head in 0..HEADS {
        for q in 0..SEQ_Q {
            for k in 0..SEQ_K {
                let slot = (2 * (2 * ((q >> 3) & 1) + ((k >> 3) & 1)) + (k & 1)) as usize;
                slot_sum[slot] += g[at(head, q, k)] as f64;
                slot_n[slot] += 1.0;
            }
        }
    }
    for slot in 0..8 {
        let (m, s) = (slot_sum[slot] / slot_n[slot], sd_one / slot_n[slot].sqrt());
        println!(
            "uniform mean of word {} half {}: {m:.3} ({:+.2}σ, N = {})",
            slot / 2,
            slot % 2,
            (m - ideal_mean) / s,
            slot_n[slot]
        );
        assert!((m - ideal_mean).abs() < 5.0 * s, "slot {slot}: mean {m}");
    }

    let chi2 = |buckets: &[u64]| {
        let e = n / buckets.len() as f64;
        buckets
            .iter()
            .map(|&o| (o as f64 - e).powi(2) / e)
            .sum::<f64>()
    };
    let mut hi = [0u64; 128];
    let mut lo = [0u64; 256];
    let mut full = vec![0u64; UNIFORMS as usize];
    for &u in g {
        hi[(u >> 8) as usize] += 1;
        lo[(u & 0xff) as usize] += 1;
        full[u as usize] += 1;
    }
    let (c_hi, c_lo, c_full) = (chi2(&hi), chi2(&lo), chi2(&full));
    let full_bound = 32767.0 + 6.0 * (2.0f64 * 32767.0).sqrt();
    println!("chi2 high byte (bits 8..15): {c_hi:.1} (dof 127, bound 220)");
    println!("chi2 low byte (bits 0..8): {c_lo:.1} (dof 255, bound 400)");
    println!("chi2 15-bit: {c_full:.1} (dof 32767, bound {full_bound:.0})");
    assert!(c_hi < 220.0, "high byte chi2 {c_hi}");
    assert!(c_lo < 400.0, "low byte chi2 {c_lo}");
    assert!(c_full < full_bound, "15-bit chi2 {c_full}");
}
