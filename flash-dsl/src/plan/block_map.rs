//! Block maps: the tile classes of a data-dependent mask, computed once per launch shape and
//! parameter values by a generated GPU kernel, then walked by the attention kernels.
//!
//! Affine masks (causal, windows, prefixes) are classified inside the attention kernels for free:
//! four corner evaluations per tile. A mask that reads tensors (`doc[q] == doc[k]`) or is opaque
//! is not: classifying it in the kernel means scanning the whole key hull of every query tile
//! with warp reductions. A block map moves that work out of the attention kernels: for each row
//! tile it lists the column tiles that hold a visible element, in ascending order, each marked
//! full (no mask code runs) or partial (the mask is evaluated per element). The forward walks
//! rows of query tiles; the backward walks the transposed map, rows of key tiles listing query
//! tiles.
//!
//! Layout (one `i32` buffer): for each map slot (batch × query head, each only when the mask
//! reads `b` or `h`; otherwise one slot serves them all) and each row tile, `width = cols + 1`
//! words: the count `n`, then `n` entries `(tile << shift) | (sub << 1) | partial`, ascending.
//! `sub` holds, in the backward's map of key tiles of 128 keys or more, the class of each 64-key
//! part of the tile (two bits each: 0 empty, 1 partial, 2 full; see [`BlockMapPlan::sub_tiles`]),
//! and is absent elsewhere (`shift` = 1). Memory is O(slots · rows · cols) = O(N² / tile²).
//!
//! Classes are exact: a tile is listed unless every in-range element is masked, and is full only
//! when every in-range element is visible and the tile does not run past `seq_q` or `seq_k` (the
//! kernels then need the bounds check that partial tiles carry). [`host_block_map`] states the
//! same rule by brute force; the GPU check compares the two word for word.

use serde::{Deserialize, Serialize};

use super::mask::{analyse_mask, MaskTree};
use super::operand::{arg_layout, ArgField, Extent, GridRule, LaunchShape, Layout, Operand};
use super::operand::{OperandType, Role};
use super::tile::{KernelFamily, PlanError, TileConfig};
use super::{kernel_name, KernelKind, KernelPlan};
use crate::eval::{Env, ParamValues, Point, Sizes};
use crate::spec::{Var, VariantSpec};

/// Warps of the block-map build kernel (one block per row tile; each warp classifies one column
/// tile at a time).
pub const BUILD_WARPS: u32 = 8;

/// The shape of one block map: which tiles its rows and columns are, and which launch indices
/// it is per.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockMapPlan {
    /// Rows are key tiles listing query tiles (the backward's walk) instead of query tiles
    /// listing key tiles (the forward's).
    pub along_keys: bool,
    /// Query positions per tile.
    pub tile_q: u32,
    /// Key positions per tile.
    pub tile_k: u32,
    /// The mask reads `b`: one map per batch.
    pub per_batch: bool,
    /// The mask reads `h`: one map per query head.
    pub per_head: bool,
    /// The variant declares a sparsity layout: the build kernel checks its entries and reports
    /// the first one out of range in two words after the map (index + 1 and value; 0 when all
    /// are in range).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layout: bool,
}

/// Whether `spec`'s mask needs a block map: it has parts the kernels cannot decide per tile from
/// indices alone (tensor lookups, non-affine expressions).
pub fn needs_block_map(spec: &VariantSpec) -> bool {
    if spec.sparsity.is_some() {
        return true;
    }
    let Some(m) = &spec.mask else { return false };
    let plan = analyse_mask(spec, m);
    !plan.ranges.is_empty() || has_opaque(&plan.tree)
}

fn has_opaque(t: &MaskTree) -> bool {
    match t {
        MaskTree::Opaque | MaskTree::Range(_) => true,
        MaskTree::Const(_) | MaskTree::Atom(_) => false,
        MaskTree::And(xs) | MaskTree::Or(xs) => xs.iter().any(has_opaque),
        MaskTree::Not(x) => has_opaque(x),
    }
}

impl BlockMapPlan {
    /// The map a kernel with `tile_q × tile_k` tiles walks, or `None` when `spec` needs none.
    pub fn for_spec(
        spec: &VariantSpec,
        tile_q: u32,
        tile_k: u32,
        along_keys: bool,
    ) -> Option<BlockMapPlan> {
        if !needs_block_map(spec) {
            return None;
        }
        let reads = |v: Var| spec.mask.as_ref().is_some_and(|m| m.uses_var(v));
        let sp = spec.sparsity;
        Some(BlockMapPlan {
            along_keys,
            tile_q,
            tile_k,
            per_batch: reads(Var::B) || sp.is_some_and(|s| s.per_batch),
            per_head: reads(Var::H) || sp.is_some_and(|s| s.per_head),
            layout: sp.is_some(),
        })
    }

    /// Row tiles (query tiles, or key tiles when `along_keys`).
    pub fn rows(&self, seq_q: usize, seq_k: usize) -> usize {
        if self.along_keys {
            seq_k.div_ceil(self.tile_k as usize)
        } else {
            seq_q.div_ceil(self.tile_q as usize)
        }
    }

    /// Column tiles.
    pub fn cols(&self, seq_q: usize, seq_k: usize) -> usize {
        if self.along_keys {
            seq_q.div_ceil(self.tile_q as usize)
        } else {
            seq_k.div_ceil(self.tile_k as usize)
        }
    }

    /// Map slots: batches × query heads the mask distinguishes.
    pub fn slots(&self, batch: usize, heads_q: usize) -> usize {
        (if self.per_batch { batch } else { 1 }) * (if self.per_head { heads_q } else { 1 })
    }

    /// The slot of batch `b`, query head `h`.
    pub fn slot(&self, b: usize, h: usize, heads_q: usize) -> usize {
        let b = if self.per_batch { b } else { 0 };
        let h = if self.per_head { h } else { 0 };
        b * (if self.per_head { heads_q } else { 1 }) + h
    }

    /// The 64-key parts of a key tile whose classes an entry records: in the backward's map
    /// (`along_keys`) of tiles of 128 keys or more, where each warpgroup of the wgmma kernel owns
    /// 64 keys of the tile and skips its part of a step when that part is empty (its tensor-core
    /// work and mask code), or drops the mask code when it is full. Measured on the document
    /// mask (64 × 128 tiles, 8 documents, n = 4096): 29 % of the listed tiles have an empty
    /// half and another 23 % a full one. 0 elsewhere.
    pub fn sub_tiles(&self) -> u32 {
        if self.along_keys && self.tile_k >= 128 && self.tile_k.is_multiple_of(64) {
            self.tile_k / 64
        } else {
            0
        }
    }

    /// The shift of an entry's column tile: above the partial bit and the parts' classes.
    pub fn entry_shift(&self) -> u32 {
        1 + 2 * self.sub_tiles()
    }

    /// Words of the whole map (with the two words of the layout check, see [`Self::layout`]).
    pub fn len(&self, batch: usize, heads_q: usize, seq_q: usize, seq_k: usize) -> usize {
        self.slots(batch, heads_q) * self.rows(seq_q, seq_k) * (self.cols(seq_q, seq_k) + 1)
            + if self.layout { 2 } else { 0 }
    }

    /// A map is never empty of words (each row has its count); kept for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The tile configuration the build kernel is planned with (its constants `BM`, `BN`).
    pub fn build_config(&self) -> TileConfig {
        TileConfig {
            block_m: self.tile_q,
            block_n: self.tile_k,
            warps: BUILD_WARPS,
            stages: 1,
            family: KernelFamily::Sm80,
        }
    }
}

/// The block-map operand of the kernels that read a map and of the build kernel that writes it:
/// a flat `i32` buffer of [`BlockMapPlan::len`] words.
pub fn block_map_operand(role: Role) -> Operand {
    Operand::new(
        "block_map",
        role,
        OperandType::I32,
        &[Extent::MapLen],
        Layout::Contiguous,
    )
}

/// Plans the build kernel of `map`: one block per (row tile, map head, map batch) classifies
/// every column tile of the row's hull (the affine atoms' corners first, then, for the tiles
/// they leave undecided, every element) and writes the row's list.
pub fn plan_block_map(spec: &VariantSpec, map: BlockMapPlan) -> Result<KernelPlan, PlanError> {
    let mask = spec.mask.as_ref().map(|m| analyse_mask(spec, m));
    let config = map.build_config();
    let operands = vec![block_map_operand(Role::Output)];
    let scalars = [
        ArgField::Size(Extent::Batch),
        ArgField::Size(Extent::HeadsQ),
        ArgField::Size(Extent::SeqQ),
        ArgField::Size(Extent::SeqK),
    ];
    let args = arg_layout(spec, &operands, &scalars);
    let kind = if map.along_keys {
        KernelKind::BlockMapKeys
    } else {
        KernelKind::BlockMap
    };
    Ok(KernelPlan {
        kind,
        spec: spec.clone(),
        config,
        args,
        operands,
        launch: LaunchShape {
            grid: GridRule::MapRows {
                tile: if map.along_keys {
                    map.tile_k
                } else {
                    map.tile_q
                },
                along_keys: map.along_keys,
                per_batch: map.per_batch,
                per_head: map.per_head,
            },
            threads: BUILD_WARPS * 32,
            smem_bytes: 0,
        },
        mask,
        kernel_name: kernel_name(kind, spec, &config),
        deterministic: false,
        block_map: Some(map),
        quant: None,
    })
}

/// Class of one tile as the map records it: `None` when every in-range element is masked,
/// `Some(true)` when partial, `Some(false)` when full.
fn tile_entry(
    env: &Env<'_>,
    b: usize,
    h: usize,
    (q0, q1): (usize, usize),
    (k0, k1): (usize, usize),
    overhang: bool,
) -> Option<bool> {
    let (mut any_in, mut any_out) = (false, false);
    for q in q0..=q1 {
        for k in k0..=k1 {
            let p = Point {
                b: b as i64,
                h: h as i64,
                q: q as i64,
                k: k as i64,
                s: 0.0,
            };
            if env.mask(&p) {
                any_in = true;
            } else {
                any_out = true;
            }
            if any_in && any_out {
                return Some(true);
            }
        }
    }
    any_in.then_some(any_out || overhang)
}

/// The block map of `map` for a `batch × heads_q × seq_q × seq_k` launch with `params`, by brute
/// force over every element (the statement of what the build kernel writes; see the module doc).
pub fn host_block_map(
    spec: &VariantSpec,
    map: &BlockMapPlan,
    params: &ParamValues,
    batch: usize,
    heads_q: usize,
    seq_q: usize,
    seq_k: usize,
) -> Vec<i32> {
    let sizes = Sizes {
        batch,
        heads: heads_q,
        seq_q,
        seq_k,
    };
    let env = Env::new(spec, params, sizes);
    let (rows, cols) = (map.rows(seq_q, seq_k), map.cols(seq_q, seq_k));
    let width = cols + 1;
    let mut out = vec![0i32; map.len(batch, heads_q, seq_q, seq_k)];
    let (tq, tk) = (map.tile_q as usize, map.tile_k as usize);
    let (subs, shift) = (map.sub_tiles() as usize, map.entry_shift());
    let mb = if map.per_batch { batch } else { 1 };
    let mh = if map.per_head { heads_q } else { 1 };
    for b in 0..mb {
        for h in 0..mh {
            let slot = map.slot(b, h, heads_q);
            for r in 0..rows {
                let row = &mut out[(slot * rows + r) * width..(slot * rows + r + 1) * width];
                let mut n = 0usize;
                for c in 0..cols {
                    let (qt, kt) = if map.along_keys { (c, r) } else { (r, c) };
                    let (q0, k0) = (qt * tq, kt * tk);
                    let (q1, k1) = ((q0 + tq).min(seq_q) - 1, (k0 + tk).min(seq_k) - 1);
                    let overhang = q0 + tq > seq_q || k0 + tk > seq_k;
                    if subs == 0 {
                        if let Some(partial) = tile_entry(&env, b, h, (q0, q1), (k0, k1), overhang)
                        {
                            n += 1;
                            row[n] = ((c as i32) << 1) | partial as i32;
                        }
                        continue;
                    }
                    // The parts' classes (0 empty, 1 partial, 2 full); the tile's follows.
                    let mut sub = 0i32;
                    let (mut any, mut all_full) = (false, true);
                    for s in 0..subs {
                        let ks0 = k0 + 64 * s;
                        let class = if ks0 > k1 {
                            0
                        } else {
                            let ks1 = (ks0 + 63).min(k1);
                            let over = q0 + tq > seq_q || ks0 + 64 > seq_k;
                            match tile_entry(&env, b, h, (q0, q1), (ks0, ks1), over) {
                                None => 0,
                                Some(true) => 1,
                                Some(false) => 2,
                            }
                        };
                        any |= class != 0;
                        all_full &= class == 2;
                        sub |= class << (2 * s);
                    }
                    if any {
                        n += 1;
                        row[n] = ((c as i32) << shift) | (sub << 1) | (!all_full) as i32;
                    }
                }
                row[0] = n as i32;
            }
        }
    }
    out
}

/// The entries of row `row` of slot `slot` of a map: `(column tile, partial)`, ascending.
pub fn map_row(
    words: &[i32],
    map: &BlockMapPlan,
    slot: usize,
    row: usize,
    seq_q: usize,
    seq_k: usize,
) -> Vec<(usize, bool)> {
    let (rows, width) = (map.rows(seq_q, seq_k), map.cols(seq_q, seq_k) + 1);
    let at = (slot * rows + row) * width;
    let n = words[at] as usize;
    let shift = map.entry_shift();
    words[at + 1..at + 1 + n]
        .iter()
        .map(|e| ((e >> shift) as usize, e & 1 == 1))
        .collect()
}
