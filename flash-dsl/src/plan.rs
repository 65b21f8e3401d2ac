//! The kernel plan: the IR between a validated [`VariantSpec`] and CUDA source.
//!
//! A plan fixes everything the emitter needs and nothing it has to rediscover: the tile
//! configuration, the mask split into affine atoms (whose truth over a whole tile can be decided
//! from its corners) and opaque parts (evaluated per element), the score expression, and the byte
//! layout of the kernel's argument struct. Two specs that plan identically emit identical source.

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
}

/// Comparison of an affine atom against zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

/// `cq·q + ck·k + offset  OP  0`, where `offset` is an integer expression that is constant over
/// a tile (literals, `seq_q`, `seq_k`, `b`, `h`, integer scalar params). Because the left side is
/// affine in `(q, k)`, its extremes over a rectangular tile are at the corners, so the atom's
/// truth over the whole tile (always, never, or mixed) costs four evaluations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AffineAtom {
    pub cq: i64,
    pub ck: i64,
    pub offset: Expr,
    pub op: CmpOp,
}

/// Boolean structure of a mask over its atoms, for three-valued tile classification.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MaskTree {
    Const(bool),
    /// Index into [`MaskPlan::atoms`].
    Atom(usize),
    /// A sub-expression that is not affine in `(q, k)` (data-dependent, non-linear): unknown
    /// over a tile, decided per element.
    Opaque,
    And(Vec<MaskTree>),
    Or(Vec<MaskTree>),
    Not(Box<MaskTree>),
}

/// What the tile classification can say about one (query tile, key tile) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TileClass {
    /// Every element masked: the tile is never loaded.
    Empty,
    /// Some elements may be masked: the mask is evaluated per element.
    Partial,
    /// No element masked: no mask code runs.
    Full,
}

/// The mask of a variant, prepared for the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MaskPlan {
    /// The whole mask, evaluated per element in partial tiles.
    pub expr: Expr,
    pub atoms: Vec<AffineAtom>,
    pub tree: MaskTree,
}

/// One user parameter's place in the kernel argument struct.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ParamSlot {
    /// Index into `VariantSpec::params`.
    pub param: usize,
    /// Byte offset from the start of the whole argument struct.
    pub offset: u32,
    /// 8 for a tensor (device pointer), 4 for a scalar.
    pub size: u32,
}

/// Byte layout of the kernel's single `__grid_constant__` argument: the fixed
/// [`KernelArgsHeader`](crate::args::KernelArgsHeader) followed by the user params.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ParamLayout {
    pub slots: Vec<ParamSlot>,
    /// `sizeof` of the whole argument struct (asserted in the generated CUDA).
    pub total_size: u32,
}

/// Everything the emitter needs for one kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelPlan {
    pub spec: VariantSpec,
    pub config: TileConfig,
    /// `None` for a dense variant.
    pub mask: Option<MaskPlan>,
    /// Dynamic shared memory the kernel asks for, in bytes.
    pub smem_bytes: u32,
    pub params: ParamLayout,
    /// The kernel's entry-point name; spells out the configuration.
    pub kernel_name: String,
}

/// Plans `spec` with `config` (or the default configuration for its head dim).
pub fn plan(_spec: &VariantSpec, _config: Option<TileConfig>) -> Result<KernelPlan, String> {
    todo!("plan")
}
