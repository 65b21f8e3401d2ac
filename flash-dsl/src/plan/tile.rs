//! Tile configurations: the rules each kernel family imposes, the defaults, shared memory.

use serde::{Deserialize, Serialize};

use crate::spec::{Expr, VariantSpec};

/// Tile shape and launch shape of the forward kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TileConfig {
    /// Query rows per thread block (`Br`).
    pub block_m: u32,
    /// Key columns per inner-loop step (`Bc`).
    pub block_n: u32,
    /// Warps per thread block; each warp owns `block_m / warps` query rows (16 or 32).
    pub warps: u32,
    /// K/V shared-memory buffers in flight (1 = no prefetch, 2 = double buffering).
    pub stages: u32,
    /// Which kernel skeleton expands the plan.
    #[serde(default)]
    pub family: KernelFamily,
}

/// The kernel skeleton a plan expands. Both compute the same function; they differ in the
/// tensor-core instructions and therefore in the GPUs they run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum KernelFamily {
    /// `mma.sync` fed by `ldmatrix`, each warp owning 16 or 32 query rows: any GPU from sm_80.
    #[default]
    Sm80,
    /// `wgmma` with operands in shared memory, each warpgroup owning 64 query rows: sm_90a only.
    Sm90,
    /// sm90 with warp specialisation: one producer warpgroup loads Q, K and V with the tensor
    /// memory accelerator (TMA) and publishes them through mbarriers; the consumer warpgroups
    /// (64 query rows each) never wait on a block-wide barrier. `warps` counts the producer:
    /// `block_m / 16 + 4`. The argument struct carries three TMA descriptors.
    Sm90Ws,
}

impl KernelFamily {
    /// Every family, in the order of their tags' documentation.
    pub const ALL: [KernelFamily; 3] =
        [KernelFamily::Sm80, KernelFamily::Sm90, KernelFamily::Sm90Ws];

    /// The family's short name: `sm80`, `sm90` or `sm90ws` — the value `FLASH_FAMILY` and
    /// `--family` take, the suffix of kernel names, the tag of tuner labels and snapshots.
    pub fn tag(self) -> &'static str {
        match self {
            KernelFamily::Sm80 => "sm80",
            KernelFamily::Sm90 => "sm90",
            KernelFamily::Sm90Ws => "sm90ws",
        }
    }

    /// The family whose [`tag`](KernelFamily::tag) is `tag`.
    pub fn from_tag(tag: &str) -> Option<KernelFamily> {
        KernelFamily::ALL.into_iter().find(|f| f.tag() == tag)
    }

    /// The fastest family a GPU of this architecture (`sm_80`, `sm_90a`, …) can run.
    pub fn for_arch(arch: &str) -> KernelFamily {
        if arch == "sm_90a" {
            KernelFamily::Sm90Ws
        } else {
            KernelFamily::Sm80
        }
    }

    /// Whether a kernel of this family can be compiled for `arch`.
    pub fn runs_on(self, arch: &str) -> bool {
        match self {
            KernelFamily::Sm80 => true,
            KernelFamily::Sm90 | KernelFamily::Sm90Ws => arch == "sm_90a",
        }
    }
}

/// Why a spec cannot be planned with a configuration. Messages are lower case and name the
/// offending value and the limit it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// sm80: `warps` (the value given) is not 4 or 8.
    #[error("warps must be 4 or 8; got {0}")]
    Warps(u32),
    /// sm80: `block_m / warps` is not a whole 16 or 32 rows per warp.
    #[error(
        "each warp must own 16 or 32 query rows (block_m / warps); got block_m {block_m} / warps {warps}"
    )]
    RowsPerWarp {
        /// The configuration's query rows per block.
        block_m: u32,
        /// The configuration's warps per block.
        warps: u32,
    },
    /// sm80: `block_n` (the value given) is not 32, 64 or 128.
    #[error("block_n must be 32, 64 or 128; got {0}")]
    BlockN(u32),
    /// sm80: `stages` (the value given) is not 1 or 2.
    #[error("the sm80 forward kernel takes stages 1 (K and V share one buffer pair) or 2 (double-buffered); got {0}")]
    Stages(u32),
    /// A head dim is 0, not a multiple of 8, or above 256.
    #[error("{which} must be a positive multiple of 8 and at most 256; got {value}")]
    HeadDim {
        /// `"head_dim_qk"` or `"head_dim_v"`.
        which: &'static str,
        /// The offending head dim.
        value: u32,
    },
    /// The tiles need more dynamic shared memory than a block may have.
    #[error("the tiles need {bytes} bytes of shared memory; the limit is {limit}")]
    SharedMemory {
        /// Bytes the configuration needs ([`smem_bytes`]).
        bytes: u32,
        /// The limit, [`MAX_SMEM_BYTES`].
        limit: u32,
    },
    /// sm90 / sm90ws: `block_m` is not a whole number of 64-row warpgroups the family takes, or
    /// `warps` does not match it.
    #[error(
        "the sm90 kernel gives each warpgroup 64 query rows: block_m must be 64, 128 or 192 with warps = block_m / 16; got block_m {block_m}, warps {warps}"
    )]
    Warpgroups {
        /// The configuration's query rows per block.
        block_m: u32,
        /// The configuration's warps per block (producer warpgroup included for sm90ws).
        warps: u32,
    },
    /// sm90 / sm90ws: `block_n` is not 64 or 128, or `stages` is not one the family takes
    /// (1 or 2 for sm90, 2 for sm90ws).
    #[error(
        "the sm90 kernel takes block_n 64 or 128 and stages 1 or 2; got block_n {block_n}, stages {stages}"
    )]
    Sm90Tile {
        /// The configuration's keys per step.
        block_n: u32,
        /// The configuration's K/V buffers.
        stages: u32,
    },
    /// The warp-specialised kernel's keys per step or K/V stages are outside what it supports.
    #[error(
        "the sm90ws kernel takes block_n 64, 128 or 192 and stages 2 (Q·Kᵀ, softmax and P·V in series) or 3 (the overlapped schedule); got block_n {block_n}, stages {stages}"
    )]
    Sm90WsTile {
        /// The configuration's keys per step.
        block_n: u32,
        /// The configuration's K/V stages.
        stages: u32,
    },
    /// The backward kernel of `family` does not support this tile or these head dims.
    #[error(
        "the {family:?} backward kernel takes 64x64x4x1 or 64x128x8x1 (block_m x block_n x warps x stages; the Sm90 kernel also 128x128x8x1 at head dims up to 64) and head dims up to 128 (the Sm80 kernel up to 256, in 227 KB of shared memory); got {block_m}x{block_n}x{warps}x{stages}, head dims {dqk}/{dv}"
    )]
    Backward {
        /// The family asked for.
        family: KernelFamily,
        /// Query rows per tile of the configuration.
        block_m: u32,
        /// Keys per tile of the configuration.
        block_n: u32,
        /// Warps per block of the configuration.
        warps: u32,
        /// Stages of the configuration.
        stages: u32,
        /// The spec's Q/K head dim.
        dqk: u32,
        /// The spec's V/O head dim.
        dv: u32,
    },
    /// The declared sparsity layout's block is not a whole number of tiles in both directions.
    #[error(
        "the sparsity layout's blocks of {block} positions must be whole numbers of the kernel's tiles; got block_m {block_m}, block_n {block_n}"
    )]
    SparseTile {
        /// Positions per layout block ([`crate::spec::Sparsity::block`]).
        block: u32,
        /// The configuration's query rows per tile.
        block_m: u32,
        /// The configuration's keys per tile.
        block_n: u32,
    },
    /// The split-KV kernel's tile is outside what it supports.
    #[error(
        "the split-KV kernel takes block_m 16 or 32 (packed query rows), block_n 16, 32 or 64 (keys per warp step), 2 to 8 warps, 1 to 4 stages and the Sm80 family; got {block_m}x{block_n}x{warps}x{stages} on {family:?}"
    )]
    SplitKvTile {
        /// Packed query rows per block.
        block_m: u32,
        /// Keys per warp step.
        block_n: u32,
        /// Warps per block.
        warps: u32,
        /// Buffers per warp.
        stages: u32,
        /// The family asked for.
        family: KernelFamily,
    },
    /// The variant has no split-KV kernel (the reason says why; the forward kernel runs it).
    #[error("no split-KV kernel: {0}")]
    SplitKvVariant(&'static str),
    /// A quantisation kernel's configuration breaks a rule; the message names the value.
    #[error("quantisation kernel: {0}")]
    Quantize(String),
    /// An fp8 (`dtype: e4m3`) variant asked for something its kernel does not do; the message
    /// names it and what is supported.
    #[error("fp8 attention: {0}")]
    Fp8(String),
    /// The variant has no packed (variable-length) kernel; the reason says why.
    #[error("no packed (variable-length) kernel: {0}")]
    VarlenVariant(&'static str),
    /// A backward pipeline was asked for a family that has no backward kernel (sm90ws).
    #[error("the backward pass has no {0:?} kernel; it runs on the Sm90 family (sm_90a, wgmma) and the Sm80 family (any GPU from sm_80)")]
    BackwardFamily(KernelFamily),
}

/// A declared sparsity layout decides whole tiles only when its block is a whole number of
/// them (in both directions).
pub fn sparse_tiles_fit(spec: &VariantSpec, cfg: &TileConfig) -> Result<(), PlanError> {
    match spec.sparsity {
        Some(sp) if sp.block % cfg.block_m != 0 || sp.block % cfg.block_n != 0 => {
            Err(PlanError::SparseTile {
                block: sp.block,
                block_m: cfg.block_m,
                block_n: cfg.block_n,
            })
        }
        _ => Ok(()),
    }
}

/// Head dims every kernel takes: positive multiples of 8 up to 256.
pub fn head_dims_valid(spec: &VariantSpec) -> Result<(), PlanError> {
    for (which, value) in [
        ("head_dim_qk", spec.head_dim_qk),
        ("head_dim_v", spec.head_dim_v),
    ] {
        if value == 0 || value % 8 != 0 || value > 256 {
            return Err(PlanError::HeadDim { which, value });
        }
    }
    Ok(())
}

/// Dynamic shared memory one block may opt into on sm_90 (227 KiB).
pub const MAX_SMEM_BYTES: u32 = 227 * 1024;

/// Shared memory of one sm_90 SM (228 KiB), of which each resident block also takes 1 KiB the
/// system reserves.
pub const SM_SMEM_BYTES: u32 = 228 * 1024;

/// How many blocks of `threads` threads and `smem` bytes of dynamic shared memory one sm_90 SM
/// holds at once, at most: by shared memory, and by registers at the most a thread may have
/// (255, allocated in 256s: the plan does not know ptxas's count). At least 1.
pub fn blocks_per_sm(threads: u32, smem: u32) -> u32 {
    let by_smem = SM_SMEM_BYTES / (smem + 1024);
    let by_regs = 65536 / (threads.max(1) * 256);
    by_smem.min(by_regs).max(1)
}

/// The default tile configuration for a spec and kernel family, by its larger head dim.
///
/// sm90ws (the default on sm_90a, measured on an H200): two consumer warpgroups of 64 rows and
/// the TMA producer; 128 keys per step (at head dim 64 too, where it ran 14 % faster than 64);
/// three K/V stages, which select the overlapped schedule, for variants with a score
/// expression and for masks at head dims up to 64, else two; the plain dense variant at head
/// dims up to 64 takes 192 queries in three consumer warpgroups.
///
/// sm90 (measured on an H200 against the other sm90 tiles, see `bench/results/`): 128 query rows
/// in two warpgroups; at head dim 128, 128 keys per step, double-buffered (fewer steps; the
/// wgmma n extent amortises the softmax); at head dim 64, 64 keys single-buffered, which ran
/// 8-20% faster than 128 keys or two stages there (two blocks fit on an SM).
///
/// ```
/// use flash_dsl::plan::{config_is_valid, default_config_for, KernelFamily, PlanError};
///
/// let spec = flash_dsl::parse::parse_str("Dense { head_dim: 64, dtype: f16 }")
///     .unwrap()
///     .remove(0);
/// let ws = default_config_for(&spec, KernelFamily::Sm90Ws);
/// // Plain dense at head dim 64: three consumer warpgroups of 64 queries and the producer.
/// assert_eq!((ws.block_m, ws.block_n, ws.warps, ws.stages), (192, 128, 16, 2));
/// let capped = flash_dsl::parse::parse_str("Capped { head_dim: 128, dtype: bf16, score: softcap(s, 30.0) }")
///     .unwrap()
///     .remove(0);
/// assert_eq!(default_config_for(&capped, KernelFamily::Sm90Ws).stages, 3);
/// let sm90 = default_config_for(&spec, KernelFamily::Sm90);
/// assert_eq!((sm90.block_m, sm90.block_n, sm90.warps, sm90.stages), (128, 64, 8, 1));
/// assert!(config_is_valid(&spec, &sm90).is_ok());
///
/// // The sm80 skeleton takes 4 or 8 warps.
/// let mut sm80 = default_config_for(&spec, KernelFamily::Sm80);
/// sm80.warps = 6;
/// assert_eq!(config_is_valid(&spec, &sm80), Err(PlanError::Warps(6)));
/// ```
pub fn default_config_for(spec: &VariantSpec, family: KernelFamily) -> TileConfig {
    match family {
        KernelFamily::Sm80 => default_config(spec),
        KernelFamily::Sm90Ws => {
            let d = spec.head_dim_qk.max(spec.head_dim_v);
            if spec.fp8.is_some() {
                // One scale block of queries and keys per tile (see `fp8_config_valid`), three
                // stages: the overlapped schedule, measured on an H200 against two (same call,
                // `bench/results/NVIDIA_H200-2026-11-24-fp8-stages.log`): causal +11 % (n 4096)
                // and +19 % (n 16384), dense +1 %.
                // At head dim 256 three only for plain dense attention: with a mask or a score
                // hook the overlapped consumer spills (40–184 bytes, NVRTC sm_90a), plain dense
                // does not, and there three beat two by 2.7–4.7 % (H200, same call,
                // `bench/results/NVIDIA_H200-2026-11-25-fp8-d256.md`).
                let b = crate::spec::FP8_SCALE_BLOCK;
                // With bf16 V (`v: bf16`) at 256, three stages of 64 KB V tiles do not fit.
                let plain = spec.mask.is_none()
                    && spec.score.is_none()
                    && !spec.fp8.is_some_and(|f| f.v_bf16);
                // 192 keys per tile where one scale per head or tensor allows it, for dense and
                // causal attention without a score hook: H200, same call, two alternations
                // (`bench/results/ab-fp8-n192/`), per head at d 128 dense +3 % (n 4096) and
                // +5.6 % (n 16384), causal +2.7 % and +4.3 %. Other masks keep 128 (more of a
                // wider edge tile is masked: the bf16 kernel's windows and documents lost
                // 12-22 % at 192); the tuner times both.
                let dense_or_causal = spec
                    .mask
                    .as_ref()
                    .is_none_or(|m| *m == crate::validate::causal_expr());
                // (V rows staged beside Vᵀ: three stages of 192 keys do not fit.)
                let wide = dense_or_causal
                    && spec.score.is_none()
                    && !spec.fp8.is_some_and(|f| f.v_rows)
                    && fp8_block_n_ok(spec, 192);
                return TileConfig {
                    block_m: b,
                    block_n: if wide { 192 } else { b },
                    warps: 12,
                    stages: if d > 128 && !plain { 2 } else { 3 },
                    family,
                };
            }
            if d > 128 {
                // Above head dim 128 the output accumulator leaves the consumers too few of
                // their 224 registers: the plain sm90 kernel takes over.
                return default_config_for(spec, KernelFamily::Sm90);
            }
            // Three stages select the overlapped schedule (Q·Kᵀ of the next tile and P·V of
            // this one in flight during the next softmax). Measured on an H200 against the
            // series schedule, alternating in one call: variants with a score expression gain
            // consistently (soft-cap +3-5 %, ALiBi +7-11 % at d128), and so do masks at head
            // dims up to 64 (causal d64 +3-6 %); the plain dense kernel loses (d64 -4 to
            // -12 %) and masks alone at d128 are mixed (causal -10 to +2 %, causal with
            // dropout -2 to -5 %), so they keep two, as do variants that read a block map (the
            // map walk's registers make that consumer spill). The tuner times both. Where
            // three stages do not fit in shared memory, two.
            let overlap = (spec.score.is_some() || (spec.mask.is_some() && d <= 64))
                && !super::block_map::needs_block_map(spec);
            let cfg = TileConfig {
                block_m: 128,
                // 128 keys per step at every head dim: at d=64 the tuner measured 128x128
                // 14 % faster than 128x64 on an H200 (fewer steps amortise the softmax). 192
                // keys (two stages only at d 128) against 128, same call, three rounds
                // (`bench/results/history/2026-11-24-bn192-attempt/`): dense d128 -8 / -2 / +2 %
                // at n 1k / 4k / 16k, causal -5 / -2 / +2 %, windows and documents -12 to -22 %
                // (more of each edge tile masked), plain dense d64 (192 queries) -5 / +3 / +5 %.
                // It stays a tuner candidate, not a default.
                block_n: 128,
                warps: 12,
                stages: if overlap { 3 } else { 2 },
                family,
            };
            // The plain dense kernel takes three consumer warpgroups (192 queries): it is bound
            // by the softmax's latency, and the third warpgroup hides more of it. H200, d64:
            // +11-13 % at seq 4096/16384, +2 % at 1024; d128 (`bench/results/ab-shape-defaults/`):
            // see there. A causal mask lost 16 % at seq 1024 with it (more of each diagonal tile
            // wasted), so masks, score hooks, dropout and block maps keep 128 (longer causal
            // launches take it: `default_config_for_launch`).
            if d <= 128
                && spec.mask.is_none()
                && spec.score.is_none()
                && spec.dropout.is_none()
                && spec.sparsity.is_none()
            {
                let wide = TileConfig {
                    block_m: 192,
                    warps: 16,
                    stages: 2,
                    ..cfg
                };
                if check_smem(spec, &wide).is_ok() {
                    return wide;
                }
            }
            if check_smem(spec, &cfg).is_ok() {
                cfg
            } else {
                TileConfig { stages: 2, ..cfg }
            }
        }
        KernelFamily::Sm90 => {
            let d = spec.head_dim_qk.max(spec.head_dim_v);
            let (block_n, stages) = match d {
                0..=64 => (64, 1),
                65..=128 => (128, 2),
                _ => (64, 2),
            };
            TileConfig {
                block_m: 128,
                block_n,
                warps: 8,
                stages,
                family,
            }
        }
    }
}

/// The default configuration of a launch over `seq_q` queries: [`default_config_for`], except
/// that masks alone take three consumer warpgroups (192 queries) on long launches: a causal mask
/// 192 × 192 at head dims up to 64 from [`WIDE_CAUSAL_MIN_QUERIES`] queries; at head dims 65 to
/// 128, from [`WIDE_MASK_D128_MIN_QUERIES`], 192 × 128 for every mask the kernels classify
/// from indices whose walks grow with the length (causal, prefix-LM; not a sliding window's
/// band). Measured on an H200:
/// - d64 (`bench/results/ab-shape-defaults/`: the tuner's runs and two A/Bs): +8 % at 2048
///   queries (tuner), +12 / +17 % at 4096 / 16384 over the 128 × 128 default; at 1024 the
///   192-row diagonal tiles lose 6-16 % (more of each is masked, and the walks are short).
/// - d128 (`bench/results/ab-idle-wg/`), once a warpgroup whose rows all lie past the end
///   computes nothing: −2.5 % at 4096, +2 % (best of three; +10 % by the median) at 8192,
///   +9 / +21 % at 16384 in two calls.
/// - d128 masks at 16384 queries (`bench/results/ab-idle-wg/4-masks/`): prefix-LM +8.8 %, the
///   1024-wide sliding window −8.2 % (short walks, more of each tile masked): bands keep 128.
///
/// Documents (a block map) keep the default; they were not measured with it.
///
/// ```
/// use flash_dsl::plan::{default_config_for, default_config_for_launch, KernelFamily};
/// let spec = |d| {
///     let src = format!("C {{ head_dim: {d}, dtype: bf16, mask: causal }}");
///     flash_dsl::parse::parse_str(&src).unwrap().remove(0)
/// };
/// let ws = KernelFamily::Sm90Ws;
/// assert_eq!(default_config_for_launch(&spec(64), ws, 1024), default_config_for(&spec(64), ws));
/// let long = default_config_for_launch(&spec(64), ws, 16384);
/// assert_eq!((long.block_m, long.block_n), (192, 192));
/// assert_eq!(default_config_for_launch(&spec(128), ws, 4096), default_config_for(&spec(128), ws));
/// let long = default_config_for_launch(&spec(128), ws, 8192);
/// assert_eq!((long.block_m, long.block_n), (192, 128));
/// ```
pub fn default_config_for_launch(
    spec: &VariantSpec,
    family: KernelFamily,
    seq_q: usize,
) -> TileConfig {
    let cfg = default_config_for(spec, family);
    // A mask alone: no score hook, dropout, sparsity or fp8 (each keeps its own default).
    let mask_alone = spec.score.is_none()
        && spec.dropout.is_none()
        && spec.sparsity.is_none()
        && spec.fp8.is_none();
    let causal_only = mask_alone && spec.mask.as_ref() == Some(&crate::validate::causal_expr());
    // Masks whose walks grow with the length (causal, prefix-LM: no band bounds a query's keys
    // from below) and that the kernels classify from indices (no block map).
    let long_walk_mask = mask_alone
        && spec.mask.as_ref().is_some_and(|m| {
            !super::block_map::needs_block_map(spec)
                && !is_band(&super::mask::analyse_mask(spec, m))
        });
    let (block_n, min_queries, takes) = match spec.head_dim_qk.max(spec.head_dim_v) {
        0..=64 => (192, WIDE_CAUSAL_MIN_QUERIES, causal_only),
        65..=128 => (128, WIDE_MASK_D128_MIN_QUERIES, long_walk_mask),
        _ => return cfg,
    };
    if family == KernelFamily::Sm90Ws && takes && seq_q >= min_queries {
        let wide = TileConfig {
            block_m: 192,
            block_n,
            warps: 16,
            stages: 2,
            family,
        };
        if config_is_valid(spec, &wide).is_ok() {
            return wide;
        }
    }
    cfg
}

/// Whether every visible key of a query lies in a band whose lower edge follows the query: the
/// mask is a conjunction with an affine atom `cq·q + ck·k + c < 0` (or `≤`, or the mirrored `>`)
/// that bounds `k` from below by an increasing function of `q`, as a sliding window's
/// `q - k < w` does. Such walks do not grow with the length.
fn is_band(plan: &super::mask::MaskPlan) -> bool {
    use super::mask::{CmpOp, MaskTree};
    let lower_edge = |t: &MaskTree| match t {
        MaskTree::Atom(i) => {
            let a = &plan.atoms[*i];
            match a.op {
                CmpOp::Lt | CmpOp::Le => a.cq > 0 && a.ck < 0,
                CmpOp::Gt | CmpOp::Ge => a.cq < 0 && a.ck > 0,
                CmpOp::Eq | CmpOp::Ne => false,
            }
        }
        _ => false,
    };
    match &plan.tree {
        MaskTree::And(xs) => xs.iter().any(lower_edge),
        t => lower_edge(t),
    }
}

/// From this many queries a causal launch at head dims up to 64 takes 192 × 192 tiles (see
/// [`default_config_for_launch`]).
pub const WIDE_CAUSAL_MIN_QUERIES: usize = 2048;

/// From this many queries a launch of a mask whose walks grow with the length (causal,
/// prefix-LM) at head dims 65 to 128 takes 192 × 128 tiles (see [`default_config_for_launch`]).
pub const WIDE_MASK_D128_MIN_QUERIES: usize = 8192;

/// The default sm80 (`mma.sync`) tile configuration for a spec, by its larger head dim.
pub fn default_config(spec: &VariantSpec) -> TileConfig {
    let d = spec.head_dim_qk.max(spec.head_dim_v);
    // Chosen so that no example spills (`flash compile --arch sm_80,sm_90`, see README): a warp
    // owning 32 rows holds 32·d/32 output and 32·block_n/32 score accumulators per thread, so
    // block_n shrinks to 32 above head dim 64; a score hook that reads a tensor keeps one
    // lookup per score element in flight, which only fits with 16 rows per warp; so does any
    // score hook above head dim 64 (the softcap at d=128 sat at 254 of 255 registers with 32-row
    // warps, one shared-template refactor away from spilling); at 256 the output accumulator
    // alone needs the 16-row warps and the prefetch stage goes.
    let reads_tensor = spec.score.as_ref().is_some_and(|e| {
        let mut found = false;
        e.visit(&mut |x| found |= matches!(x, Expr::Index(..)));
        found
    });
    let (block_m, block_n, warps, stages) = match d {
        _ if d <= 128 && reads_tensor => (64, 64, 4, 2),
        65..=128 if spec.score.is_some() => (64, 64, 4, 2),
        0..=64 => (128, 64, 4, 2),
        65..=128 => (128, 32, 4, 2),
        _ => (64, 64, 4, 1),
    };
    TileConfig {
        block_m,
        block_n,
        warps,
        stages,
        family: KernelFamily::Sm80,
    }
}

/// Checks that the kernel skeleton supports `cfg` for `spec`'s head dims.
pub fn config_is_valid(spec: &VariantSpec, cfg: &TileConfig) -> Result<(), PlanError> {
    head_dims_valid(spec)?;
    sparse_tiles_fit(spec, cfg)?;
    fp8_config_valid(spec, cfg)?;
    if cfg.family == KernelFamily::Sm90Ws {
        if !matches!(cfg.block_m, 64 | 128 | 192) || cfg.warps != cfg.block_m / 16 + 4 {
            return Err(PlanError::Warpgroups {
                block_m: cfg.block_m,
                warps: cfg.warps,
            });
        }
        if !matches!(cfg.block_n, 64 | 128 | 192) || !matches!(cfg.stages, 2 | 3) {
            return Err(PlanError::Sm90WsTile {
                block_n: cfg.block_n,
                stages: cfg.stages,
            });
        }
        return check_smem(spec, cfg);
    }
    if cfg.family == KernelFamily::Sm90 {
        if !matches!(cfg.block_m, 64 | 128 | 192) || cfg.warps * 16 != cfg.block_m {
            return Err(PlanError::Warpgroups {
                block_m: cfg.block_m,
                warps: cfg.warps,
            });
        }
        if !matches!(cfg.block_n, 64 | 128) || !matches!(cfg.stages, 1 | 2) {
            return Err(PlanError::Sm90Tile {
                block_n: cfg.block_n,
                stages: cfg.stages,
            });
        }
        return check_smem(spec, cfg);
    }
    if !matches!(cfg.warps, 4 | 8) {
        return Err(PlanError::Warps(cfg.warps));
    }
    let rows_per_warp = cfg.block_m / cfg.warps;
    if rows_per_warp * cfg.warps != cfg.block_m || !matches!(rows_per_warp, 16 | 32) {
        return Err(PlanError::RowsPerWarp {
            block_m: cfg.block_m,
            warps: cfg.warps,
        });
    }
    if !matches!(cfg.block_n, 32 | 64 | 128) {
        return Err(PlanError::BlockN(cfg.block_n));
    }
    // The sm80 skeleton pipelines one or two K/V buffers; a third stage was accepted once and
    // never loaded V again (found by the dropout mask check).
    if !matches!(cfg.stages, 1 | 2) {
        return Err(PlanError::Stages(cfg.stages));
    }
    check_smem(spec, cfg)
}

/// What the fp8 forward supports (`dtype: e4m3`): the warp-specialised Hopper kernel at head
/// dim 64, 128 or 256, one scale block per tile (128 × 128, two or three stages), masks and score
/// hooks, e4m3 V and e4m3 or int8 Q and K; no dropout, no declared sparsity. Each refusal names
/// the value and the rule.
pub fn fp8_config_valid(spec: &VariantSpec, cfg: &TileConfig) -> Result<(), PlanError> {
    if spec.fp8.is_none() {
        return Ok(());
    }
    let fail = |m: String| Err(PlanError::Fp8(m));
    // The language only writes these; a spec built in Rust or read from JSON could say more,
    // and an int8 V or e5m2 Q/K would meet a P·V or Q·Kᵀ product of another type.
    let f = spec.fp8.expect("checked above");
    if f.format != crate::fp8::Fp8Format::E4m3
        || !matches!(
            f.qk_format,
            crate::fp8::Fp8Format::E4m3 | crate::fp8::Fp8Format::Int8
        )
    {
        return fail(format!(
            "V's codes are e4m3 and Q's and K's e4m3 or int8; got V {} and Q/K {}",
            f.format.name(),
            f.qk_format.name()
        ));
    }
    // (The language refuses both at their tokens.)
    if f.scaling == crate::fp8::Scaling::PerChannel {
        return fail(
            "Q's and K's scales cannot be per channel (Q·Kᵀ sums over the channels); per channel is V's alone (`v_scales`)".into(),
        );
    }
    if f.v_bf16 && f.v_scales.is_some() {
        return fail("bf16 V (`v: bf16`) has no scales; `v_scales` groups e4m3 V's".into());
    }
    if cfg.family != KernelFamily::Sm90Ws {
        return fail(format!(
            "fp8 kernels exist for the warp-specialised Hopper family (sm90ws, sm_90a) only; got {}",
            cfg.family.tag()
        ));
    }
    // A head dim is one or two 128-byte planes of codes (and V's transposed box, that many
    // rows). At 64 a row still takes a 128-byte plane: the TMA box reads 128 columns, the 64
    // past the head zero-filled, and Q·Kᵀ reads the first 64 (twice the shared memory of Q and
    // K, no wasted tensor work; a 64-byte swizzle would halve it).
    if spec.head_dim_qk != spec.head_dim_v || !matches!(spec.head_dim_qk, 64 | 128 | 256) {
        return fail(format!(
            "head dim 64, 128 or 256, the same for Q, K and V; got {}/{}",
            spec.head_dim_qk, spec.head_dim_v
        ));
    }
    let block = crate::spec::FP8_SCALE_BLOCK;
    // One scale block of queries and keys. (192 queries in three consumer warpgroups spilled
    // 20-290 bytes at their 160 registers.) With one scale per head or tensor a tile may take
    // 192 keys (`fp8_block_n_ok`).
    if (cfg.block_m, cfg.warps) != (block, 12)
        || !fp8_block_n_ok(spec, cfg.block_n)
        || !matches!(cfg.stages, 2 | 3)
    {
        let keys = if fp8_block_n_ok(spec, 192) {
            format!("{block} or 192")
        } else {
            format!("{block}")
        };
        // Why 192 is out, where it was asked for.
        let why = if cfg.block_n == 192 && !fp8_block_n_ok(spec, 192) {
            " (192 keys need Q's and K's scales per head or tensor — `scales: per_head` or `per_tensor`; a per-block scale covers 128 keys — V's not per block (`v_scales`), e4m3 V codes and head dim at most 128)"
        } else {
            ""
        };
        return fail(format!(
            "the tile is {block} queries (one scale block) by {keys} keys, 12 warps, 2 or 3 stages; got {}x{}x{}x{}{why}",
            cfg.block_m, cfg.block_n, cfg.warps, cfg.stages
        ));
    }
    if f.v_rows && spec.head_dim_v != 128 {
        return fail(format!(
            "`v_layout: rows` (V transposed in shared memory) is built for head dim 128; got {} (use the default `v_layout: transposed`)",
            spec.head_dim_v
        ));
    }
    if spec.dropout.is_some() {
        return fail("dropout is not supported with fp8 inputs".into());
    }
    if spec.sparsity.is_some() {
        return fail("a declared block-sparse layout is not supported with fp8 inputs".into());
    }
    Ok(())
}

/// Keys per tile an fp8 forward can take: one scale block (128) with per-block scales, whose
/// tile's K and V scales are one number each; 128 or 192 with one scale per head or tensor
/// (V's also per channel) —
/// wider tiles spread a tile's fixed costs (row maxima, the output's rescale, the waits) over
/// more keys, as FlashAttention-3's fp8 forward does (224 there; 192 keeps Vᵀ's second box
/// within 232 registers a consumer thread at head dim 128: S 96, O 64, P 24; at 256 O alone
/// takes 128).
/// Only with e4m3 V codes: bf16 V (`v: bf16`) at 192 keys was never run on a GPU, and its three
/// default stages would not fit.
pub fn fp8_block_n_ok(spec: &VariantSpec, block_n: u32) -> bool {
    let Some(f) = spec.fp8 else { return false };
    block_n == crate::spec::FP8_SCALE_BLOCK
        || (block_n == 192
            && spec.head_dim_v <= 128
            && !f.v_bf16
            && !matches!(f.scaling, crate::fp8::Scaling::PerBlock { .. })
            && !matches!(f.v_scaling(), crate::fp8::Scaling::PerBlock { .. }))
}

/// An fp8 variant has only the forward kernel; `what` names the kind asked for.
pub fn fp8_forward_only(spec: &VariantSpec, what: &str) -> Result<(), PlanError> {
    match spec.fp8 {
        Some(_) => Err(PlanError::Fp8(format!(
            "{what} is not available for fp8 (`dtype: e4m3`) variants: only the forward kernel exists"
        ))),
        None => Ok(()),
    }
}

fn check_smem(spec: &VariantSpec, cfg: &TileConfig) -> Result<(), PlanError> {
    let bytes = smem_bytes(spec, cfg);
    if bytes > MAX_SMEM_BYTES {
        return Err(PlanError::SharedMemory {
            bytes,
            limit: MAX_SMEM_BYTES,
        });
    }
    Ok(())
}

/// Rounds a head dim up to a whole number of 128-byte (64 half-precision) swizzled rows.
fn pad64(d: u32) -> u32 {
    d.div_ceil(64) * 64
}

/// Shared memory of the forward kernel: the Q tile plus `stages` K and V tiles of the storage
/// type, rows padded to 64 elements for the 128-byte swizzle. The sm90 kernel asks for 1024
/// more bytes to align its buffers to the 1024-byte swizzle atoms that wgmma descriptors address.
pub fn smem_bytes(spec: &VariantSpec, cfg: &TileConfig) -> u32 {
    let (mut dqk, dv) = (pad64(spec.head_dim_qk), pad64(spec.head_dim_v));
    // fp8 Q and K rows are whole 128-byte planes (at head dim 64 the TMA box's columns past 64
    // are zero-filled and never read).
    if spec.fp8.is_some() {
        dqk = spec.head_dim_qk.div_ceil(128) * 128;
    }
    let align = match cfg.family {
        KernelFamily::Sm80 => 0,
        KernelFamily::Sm90 | KernelFamily::Sm90Ws => 1024,
    };
    // fp8 inputs: one byte per element (V transposed, `dv` rows of `block_n` keys: the same
    // bytes), V two with `v: bf16`.
    // Vᵀ's codes come in boxes of 128 keys (a swizzled row): a 192-key tile holds two. With
    // `v_layout: rows` each stage also holds the tile's V rows as loaded (128-byte rows, as K's),
    // which the kernel transposes into the Vᵀ boxes.
    let (elem, v_elem, v_keys) = match spec.fp8 {
        Some(f) if f.v_bf16 => (1, 2, cfg.block_n),
        Some(_) => (1, 1, cfg.block_n.div_ceil(128) * 128),
        None => (
            spec.dtype.size() as u32,
            spec.dtype.size() as u32,
            cfg.block_n,
        ),
    };
    let v_rows = if spec.fp8.is_some_and(|f| f.v_rows) {
        cfg.stages * cfg.block_n * spec.head_dim_v.div_ceil(128) * 128
    } else {
        0
    };
    align
        + elem * (cfg.block_m * dqk + cfg.stages * cfg.block_n * dqk)
        + v_elem * cfg.stages * v_keys * dv
        + v_rows
}
