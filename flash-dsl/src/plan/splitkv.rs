//! The inference kind: split-KV attention, whose splits are merged by the last of them to finish.
//!
//! A decode step has one (or a few) query tokens per sequence: the forward kernel's query tiles
//! of 128 rows would be almost empty, and one block per (batch, head) leaves most of the GPU
//! idle. The split-KV kernel instead packs the query heads of one KV group into the rows of a
//! tile (row `r` is query `r / G` of head `kvh·G + r % G`, `G = heads_q / heads_kv`), so each K/V
//! tile is read once for the whole group, and cuts the key range of each (batch, KV head, row
//! tile) into `splits` pieces that run as separate blocks. Each split writes its normalised
//! partial output and log-sum-exp (fp32) and counts itself on an arrival counter of its row
//! tile; the last to arrive merges them exactly, `LSE = log Σ_s e^{LSE_s}`,
//! `O = Σ_s e^{LSE_s − LSE} O_s`, and resets the counter for the next launch. One launch and no
//! combine kernel: measured on an H200, a second kernel and its wait cost a 25 µs decode step
//! 15–28 % of its time. With one split the kernel writes O and the LSE directly.
//!
//! [`plan_splitkv_paged`] is the same kernel over a paged KV cache, and
//! [`plan_splitkv_paged_varlen`] over a paged KV cache with packed queries (chunked prefill: each
//! sequence's new tokens, of different counts, against its cached keys; see `plan::varlen` for the
//! packed layout).
//!
//! Inside a block every warp streams its own key tiles (warp `w` takes tiles `w`, `w + warps`,
//! … of the split) through a private `cp.async` pipeline of `stages` buffers: decode is bound by
//! the bytes of K and V, so the kernel's job is to keep enough of them in flight, and warps that
//! never wait on each other keep the most. The warps' online-softmax states are merged in shared
//! memory at the end. The tile walk, the classification of key tiles (empty tiles skipped, no
//! mask code on full ones) and the hooks are the forward's.
//!
//! A block-sparse layout is read without a block map: a key tile is skipped when no row of the
//! tile (its query head, its query block) lists the tile's key block, run without the layout's
//! check when every row does, and otherwise checked per row (one look-up per row and tile: a key
//! tile lies inside one layout block). As in the packed kernel, the layout's entries are not
//! validated here; one that is no key block never matches (reads as −1).

use super::mask::analyse_mask;
use super::operand::{
    arg_layout, ArgField, Extent, GridRule, LaunchShape, Layout, Operand, OperandType, Role,
};
use super::tile::{KernelFamily, PlanError, TileConfig, MAX_SMEM_BYTES};
use super::{kernel_name, KernelKind, KernelPlan};
use crate::spec::VariantSpec;

use Extent::*;

/// The partial outputs of the splits (`[splits, batch, heads_q, seq_q, head_dim_v]` f32, with
/// packed queries `[splits, heads_q, total_q, head_dim_v]`; the runtime binds `splits` to 0,
/// leaving both partials empty, for a launch of one split).
pub const OPART_OPERAND: &str = "o_part";
/// The partial log-sum-exps of the splits (`[splits, batch, heads_q, seq_q]` f32).
pub const LSEPART_OPERAND: &str = "lse_part";
/// The arrival counters of the row tiles (i32, one per (batch, KV head, row tile), at most
/// `batch · heads_q · seq_q`): zero between launches, the last split of a row tile resets its own.
pub const SEM_OPERAND: &str = "split_sem";

/// The most splits a launch takes (the merge reads one LSE per split per row).
pub const MAX_SPLITS: usize = 256;

/// The default split-KV tile for a spec: 16 packed rows (a decode step of GQA 4 at q ≤ 4 fills
/// one m16 tile) and 16 keys per warp step; up to head dim 128, 8 warps with 2 buffers each
/// (measured on an H200 against 4 warps × 32 keys × 3 buffers and five other tiles on peers.py's
/// decode shapes: 8 % faster at batch 1 with 8k keys, within 0.5 % elsewhere), above it 4 warps
/// with 3 buffers (the output accumulator takes half the registers, and 8 warps' buffers would
/// not fit). Fewer buffers where they would not fit in shared memory.
pub fn default_splitkv_config(spec: &VariantSpec) -> TileConfig {
    let wide = spec.head_dim_qk.max(spec.head_dim_v) > 128;
    let mut cfg = TileConfig {
        block_m: 16,
        block_n: 16,
        warps: if wide { 4 } else { 8 },
        stages: if wide { 3 } else { 2 },
        family: KernelFamily::Sm80,
    };
    while cfg.stages > 1 && splitkv_smem_bytes(spec, &cfg) > MAX_SMEM_BYTES {
        cfg.stages -= 1;
    }
    cfg
}

/// Shared memory of the split-KV kernel: the Q tile, then per warp `stages` K and V tiles
/// (128-byte swizzle atoms per row); the epilogue's merge buffer (every warp's fp32 output and
/// its row statistics) reuses the same bytes, so the total is the larger of the two.
pub fn splitkv_smem_bytes(spec: &VariantSpec, cfg: &TileConfig) -> u32 {
    let pitch = |d: u32| d.div_ceil(64) * 128;
    let dv_mma = spec.head_dim_v.div_ceil(16) * 16;
    let loop_bytes = cfg.block_m * pitch(spec.head_dim_qk)
        + cfg.warps * cfg.stages * cfg.block_n * (pitch(spec.head_dim_qk) + pitch(spec.head_dim_v));
    let merge_bytes = cfg.warps * cfg.block_m * (dv_mma + 2) * 4;
    loop_bytes.max(merge_bytes)
}

/// The split-KV kernel's tile rules: 16 or 32 packed rows, 16, 32 or 64 keys per warp step,
/// 2 to 8 warps, 1 to 4 buffers per warp, the sm80 (`mma.sync`) family, which every GPU from
/// sm_80 runs.
pub fn splitkv_config_is_valid(spec: &VariantSpec, cfg: &TileConfig) -> Result<(), PlanError> {
    super::tile::head_dims_valid(spec)?;
    let ok = matches!(cfg.block_m, 16 | 32)
        && matches!(cfg.block_n, 16 | 32 | 64)
        && (2..=8).contains(&cfg.warps)
        && (1..=4).contains(&cfg.stages)
        && cfg.family == KernelFamily::Sm80;
    if !ok {
        return Err(PlanError::SplitKvTile {
            block_m: cfg.block_m,
            block_n: cfg.block_n,
            warps: cfg.warps,
            stages: cfg.stages,
            family: cfg.family,
        });
    }
    let bytes = splitkv_smem_bytes(spec, cfg);
    if bytes > MAX_SMEM_BYTES {
        return Err(PlanError::SharedMemory {
            bytes,
            limit: MAX_SMEM_BYTES,
        });
    }
    Ok(())
}

/// Why a variant has no split-KV path (the forward kernel still runs it), or `None`.
pub fn splitkv_unsupported(spec: &VariantSpec) -> Option<&'static str> {
    if matches!(spec.dropout, Some(crate::spec::Dropout::Const(_))) {
        // A runtime probability is served at p = 0 (the launch checks it); a constant one
        // cannot be turned off.
        Some("a constant dropout probability cannot be turned off, and the split-KV kernel (inference) does not apply dropout; declare the probability as a runtime param and pass p = 0")
    } else {
        None
    }
}

/// The page table of a paged KV cache (`[batch, max_pages]` i32 page indices).
pub const PAGE_TABLE_OPERAND: &str = "page_table";
/// The cached length of each sequence of a paged KV cache (`[batch]` i32).
pub const SEQLENS_K_OPERAND: &str = "seqlens_k";

/// The split-KV attention kernel's operands: the forward's Q, K, V, O, LSE (with `paged`, K and
/// V are `[pages, page_size, heads_kv, d]` caches and the page table and the sequences' cached
/// lengths follow), then the splits' partial outputs and LSEs and the row tiles' semaphores
/// (flat workspaces the runtime owns). With `packed_q`, Q, O and the LSE are packed
/// (`[1, total_q, heads_q, d]`, `[1, heads_q, total_q]`) and the query offsets follow the page
/// table and lengths.
pub fn splitkv_operands(spec: &VariantSpec, paged: bool, packed_q: bool) -> Vec<Operand> {
    let mut ops = super::forward::forward_operands(
        spec,
        &TileConfig {
            family: KernelFamily::Sm80,
            ..default_splitkv_config(spec)
        },
    );
    if paged {
        ops[1].dims = vec![Pages, PageSize, HeadsKv, HeadDimQk];
        ops[2].dims = vec![Pages, PageSize, HeadsKv, HeadDimV];
        ops.push(Operand::new(
            PAGE_TABLE_OPERAND,
            Role::Input,
            OperandType::I32,
            &[Batch, MaxPages],
            Layout::Contiguous,
        ));
        ops.push(Operand::new(
            SEQLENS_K_OPERAND,
            Role::Input,
            OperandType::I32,
            &[Batch],
            Layout::Contiguous,
        ));
    }
    if packed_q {
        ops[0].dims = vec![Packed, TotalQ, HeadsQ, HeadDimQk];
        ops[3].dims = vec![Packed, TotalQ, HeadsQ, HeadDimV];
        ops[4].dims = vec![Packed, HeadsQ, TotalQ];
        ops.push(Operand::new(
            super::varlen::CU_SEQLENS_Q_OPERAND,
            Role::Input,
            OperandType::I32,
            &[CuLen],
            Layout::Contiguous,
        ));
    }
    // The partials of packed queries follow the packed LSE, `[heads_q, total_q]` per split.
    let rows: &[Extent] = if packed_q {
        &[HeadsQ, TotalQ]
    } else {
        &[Batch, HeadsQ, SeqQ]
    };
    let with = |lead: &[Extent], tail: &[Extent]| [lead, rows, tail].concat();
    ops.push(Operand::new(
        OPART_OPERAND,
        Role::Output,
        OperandType::F32,
        &with(&[Splits], &[HeadDimV]),
        Layout::Contiguous,
    ));
    ops.push(Operand::new(
        LSEPART_OPERAND,
        Role::Output,
        OperandType::F32,
        &with(&[Splits], &[]),
        Layout::Contiguous,
    ));
    ops.push(Operand::new(
        SEM_OPERAND,
        Role::Output,
        OperandType::I32,
        &[Batch, HeadsQ, SeqQ],
        Layout::Contiguous,
    ));
    ops
}

/// Plans the split-KV attention kernel of `spec` with `config` (see the module docs).
pub fn plan_splitkv(spec: &VariantSpec, config: TileConfig) -> Result<KernelPlan, PlanError> {
    plan_splitkv_kind(spec, config, KernelKind::SplitKv)
}

/// Plans the split-KV kernel over a paged KV cache. Any page size works (each key row is found
/// through the page table); `seq_k` in its argument struct is the cache's capacity
/// (`max_pages · page_size`), which also sizes tensor params over `seq` positions, while masks and
/// scores see each sequence's own cached length.
pub fn plan_splitkv_paged(spec: &VariantSpec, config: TileConfig) -> Result<KernelPlan, PlanError> {
    plan_splitkv_kind(spec, config, KernelKind::SplitKvPaged)
}

/// Plans the split-KV kernel over a paged KV cache with packed queries (chunked prefill): sequence
/// `b`'s queries are rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` of the packed Q, its keys the
/// first `seqlens_k[b]` of its pages. Masks and scores see each sequence's own query count and
/// cached length (a causal mask puts the new tokens after the cached ones: the last query sees
/// the last key). `seq_q` in the argument struct is the longest sequence's query count.
pub fn plan_splitkv_paged_varlen(
    spec: &VariantSpec,
    config: TileConfig,
) -> Result<KernelPlan, PlanError> {
    plan_splitkv_kind(spec, config, KernelKind::SplitKvPagedVarlen)
}

fn plan_splitkv_kind(
    spec: &VariantSpec,
    config: TileConfig,
    kind: KernelKind,
) -> Result<KernelPlan, PlanError> {
    super::tile::fp8_forward_only(spec, "the split-KV (decode) kernel")?;
    if let Some(why) = splitkv_unsupported(spec) {
        return Err(PlanError::SplitKvVariant(why));
    }
    splitkv_config_is_valid(spec, &config)?;
    let paged = matches!(
        kind,
        KernelKind::SplitKvPaged | KernelKind::SplitKvPagedVarlen
    );
    let packed_q = kind == KernelKind::SplitKvPagedVarlen;
    let operands = splitkv_operands(spec, paged, packed_q);
    let mut scalars = super::forward::ATTENTION_SCALARS.to_vec();
    scalars.push(ArgField::Size(Splits));
    if paged {
        scalars.extend([
            ArgField::Size(Pages),
            ArgField::Size(PageSize),
            ArgField::Size(MaxPages),
        ]);
    }
    if packed_q {
        scalars.push(ArgField::Size(TotalQ));
    }
    let args = arg_layout(spec, &operands, &scalars);
    Ok(KernelPlan {
        kind,
        spec: spec.clone(),
        config,
        args,
        operands,
        launch: LaunchShape {
            grid: GridRule::SplitKv {
                rows: config.block_m,
            },
            threads: config.warps * 32,
            smem_bytes: splitkv_smem_bytes(spec, &config),
        },
        mask: spec.mask.as_ref().map(|m| analyse_mask(spec, m)),
        kernel_name: kernel_name(kind, spec, &config),
        deterministic: false,
        block_map: None,
        quant: None,
    })
}

/// The shape of a split-KV launch, for choosing its split count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitShape {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads.
    pub heads_kv: usize,
    /// Query positions.
    pub seq_q: usize,
    /// Key positions.
    pub seq_k: usize,
}

impl SplitShape {
    /// Blocks of one split: (batch, KV head, packed row tile) triples.
    pub fn blocks_per_split(&self, cfg: &TileConfig) -> usize {
        let group = self.heads_q / self.heads_kv.max(1);
        self.batch * self.heads_kv * (group * self.seq_q).div_ceil(cfg.block_m as usize)
    }
}

/// The number of splits for a launch on a GPU with `sms` multiprocessors that runs
/// `blocks_per_sm` blocks of the kernel at once.
///
/// The rule (FlashAttention's, with a tighter bar because decode is bound by memory, where an
/// idle SM is lost bandwidth): for each split count `s` from 1, the wave efficiency is
/// `w / ceil(w)` with `w = blocks·s / (sms·blocks_per_sm)` waves; take the smallest `s` whose
/// efficiency is within 95 % of the best over all candidates. Candidates stop where a split
/// would give a warp fewer than two key tiles (its pipeline would never fill), and at
/// [`MAX_SPLITS`]. A launch that already fills 80 % of a wave takes one split.
///
/// ```
/// use flash_dsl::plan::splitkv::{choose_splits, default_splitkv_config, SplitShape};
/// let spec = flash_dsl::parse::parse_str("D { head_dim: 128, dtype: bf16 }").unwrap().remove(0);
/// let cfg = default_splitkv_config(&spec);
/// // Decode, batch 1, 32 query heads on 8 KV heads, 8k keys: 8 blocks per split on 132 SMs.
/// let one = SplitShape { batch: 1, heads_q: 32, heads_kv: 8, seq_q: 1, seq_k: 8192 };
/// let s = choose_splits(&one, &cfg, 132, 1);
/// assert!(s >= 16 && 8 * s <= 2 * 132, "{s}");
/// // Batch 64: 512 blocks already fill the GPU.
/// let many = SplitShape { batch: 64, ..one };
/// assert_eq!(choose_splits(&many, &cfg, 132, 1), 1);
/// ```
pub fn choose_splits(
    shape: &SplitShape,
    cfg: &TileConfig,
    sms: usize,
    blocks_per_sm: usize,
) -> usize {
    let blocks = shape.blocks_per_split(cfg);
    let slots = (sms * blocks_per_sm.max(1)).max(1);
    if blocks == 0 || blocks * 5 >= slots * 4 {
        return 1;
    }
    let key_tiles = shape.seq_k.div_ceil(cfg.block_n as usize);
    let max_s = (key_tiles / (2 * cfg.warps as usize)).clamp(1, MAX_SPLITS);
    let eff = |s: usize| {
        let w = (blocks * s) as f64 / slots as f64;
        w / w.ceil()
    };
    let best = (1..=max_s).map(eff).fold(0.0f64, f64::max);
    (1..=max_s).find(|&s| eff(s) >= 0.95 * best).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(src: &str) -> VariantSpec {
        crate::parse::parse_str(src).unwrap().remove(0)
    }

    #[test]
    fn splits_fill_the_gpu_and_stop_at_short_keys() {
        let s = spec("D { head_dim: 128, dtype: bf16 }");
        let cfg = default_splitkv_config(&s);
        let shape = SplitShape {
            batch: 1,
            heads_q: 32,
            heads_kv: 8,
            seq_q: 1,
            seq_k: 131072,
        };
        let n = choose_splits(&shape, &cfg, 132, 1);
        let eff = |s: usize| {
            let w = (8 * s) as f64 / 132.0;
            w / w.ceil()
        };
        assert!(eff(n) >= 0.95 * (1..=256).map(eff).fold(0.0, f64::max));
        // 64 keys: two tiles per warp at most once, so one split.
        let short = SplitShape { seq_k: 64, ..shape };
        assert_eq!(choose_splits(&short, &cfg, 132, 1), 1);
        // Never more splits than two key tiles per warp allow.
        let mid = SplitShape {
            seq_k: 1024,
            ..shape
        };
        assert!(choose_splits(&mid, &cfg, 132, 1) <= 1024 / 32 / 8);
    }

    #[test]
    fn smem_counts_every_warps_buffers_and_fits_by_default() {
        for d in [64, 96, 128, 256] {
            let s = spec(&format!("D {{ head_dim: {d}, dtype: f16 }}"));
            let cfg = default_splitkv_config(&s);
            assert!(splitkv_config_is_valid(&s, &cfg).is_ok(), "d {d}: {cfg:?}");
        }
        let s = spec("D { head_dim: 128, dtype: bf16 }");
        let cfg = default_splitkv_config(&s);
        // Q 16 rows, then 8 warps x 2 stages x 16 keys x (K + V) rows of 256 bytes.
        assert_eq!(splitkv_smem_bytes(&s, &cfg), 16 * 256 + 8 * 2 * 16 * 512);
    }

    #[test]
    fn unsupported_variants_and_tiles_are_named() {
        let drop = spec("D { head_dim: 64, dtype: bf16, dropout: 0.1 }");
        let e = plan_splitkv(&drop, default_splitkv_config(&drop)).unwrap_err();
        assert!(e.to_string().contains("dropout"), "{e}");
        let s = spec("D { head_dim: 64, dtype: bf16 }");
        let mut cfg = default_splitkv_config(&s);
        cfg.block_m = 64;
        let e = plan_splitkv(&s, cfg).unwrap_err();
        assert!(e.to_string().contains("got 64x16x8x2 on Sm80"), "{e}");
    }

    #[test]
    fn the_kernel_owns_its_partials_and_semaphores() {
        let s = spec("W { head_dim: 128, dtype: bf16, mask: causal && q - k < 256 }");
        let p = plan_splitkv(&s, default_splitkv_config(&s)).unwrap();
        for name in [OPART_OPERAND, LSEPART_OPERAND, SEM_OPERAND] {
            let (_, op) = p.operand(name).unwrap();
            assert_eq!((op.role, op.layout), (Role::Output, Layout::Contiguous));
        }
        assert_eq!(p.kernel_name, "flash_skv_w_bf16_d128x128_m16n16w8s2");
        assert!(p.mask.is_some());
        assert!(p
            .args
            .slots
            .iter()
            .any(|s| s.field == ArgField::Size(Splits)));
    }
}
