//! Block-sparse layouts (`sparsity: blocks`): a generator of BigBird-style layouts for tests,
//! tuning inputs and benchmarks. The semantics live in [`crate::spec::Sparsity`] (the layout's
//! shape and meaning), [`crate::eval::Env::sparsity_allows`] (the reference) and the block-map
//! build kernel (the GPU, which also checks every entry).

use crate::eval::Sizes;
use crate::rng::SplitMix;
use crate::spec::Sparsity;

/// A BigBird-style layout for `sp` at `sizes`: every query block `qb` lists its `local`
/// neighbours `qb − local/2 …` (those inside the key range), the first `global` key blocks, then
/// `random` blocks drawn uniformly, in that order, truncated to the layout's slots; unused slots
/// hold −1 (and repeats are possible, as the layout allows). One row per (batch, head, query
/// block) as the layout's dimensions say.
///
/// A per-head layout of 128-position blocks, 4 slots per query block, with one local neighbour
/// on each side and one global block (no random ones, so every head gets the same rows):
///
/// ```
/// use flash_dsl::eval::Sizes;
/// use flash_dsl::rng::SplitMix;
/// use flash_dsl::sparsity::bigbird_layout;
///
/// let spec = flash_dsl::parse::parse_str(
///     "BigBird { head_dim: 64, dtype: bf16,
///                params: { blocks: [i32; heads, seq / 128, 4] }, sparsity: blocks }",
/// )
/// .unwrap()
/// .remove(0);
/// let sp = spec.sparsity.unwrap();
/// let sizes = Sizes { batch: 1, heads: 2, seq_q: 512, seq_k: 512 };
/// let layout = bigbird_layout(&sp, sizes, (3, 1, 0), &mut SplitMix(1));
/// assert_eq!(layout.len(), 2 * 4 * 4); // [heads, seq / 128, 4]
/// // Query block 0: local 0, 1 (block -1 is outside), global 0, one unused slot.
/// assert_eq!(&layout[..4], &[0, 1, 0, -1]);
/// // Query block 2: local 1, 2, 3, global 0.
/// assert_eq!(&layout[8..12], &[1, 2, 3, 0]);
/// assert_eq!(&layout[..16], &layout[16..]);
/// ```
pub fn bigbird_layout(
    sp: &Sparsity,
    sizes: Sizes,
    (local, global, random): (usize, usize, usize),
    rng: &mut SplitMix,
) -> Vec<i64> {
    let n = sp.block as usize;
    let blocks = sizes.seq_q.max(sizes.seq_k).div_ceil(n);
    let n_kb = sizes.seq_k.div_ceil(n) as i64;
    let lead =
        (if sp.per_batch { sizes.batch } else { 1 }) * (if sp.per_head { sizes.heads } else { 1 });
    let k = sp.slots as usize;
    let mut out = Vec::with_capacity(lead * blocks * k);
    for _ in 0..lead {
        for qb in 0..blocks as i64 {
            let mut row: Vec<i64> = Vec::with_capacity(k);
            let first = qb - (local as i64) / 2;
            row.extend((first..first + local as i64).filter(|b| (0..n_kb).contains(b)));
            row.extend((0..global as i64).filter(|b| *b < n_kb));
            if n_kb > 0 {
                row.extend((0..random).map(|_| rng.below(n_kb as u64) as i64));
            }
            row.truncate(k);
            row.resize(k, -1);
            out.extend(row);
        }
    }
    out
}

/// Fraction of visible (query, key) pairs of a layout with no mask: the distinct key blocks of
/// each query block, counted in positions, over `seq_q × seq_k`, averaged over the layout's rows.
pub fn layout_density(sp: &Sparsity, sizes: Sizes, layout: &[i64]) -> f64 {
    let n = sp.block as usize;
    let blocks = sizes.seq_q.max(sizes.seq_k).div_ceil(n);
    let k = sp.slots as usize;
    let n_kb = sizes.seq_k.div_ceil(n);
    let mut visible = 0f64;
    for (i, row) in layout.chunks(k).enumerate() {
        let qb = i % blocks;
        let q_len = (sizes.seq_q.min((qb + 1) * n)).saturating_sub(qb * n);
        if q_len == 0 {
            continue;
        }
        let mut seen = vec![false; n_kb];
        let mut keys = 0usize;
        for &b in row {
            if (0..n_kb as i64).contains(&b) && !seen[b as usize] {
                seen[b as usize] = true;
                keys += sizes.seq_k.min((b as usize + 1) * n) - b as usize * n;
            }
        }
        visible += (q_len * keys) as f64;
    }
    let lead = (layout.len() / k / blocks.max(1)).max(1);
    visible / (lead as f64 * sizes.seq_q as f64 * sizes.seq_k as f64)
}
