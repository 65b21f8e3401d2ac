//! The planned tiled computation, run on the CPU in float64.
//!
//! It does what the kernel does, in the kernel's order: one query tile of `block_m` rows at a
//! time walks the key tiles of `block_n` columns; each (query tile, key tile) pair is classified
//! with [`classify()`] — `Empty` tiles are never touched, `Full` tiles run no mask code, `Partial`
//! tiles evaluate the mask per element — and an online softmax (running max `m`, running sum
//! `l`, unnormalised accumulator rescaled by `exp(m_old - m_new)`) folds the tiles in. Compared
//! with [`reference::forward`](crate::model::reference::forward) at f64 precision it checks the plan:
//! an unsound classification or a wrong softmax update shows up as a mismatch.

use crate::eval::{Env, Point};
use crate::model::reference::{dot, Output, Problem};
use crate::plan::block_map::map_row;
use crate::plan::{classify, host_block_map, KernelPlan, TileClass, TileEnv};

/// Runs `plan` on `p`. `tiles_visited` / `tiles_skipped` count (query tile, key tile) pairs over
/// all batches and heads.
pub fn forward(plan: &KernelPlan, p: &Problem) -> Output {
    let spec = &plan.spec;
    p.check(spec);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let (bm, bn) = (plan.config.block_m as usize, plan.config.block_n as usize);
    let env = Env::new(spec, &p.params, p.sizes());
    let drop = crate::dropout::DropoutFactor::new(spec, &p.params, p.rng, p.heads_q);
    let scale = spec.softmax_scale();
    let mut out = Output {
        o: vec![0.0; p.batch * p.seq_q * p.heads_q * dv],
        lse: vec![f64::NEG_INFINITY; p.batch * p.heads_q * p.seq_q],
        ..Output::default()
    };
    // Per-row state of one query tile.
    let mut m_i = vec![f64::NEG_INFINITY; bm];
    let mut l_i = vec![0.0f64; bm];
    let mut acc = vec![0.0f64; bm * dv];
    let mut s_row = vec![f64::NEG_INFINITY; bn];

    // A variant with a block map walks its lists (built here by brute force, as the GPU builds
    // them) instead of classifying tiles.
    let map = plan.block_map.map(|m| {
        let words = host_block_map(spec, &m, &p.params, p.batch, p.heads_q, p.seq_q, p.seq_k);
        (m, words)
    });
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let kvh = p.kv_head(h);
            let tile_env = TileEnv::new(b, h, p.seq_q, p.seq_k, &p.params);
            for qt in 0..plan.query_tiles(p.seq_q) {
                let q0 = qt * bm;
                let q1 = (q0 + bm).min(p.seq_q) - 1;
                let listed = map
                    .as_ref()
                    .map(|(m, w)| map_row(w, m, m.slot(b, h, p.heads_q), qt, p.seq_q, p.seq_k));
                m_i.fill(f64::NEG_INFINITY);
                l_i.fill(0.0);
                acc.fill(0.0);
                for kt in 0..plan.key_tiles(p.seq_k) {
                    let k0 = kt * bn;
                    let k1 = (k0 + bn).min(p.seq_k) - 1;
                    let class = match (&listed, &plan.mask) {
                        (Some(l), _) => match l.iter().find(|e| e.0 == kt) {
                            None => TileClass::Empty,
                            Some((_, true)) => TileClass::Partial,
                            Some((_, false)) => TileClass::Full,
                        },
                        (None, None) => TileClass::Full,
                        (None, Some(mask)) => classify(
                            mask, spec, &tile_env, q0 as i64, q1 as i64, k0 as i64, k1 as i64,
                        ),
                    };
                    if class == TileClass::Empty {
                        out.tiles_skipped += 1;
                        continue;
                    }
                    out.tiles_visited += 1;
                    for i in q0..=q1 {
                        let r = i - q0;
                        let qrow = &p.q[Problem::row(b, i, h, p.seq_q, p.heads_q, dqk)..][..dqk];
                        // S = scale·q·kᵀ, score hook, mask hook (partial tiles only).
                        for j in k0..=k1 {
                            let mut pt = Point {
                                b: b as i64,
                                h: h as i64,
                                q: i as i64,
                                k: j as i64,
                                s: 0.0,
                            };
                            let krow =
                                &p.k[Problem::row(b, j, kvh, p.seq_k, p.heads_kv, dqk)..][..dqk];
                            pt.s = scale * dot(qrow, krow);
                            let visible = class == TileClass::Full || env.mask(&pt);
                            s_row[j - k0] = if visible {
                                env.score(&pt)
                            } else {
                                f64::NEG_INFINITY
                            };
                        }
                        let s_tile = &s_row[..=k1 - k0];
                        // Online softmax: new running max, rescale what was accumulated.
                        let m_new = s_tile.iter().copied().fold(m_i[r], f64::max);
                        if m_new == f64::NEG_INFINITY {
                            continue; // every key so far masked: nothing to add, nothing to rescale
                        }
                        let alpha = (m_i[r] - m_new).exp(); // exp(-inf) = 0 on the first visible tile
                        let a_row = &mut acc[r * dv..(r + 1) * dv];
                        a_row.iter_mut().for_each(|a| *a *= alpha);
                        let mut row_sum = 0.0;
                        for (jj, &s) in s_tile.iter().enumerate() {
                            let w = (s - m_new).exp();
                            if w == 0.0 {
                                continue;
                            }
                            row_sum += w;
                            // The running sum takes P before dropout (the LSE is unaffected).
                            let w = w * drop.at(b, h, i, k0 + jj);
                            let vrow = &p.v
                                [Problem::row(b, k0 + jj, kvh, p.seq_k, p.heads_kv, dv)..][..dv];
                            for (a, v) in a_row.iter_mut().zip(vrow) {
                                *a += w * v;
                            }
                        }
                        l_i[r] = l_i[r] * alpha + row_sum;
                        m_i[r] = m_new;
                    }
                }
                // Epilogue: normalise; rows that saw no visible key keep o = 0, lse = -inf.
                for i in q0..=q1 {
                    let r = i - q0;
                    if m_i[r] == f64::NEG_INFINITY || l_i[r] == 0.0 {
                        continue;
                    }
                    let orow = Problem::row(b, i, h, p.seq_q, p.heads_q, dv);
                    for (o, a) in out.o[orow..orow + dv]
                        .iter_mut()
                        .zip(&acc[r * dv..(r + 1) * dv])
                    {
                        *o = a / l_i[r];
                    }
                    out.lse[(b * p.heads_q + h) * p.seq_q + i] = m_i[r] + l_i[r].ln();
                }
            }
        }
    }
    out
}
