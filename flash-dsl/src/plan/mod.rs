//! The kernel plan: the IR between a validated [`VariantSpec`] and CUDA source.
//!
//! A plan fixes everything the emitter and the runtime need and nothing they have to
//! rediscover: the kernel kind, its operands (from which the argument struct, its layout, the
//! launch checks and the packing are derived, see [`operand`]), the tile configuration and launch
//! shape, the mask split into affine atoms (whose truth over a whole tile can be decided from its
//! corners) and opaque parts (evaluated per element), and the score expression. Two specs that
//! plan identically emit identical source.
//!
//! A pass that needs several kernels is a [`Pipeline`] of plans, launched in order on one
//! stream. The forward pass is a pipeline of one ([`forward`]); `docs/kernels.md` says where a
//! new kind goes.
//!
//! Modules: [`tile`] (tile configurations, their rules and defaults), [`operand`] (operands,
//! argument layout, grid rules), [`mask`] (mask analysis into atoms), [`classify`](mod@classify) (the host
//! mirror of the kernels' tile classification), [`forward`] (the forward kind).

pub mod backward;
pub mod block_map;
pub mod classify;
pub mod forward;
pub mod mask;
pub mod operand;
pub mod quantize;
pub mod splitkv;
pub mod tile;
pub mod varlen;

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::spec::VariantSpec;

pub use backward::{
    backward_pipeline, default_backward_config, default_backward_config_for, grad_params,
};
pub use block_map::{host_block_map, needs_block_map, plan_block_map, BlockMapPlan};
pub use classify::{classify, hull, key_tile_classes, TileClass, TileEnv};
pub use mask::{analyse_mask, range_lookup, AffineAtom, CmpOp, MaskPlan, MaskTree, RangeAtom};
pub use operand::{
    arg_layout, arg_layout_with, ArgField, ArgLayout, ArgSlot, Extent, GridRule, LaunchShape,
    Layout, Operand, OperandType, Role, TMA_DESC_BYTES,
};
pub use tile::{
    config_is_valid, default_config, default_config_for, default_config_for_launch, smem_bytes,
    KernelFamily, PlanError, TileConfig, MAX_SMEM_BYTES,
};

/// What a kernel computes. Each kind has a template folder (`templates/<kind>/`) with one
/// skeleton per [`KernelFamily`], and a planning function that lists its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum KernelKind {
    /// O = softmax(score(scale·Q·Kᵀ) masked)·V and the log-sum-exp, per query tile.
    #[default]
    Forward,
    /// `delta = rowsum(dO ∘ O)`; zeroes the fp32 dQ accumulator.
    BackwardPre,
    /// dK, dV (and dQ into the fp32 accumulator, and the score params' gradients) per key tile.
    BackwardMain,
    /// The fp32 dQ accumulator into dQ.
    DqConvert,
    /// The forward's block map of a data-dependent mask: per query tile, its key tiles.
    BlockMap,
    /// The backward's block map: per key tile, its query tiles.
    BlockMapKeys,
    /// Inference: the query heads of a KV group packed into one tile, the keys cut into splits
    /// (see [`splitkv`]); the last split of a row tile to finish merges the others.
    SplitKv,
    /// [`KernelKind::SplitKv`] over a paged KV cache: K and V as `[pages, page_size, heads_kv,
    /// d]`, addressed through a page table, with a cached length per sequence.
    SplitKvPaged,
    /// [`KernelKind::Forward`] over a packed batch of sequences of different lengths (see
    /// [`varlen`]): the same skeletons, each sequence found through cumulative offsets.
    ForwardVarlen,
    /// [`KernelKind::SplitKvPaged`] with packed queries (chunked prefill): Q, O and the LSE
    /// packed as in [`KernelKind::ForwardVarlen`], K and V in a paged cache.
    SplitKvPagedVarlen,
    /// FP8 block quantisation of a bf16/f16 tensor (see [`quantize`]).
    Quantize,
}

impl KernelKind {
    /// The template folder and the long name.
    pub fn name(self) -> &'static str {
        match self {
            KernelKind::Forward | KernelKind::ForwardVarlen => "forward",
            KernelKind::Quantize => "quantize",
            KernelKind::BackwardPre => "backward_pre",
            KernelKind::BackwardMain => "backward",
            KernelKind::DqConvert => "dq_convert",
            KernelKind::BlockMap | KernelKind::BlockMapKeys => "block_map",
            KernelKind::SplitKv | KernelKind::SplitKvPaged | KernelKind::SplitKvPagedVarlen => {
                "splitkv"
            }
        }
    }
    /// The short tag in kernel entry-point names.
    pub fn tag(self) -> &'static str {
        match self {
            KernelKind::Forward => "fwd",
            KernelKind::BackwardPre => "bwdpre",
            KernelKind::BackwardMain => "bwd",
            KernelKind::DqConvert => "bwddq",
            KernelKind::BlockMap => "bmap",
            KernelKind::BlockMapKeys => "bmapk",
            KernelKind::SplitKv => "skv",
            KernelKind::SplitKvPaged => "skvp",
            KernelKind::ForwardVarlen => "fwdv",
            KernelKind::SplitKvPagedVarlen => "skvpv",
            KernelKind::Quantize => "quant",
        }
    }
}

/// Everything the emitter needs for one kernel, and the runtime for one launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelPlan {
    /// What the kernel computes; picks the template folder.
    pub kind: KernelKind,
    /// The variant, copied in so a plan alone determines the emitted source.
    pub spec: VariantSpec,
    /// Tile shape and kernel family.
    pub config: TileConfig,
    /// The tensors the kernel reads and writes, in argument-struct order.
    pub operands: Vec<Operand>,
    /// Byte layout of the argument struct, derived from the operands and the spec's params.
    pub args: ArgLayout,
    /// Grid rule, threads per block and dynamic shared memory.
    pub launch: LaunchShape,
    /// `None` for a dense variant.
    pub mask: Option<MaskPlan>,
    /// The kernel's entry-point name; spells out the configuration.
    pub kernel_name: String,
    /// Backward kernels: dQ is accumulated in a fixed order (key tile by key tile, through a
    /// semaphore per query tile), so it is bit-identical across runs; slower.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deterministic: bool,
    /// The block map this kernel reads (attention kernels of a data-dependent mask) or writes
    /// (the build kernels); see [`block_map`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_map: Option<BlockMapPlan>,
    /// The quantisation kernel's configuration (its kind only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quant: Option<quantize::QuantSpec>,
}

impl KernelPlan {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.launch.threads
    }

    /// Dynamic shared memory the kernel asks for, in bytes.
    pub fn smem_bytes(&self) -> u32 {
        self.launch.smem_bytes
    }

    /// Number of query tiles (thread blocks per batch·head) for `seq_q` queries.
    pub fn query_tiles(&self, seq_q: usize) -> usize {
        seq_q.div_ceil(self.config.block_m as usize)
    }

    /// Number of key tiles for `seq_k` keys.
    pub fn key_tiles(&self, seq_k: usize) -> usize {
        seq_k.div_ceil(self.config.block_n as usize)
    }

    /// The operand called `name`, with its index.
    pub fn operand(&self, name: &str) -> Option<(usize, &Operand)> {
        self.operands
            .iter()
            .enumerate()
            .find(|(_, o)| o.name == name)
    }
}

/// The kernels of one pass, launched in order on one stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Pipeline {
    /// The plans in launch order; each kernel may read what the earlier ones wrote.
    pub kernels: Vec<KernelPlan>,
}

/// `flash_<kind>_<name>_<dtype>_d<dqk>x<dv>_m<bm>n<bn>w<w>s<st>[_<family>]`, restricted to
/// `[a-z0-9_]`.
pub fn kernel_name(kind: KernelKind, spec: &VariantSpec, cfg: &TileConfig) -> String {
    // A backward kernel planned without some parameters' gradients (`ParamDecl::frozen`) names
    // them: `_frozen_<param>` each.
    let frozen: String = match kind {
        KernelKind::BackwardPre | KernelKind::BackwardMain | KernelKind::DqConvert => spec
            .params
            .iter()
            .filter(|p| p.frozen)
            .map(|p| format!("_frozen_{}", p.name.to_lowercase()))
            .collect(),
        _ => String::new(),
    };
    let raw = format!(
        "flash_{}_{}_{}_d{}x{}_m{}n{}w{}s{}{}{frozen}",
        kind.tag(),
        spec.name.to_lowercase(),
        spec.fp8.map_or(spec.dtype.name().to_string(), |f| f.tag()),
        spec.head_dim_qk,
        spec.head_dim_v,
        cfg.block_m,
        cfg.block_n,
        cfg.warps,
        cfg.stages,
        // The sm80 family, the portable one, carries no suffix.
        match cfg.family {
            KernelFamily::Sm80 => String::new(),
            f => format!("_{}", f.tag()),
        }
    );
    raw.chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Plans the forward kernel of `spec` with `config` (or the sm80 default for its head dim).
///
/// ```
/// use flash_dsl::plan::{default_config_for, plan, KernelFamily};
///
/// let spec = flash_dsl::parse::parse_str("Causal { head_dim: 128, dtype: bf16, mask: causal }")
///     .unwrap()
///     .remove(0);
///
/// // The sm80 default: 128 query rows, 32 keys per step, 4 warps, double-buffered.
/// let p = plan(&spec, None).unwrap();
/// assert_eq!(p.kernel_name, "flash_fwd_causal_bf16_d128x128_m128n32w4s2");
/// assert_eq!(p.threads(), 128);
/// // Q tile plus two K and V tiles, bf16: 2·(128·128 + 2·32·(128 + 128)) bytes.
/// assert_eq!(p.smem_bytes(), 65536);
/// assert_eq!(p.query_tiles(1000), 8);
///
/// // The warp-specialised sm_90a family, with its own default tile.
/// let cfg = default_config_for(&spec, KernelFamily::Sm90Ws);
/// let p = plan(&spec, Some(cfg)).unwrap();
/// assert!(p.kernel_name.ends_with("_sm90ws"));
/// assert!(p.operand("q").unwrap().1.tma_rows.is_some());
/// ```
pub fn plan(spec: &VariantSpec, config: Option<TileConfig>) -> Result<KernelPlan, PlanError> {
    forward::plan_forward(spec, config.unwrap_or_else(|| default_config(spec)))
}

/// The forward pass as a pipeline (one kernel today).
pub fn forward_pipeline(spec: &VariantSpec, config: TileConfig) -> Result<Pipeline, PlanError> {
    Ok(Pipeline {
        kernels: vec![forward::plan_forward(spec, config)?],
    })
}
