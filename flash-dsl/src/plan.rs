//! The kernel plan: the IR between a validated [`VariantSpec`] and CUDA source.
//!
//! A plan fixes everything the emitter needs and nothing it has to rediscover: the tile
//! configuration, the mask split into affine atoms (whose truth over a whole tile can be decided
//! from its corners) and opaque parts (evaluated per element), the score expression, and the byte
//! layout of the kernel's argument struct. Two specs that plan identically emit identical source.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::eval::{ParamValue, ParamValues};
use crate::spec::{BinOp, Dim, Expr, ParamDecl, ParamKind, ScalarTy, Ty, UnOp, Var, VariantSpec};

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
    /// Index into [`MaskPlan::ranges`]: decided per tile from interval bounds when it can be.
    Range(usize),
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
    /// Data-dependent comparisons decided per tile by interval bounds (see [`RangeAtom`]).
    #[serde(default)]
    pub ranges: Vec<RangeAtom>,
}

/// An integer comparison `lhs OP rhs` that is not affine in `(q, k)` because it reads tensors,
/// such as a document mask `doc[q] == doc[k]`. Over a tile both sides are bounded by interval
/// arithmetic, each lookup `T[q]` (or `T[b, k]`, …) by the minimum and maximum of `T` over the
/// tile's positions, which the kernel reduces across a warp. With sorted document ids most tiles
/// are decided: disjoint documents give an empty tile (never loaded), a single shared document
/// a full one (no mask code). Lookups qualify when the position index is `q` or `k` on the last
/// (`seq`) dimension and any leading dimension is indexed by `b`, `h` or a literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RangeAtom {
    pub lhs: Expr,
    pub rhs: Expr,
    pub op: CmpOp,
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
    /// Byte offset of the three 128-byte TMA descriptors (Q, K, V) that the runtime encodes
    /// per launch, for kernel families that load with TMA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tma_offset: Option<u32>,
}

/// Size of one TMA descriptor (`CUtensorMap`), which must be 128-byte aligned.
pub const TMA_DESC_BYTES: u32 = 128;

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

impl KernelPlan {
    /// Threads per block: one warp is 32 threads.
    pub fn threads(&self) -> u32 {
        self.config.warps * 32
    }

    /// Number of query tiles (thread blocks per batch·head) for `seq_q` queries.
    pub fn query_tiles(&self, seq_q: usize) -> usize {
        seq_q.div_ceil(self.config.block_m as usize)
    }

    /// Number of key tiles for `seq_k` keys.
    pub fn key_tiles(&self, seq_k: usize) -> usize {
        seq_k.div_ceil(self.config.block_n as usize)
    }
}

/// Why a spec cannot be planned with a configuration. Messages are lower case and name the
/// offending value and the limit it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("warps must be 4 or 8; got {0}")]
    Warps(u32),
    #[error(
        "each warp must own 16 or 32 query rows (block_m / warps); got block_m {block_m} / warps {warps}"
    )]
    RowsPerWarp { block_m: u32, warps: u32 },
    #[error("block_n must be 32, 64 or 128; got {0}")]
    BlockN(u32),
    #[error("stages must be 1, 2 or 3; got {0}")]
    Stages(u32),
    #[error("{which} must be a positive multiple of 8 and at most 256; got {value}")]
    HeadDim { which: &'static str, value: u32 },
    #[error("the tiles need {bytes} bytes of shared memory; the limit is {limit}")]
    SharedMemory { bytes: u32, limit: u32 },
    #[error(
        "the sm90 kernel gives each warpgroup 64 query rows: block_m must be 64, 128 or 192 with warps = block_m / 16; got block_m {block_m}, warps {warps}"
    )]
    Warpgroups { block_m: u32, warps: u32 },
    #[error(
        "the sm90 kernel takes block_n 64 or 128 and stages 1 or 2; got block_n {block_n}, stages {stages}"
    )]
    Sm90Tile { block_n: u32, stages: u32 },
}

/// Dynamic shared memory one block may opt into on sm_90 (227 KiB).
pub const MAX_SMEM_BYTES: u32 = 227 * 1024;

/// The default tile configuration for a spec and kernel family, by its larger head dim.
///
/// sm90ws (the default on sm_90a, measured on an H200): two consumer warpgroups of 64 rows and
/// the TMA producer; 128 keys per step at head dim 128, 64 at head dim 64.
///
/// sm90 (measured on an H200 against the other sm90 tiles, see `bench/results/`): 128 query rows
/// in two warpgroups; at head dim 128, 128 keys per step, double-buffered (fewer steps; the
/// wgmma n extent amortises the softmax); at head dim 64, 64 keys single-buffered, which ran
/// 8-20% faster than 128 keys or two stages there (two blocks fit on an SM).
pub fn default_config_for(spec: &VariantSpec, family: KernelFamily) -> TileConfig {
    match family {
        KernelFamily::Sm80 => default_config(spec),
        KernelFamily::Sm90Ws => {
            let d = spec.head_dim_qk.max(spec.head_dim_v);
            if d > 128 {
                // Above head dim 128 the output accumulator leaves the consumers too few of
                // their 224 registers: the plain sm90 kernel takes over.
                return default_config_for(spec, KernelFamily::Sm90);
            }
            TileConfig {
                block_m: 128,
                block_n: if d <= 64 { 64 } else { 128 },
                warps: 12,
                stages: 2,
                family,
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

/// The default sm80 (`mma.sync`) tile configuration for a spec, by its larger head dim.
pub fn default_config(spec: &VariantSpec) -> TileConfig {
    let d = spec.head_dim_qk.max(spec.head_dim_v);
    // Chosen so that no example spills (`flash compile --arch sm_80,sm_90`, see README): a warp
    // owning 32 rows holds 32·d/32 output and 32·block_n/32 score accumulators per thread, so
    // block_n shrinks to 32 above head dim 64; a score hook that reads a tensor keeps one
    // lookup per score element in flight, which only fits with 16 rows per warp; at 256 the
    // output accumulator alone needs the 16-row warps and the prefetch stage goes.
    let reads_tensor = spec.score.as_ref().is_some_and(|e| {
        let mut found = false;
        e.visit(&mut |x| found |= matches!(x, Expr::Index(..)));
        found
    });
    let (block_m, block_n, warps, stages) = match d {
        _ if d <= 128 && reads_tensor => (64, 64, 4, 2),
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
    for (which, value) in [
        ("head_dim_qk", spec.head_dim_qk),
        ("head_dim_v", spec.head_dim_v),
    ] {
        if value == 0 || value % 8 != 0 || value > 256 {
            return Err(PlanError::HeadDim { which, value });
        }
    }
    if cfg.family == KernelFamily::Sm90Ws {
        if !matches!(cfg.block_m, 64 | 128) || cfg.warps != cfg.block_m / 16 + 4 {
            return Err(PlanError::Warpgroups {
                block_m: cfg.block_m,
                warps: cfg.warps,
            });
        }
        if !matches!(cfg.block_n, 64 | 128) || cfg.stages != 2 {
            return Err(PlanError::Sm90Tile {
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
    if !matches!(cfg.stages, 1..=3) {
        return Err(PlanError::Stages(cfg.stages));
    }
    check_smem(spec, cfg)
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

/// Shared memory of the forward kernel: the Q tile plus `stages` K and V tiles, 2 bytes per
/// element, rows padded to 64 elements for the 128-byte swizzle. The sm90 kernel asks for 1024
/// more bytes to align its buffers to the 1024-byte swizzle atoms that wgmma descriptors address.
pub fn smem_bytes(spec: &VariantSpec, cfg: &TileConfig) -> u32 {
    let (dqk, dv) = (pad64(spec.head_dim_qk), pad64(spec.head_dim_v));
    let align = match cfg.family {
        KernelFamily::Sm80 => 0,
        KernelFamily::Sm90 | KernelFamily::Sm90Ws => 1024,
    };
    align + 2 * (cfg.block_m * dqk + cfg.stages * cfg.block_n * (dqk + dv))
}

/// Byte layout of the argument struct: the fixed header, then each param in declaration order
/// (tensors as 8-byte pointers aligned to 8, scalars as 4 bytes aligned to 4), the total rounded
/// up to 8 (the struct's alignment).
pub fn param_layout(spec: &VariantSpec) -> ParamLayout {
    let mut offset = crate::args::HEADER_SIZE;
    let mut slots = Vec::with_capacity(spec.params.len());
    for (param, decl) in spec.params.iter().enumerate() {
        let size = match decl.kind {
            ParamKind::Tensor { .. } => 8,
            ParamKind::Scalar(_) => 4,
        };
        offset = offset.next_multiple_of(size);
        slots.push(ParamSlot {
            param,
            offset,
            size,
        });
        offset += size;
    }
    ParamLayout {
        slots,
        total_size: offset.next_multiple_of(8),
        tma_offset: None,
    }
}

/// The layout of [`param_layout`] followed by the three TMA descriptors of a TMA family.
fn param_layout_for(spec: &VariantSpec, family: KernelFamily) -> ParamLayout {
    let mut l = param_layout(spec);
    if family == KernelFamily::Sm90Ws {
        let at = l.total_size.next_multiple_of(TMA_DESC_BYTES);
        l.tma_offset = Some(at);
        l.total_size = at + 3 * TMA_DESC_BYTES;
    }
    l
}

/// `flash_fwd_<name>_<dtype>_d<dqk>x<dv>_m<bm>n<bn>w<w>s<st>`, restricted to `[a-z0-9_]`.
pub fn kernel_name(spec: &VariantSpec, cfg: &TileConfig) -> String {
    let raw = format!(
        "flash_fwd_{}_{}_d{}x{}_m{}n{}w{}s{}{}",
        spec.name.to_lowercase(),
        spec.dtype.name(),
        spec.head_dim_qk,
        spec.head_dim_v,
        cfg.block_m,
        cfg.block_n,
        cfg.warps,
        cfg.stages,
        match cfg.family {
            KernelFamily::Sm80 => "",
            KernelFamily::Sm90 => "_sm90",
            KernelFamily::Sm90Ws => "_sm90ws",
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

/// Plans `spec` with `config` (or the default configuration for its head dim).
pub fn plan(spec: &VariantSpec, config: Option<TileConfig>) -> Result<KernelPlan, PlanError> {
    let config = config.unwrap_or_else(|| default_config(spec));
    config_is_valid(spec, &config)?;
    Ok(KernelPlan {
        spec: spec.clone(),
        config,
        mask: spec.mask.as_ref().map(|m| analyse_mask(spec, m)),
        smem_bytes: smem_bytes(spec, &config),
        params: param_layout_for(spec, config.family),
        kernel_name: kernel_name(spec, &config),
    })
}

// ---------------------------------------------------------------------------------------------
// Mask analysis
// ---------------------------------------------------------------------------------------------

/// A factor of a tile-constant monomial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Base {
    SeqQ,
    SeqK,
    B,
    H,
    /// An integer scalar parameter.
    Param(usize),
}

impl Base {
    fn expr(self) -> Expr {
        match self {
            Base::SeqQ => Expr::Var(Var::SeqQ),
            Base::SeqK => Expr::Var(Var::SeqK),
            Base::B => Expr::Var(Var::B),
            Base::H => Expr::Var(Var::H),
            Base::Param(i) => Expr::Scalar(i),
        }
    }
}

/// A polynomial in tile constants with integer coefficients: sorted monomial → coefficient,
/// zero coefficients removed, the empty monomial being the constant term. Its canonical form
/// makes equal offsets compare equal, so atoms deduplicate.
type Poly = BTreeMap<Vec<Base>, i64>;

/// `cq·q + ck·k + off`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Linear {
    cq: i64,
    ck: i64,
    off: Poly,
}

impl Linear {
    fn constant(c: i64) -> Self {
        let mut off = Poly::new();
        if c != 0 {
            off.insert(Vec::new(), c);
        }
        Linear { cq: 0, ck: 0, off }
    }
    fn base(b: Base) -> Self {
        Linear {
            cq: 0,
            ck: 0,
            off: Poly::from([(vec![b], 1)]),
        }
    }
    fn is_tile_constant(&self) -> bool {
        self.cq == 0 && self.ck == 0
    }
    /// The value if this is a plain integer.
    fn as_literal(&self) -> Option<i64> {
        if !self.is_tile_constant() {
            return None;
        }
        match self.off.len() {
            0 => Some(0),
            1 => self.off.get(&Vec::new()).copied(),
            _ => None,
        }
    }
    fn scale(&self, c: i64) -> Option<Self> {
        let mut off = Poly::new();
        for (m, v) in &self.off {
            let v = v.checked_mul(c)?;
            if v != 0 {
                off.insert(m.clone(), v);
            }
        }
        Some(Linear {
            cq: self.cq.checked_mul(c)?,
            ck: self.ck.checked_mul(c)?,
            off,
        })
    }
    fn add(&self, other: &Self) -> Option<Self> {
        let mut off = self.off.clone();
        for (m, v) in &other.off {
            let e = off.entry(m.clone()).or_insert(0);
            *e = e.checked_add(*v)?;
            if *e == 0 {
                off.remove(m);
            }
        }
        Some(Linear {
            cq: self.cq.checked_add(other.cq)?,
            ck: self.ck.checked_add(other.ck)?,
            off,
        })
    }
    /// Product of two tile-constant polynomials.
    fn mul_constants(&self, other: &Self) -> Option<Self> {
        let mut off = Poly::new();
        for (ma, va) in &self.off {
            for (mb, vb) in &other.off {
                let mut m: Vec<Base> = ma.iter().chain(mb).copied().collect();
                m.sort();
                let e = off.entry(m.clone()).or_insert(0);
                *e = e.checked_add(va.checked_mul(*vb)?)?;
                if *e == 0 {
                    off.remove(&m);
                }
            }
        }
        Some(Linear { cq: 0, ck: 0, off })
    }
    /// The first nonzero of `(cq, ck, offset coefficients…)`, for sign normalisation.
    fn leading_sign(&self) -> i64 {
        let non_constant = self.off.iter().filter(|(m, _)| !m.is_empty());
        let constant = self.off.get(&Vec::new());
        [self.cq, self.ck]
            .into_iter()
            .chain(non_constant.map(|(_, v)| *v))
            .chain(constant.copied())
            .find(|v| *v != 0)
            .map_or(0, i64::signum)
    }
    /// The offset as an expression: non-constant monomials in canonical order, then the
    /// constant term, the first positive term moved to the front (`1 - prefix`, not
    /// `-prefix + 1`), negative coefficients spelled as subtraction.
    fn offset_expr(&self) -> Expr {
        let mut ordered: Vec<(&Vec<Base>, &i64)> = self
            .off
            .iter()
            .filter(|(m, _)| !m.is_empty())
            .chain(self.off.get_key_value(&Vec::new()))
            .collect();
        if let Some(first_positive) = ordered.iter().position(|(_, c)| **c > 0) {
            let t = ordered.remove(first_positive);
            ordered.insert(0, t);
        }
        let mut terms = ordered.into_iter();
        let term = |m: &[Base], c: i64| -> Expr {
            let product = m
                .iter()
                .map(|b| b.expr())
                .reduce(|a, b| Expr::bin(BinOp::Mul, a, b));
            match (product, c.unsigned_abs()) {
                (None, c) => Expr::Int(c as i64),
                (Some(p), 1) => p,
                (Some(p), c) => Expr::bin(BinOp::Mul, Expr::Int(c as i64), p),
            }
        };
        let Some((m0, &c0)) = terms.next() else {
            return Expr::Int(0);
        };
        let mut e = if m0.is_empty() {
            Expr::Int(c0)
        } else if c0 < 0 {
            Expr::Unary(UnOp::Neg, Box::new(term(m0, c0)))
        } else {
            term(m0, c0)
        };
        for (m, &c) in terms {
            let op = if c < 0 { BinOp::Sub } else { BinOp::Add };
            e = Expr::bin(op, e, term(m, c));
        }
        e
    }
}

/// `e` as an affine form in `(q, k)` with integer coefficients and a tile-constant offset, or
/// `None` when it is not one (tensor lookups, products of positions, remainders, floats…).
fn linearize(spec: &VariantSpec, e: &Expr) -> Option<Linear> {
    match e {
        Expr::Int(i) => Some(Linear::constant(*i)),
        Expr::Var(v) => match v {
            Var::Q => Some(Linear {
                cq: 1,
                ck: 0,
                off: Poly::new(),
            }),
            Var::K => Some(Linear {
                cq: 0,
                ck: 1,
                off: Poly::new(),
            }),
            Var::SeqQ => Some(Linear::base(Base::SeqQ)),
            Var::SeqK => Some(Linear::base(Base::SeqK)),
            Var::B => Some(Linear::base(Base::B)),
            Var::H => Some(Linear::base(Base::H)),
            Var::S => None,
        },
        Expr::Scalar(i) => match spec.params.get(*i)?.kind {
            ParamKind::Scalar(ScalarTy::I32) => Some(Linear::base(Base::Param(*i))),
            _ => None,
        },
        Expr::Unary(UnOp::Neg, a) => linearize(spec, a)?.scale(-1),
        Expr::Binary(BinOp::Add, a, b) => linearize(spec, a)?.add(&linearize(spec, b)?),
        Expr::Binary(BinOp::Sub, a, b) => linearize(spec, a)?.add(&linearize(spec, b)?.scale(-1)?),
        Expr::Binary(BinOp::Mul, a, b) => {
            let (a, b) = (linearize(spec, a)?, linearize(spec, b)?);
            if let Some(c) = a.as_literal() {
                b.scale(c)
            } else if let Some(c) = b.as_literal() {
                a.scale(c)
            } else if a.is_tile_constant() && b.is_tile_constant() {
                a.mul_constants(&b)
            } else {
                None
            }
        }
        _ => None,
    }
}

fn cmp_op(op: BinOp) -> Option<CmpOp> {
    Some(match op {
        BinOp::Lt => CmpOp::Lt,
        BinOp::Le => CmpOp::Le,
        BinOp::Gt => CmpOp::Gt,
        BinOp::Ge => CmpOp::Ge,
        BinOp::Eq => CmpOp::Eq,
        BinOp::Ne => CmpOp::Ne,
        _ => return None,
    })
}

impl CmpOp {
    /// Whether `v OP 0`.
    pub fn holds(self, v: i128) -> bool {
        match self {
            CmpOp::Lt => v < 0,
            CmpOp::Le => v <= 0,
            CmpOp::Gt => v > 0,
            CmpOp::Ge => v >= 0,
            CmpOp::Eq => v == 0,
            CmpOp::Ne => v != 0,
        }
    }
}

/// An integer comparison `lhs - rhs OP 0` in canonical form: `>`/`>=` become `<`/`<=` by
/// negation, `x < 0` becomes `x + 1 <= 0`, and `==`/`!=` get a positive leading coefficient. The
/// result is a constant when the difference is a plain integer.
fn comparison(op: CmpOp, diff: Linear, atoms: &mut Vec<AffineAtom>) -> MaskTree {
    if let Some(c) = diff.as_literal() {
        return MaskTree::Const(op.holds(c as i128));
    }
    let canon = match op {
        CmpOp::Le => Some((diff, CmpOp::Le)),
        CmpOp::Lt => diff.add(&Linear::constant(1)).map(|d| (d, CmpOp::Le)),
        CmpOp::Ge => diff.scale(-1).map(|d| (d, CmpOp::Le)),
        CmpOp::Gt => diff
            .scale(-1)
            .and_then(|d| d.add(&Linear::constant(1)))
            .map(|d| (d, CmpOp::Le)),
        CmpOp::Eq | CmpOp::Ne => {
            if diff.leading_sign() < 0 {
                diff.scale(-1).map(|d| (d, op))
            } else {
                Some((diff, op))
            }
        }
    };
    let Some((diff, op)) = canon else {
        return MaskTree::Opaque;
    };
    let atom = AffineAtom {
        cq: diff.cq,
        ck: diff.ck,
        offset: diff.offset_expr(),
        op,
    };
    let index = match atoms.iter().position(|a| *a == atom) {
        Some(i) => i,
        None => {
            atoms.push(atom);
            atoms.len() - 1
        }
    };
    MaskTree::Atom(index)
}

fn mask_tree(
    spec: &VariantSpec,
    e: &Expr,
    atoms: &mut Vec<AffineAtom>,
    ranges: &mut Vec<RangeAtom>,
) -> MaskTree {
    match e {
        Expr::Bool(b) => MaskTree::Const(*b),
        Expr::Unary(UnOp::Not, a) => match mask_tree(spec, a, atoms, ranges) {
            MaskTree::Const(b) => MaskTree::Const(!b),
            MaskTree::Not(inner) => *inner,
            t => MaskTree::Not(Box::new(t)),
        },
        Expr::Binary(op @ (BinOp::And | BinOp::Or), a, b) => {
            let is_and = *op == BinOp::And;
            let mut children = Vec::new();
            for side in [a, b] {
                match mask_tree(spec, side, atoms, ranges) {
                    MaskTree::And(xs) if is_and => children.extend(xs),
                    MaskTree::Or(xs) if !is_and => children.extend(xs),
                    // `true && x` is x; `false || x` is x.
                    MaskTree::Const(c) if c == is_and => {}
                    // `false && x` is false; `true || x` is true.
                    MaskTree::Const(c) => return MaskTree::Const(c),
                    t => {
                        if !children.contains(&t) || t == MaskTree::Opaque {
                            children.push(t)
                        }
                    }
                }
            }
            match children.len() {
                0 => MaskTree::Const(is_and),
                1 => children.pop().expect("one child"),
                _ if is_and => MaskTree::And(children),
                _ => MaskTree::Or(children),
            }
        }
        Expr::Binary(op, a, b)
            if cmp_op(*op).is_some()
                && a.ty(&spec.params) == Ty::Int
                && b.ty(&spec.params) == Ty::Int =>
        {
            let diff = linearize(spec, a)
                .zip(linearize(spec, b))
                .and_then(|(a, b)| a.add(&b.scale(-1)?));
            match diff {
                Some(d) => comparison(cmp_op(*op).expect("comparison"), d, atoms),
                None => range_atom(spec, cmp_op(*op).expect("comparison"), a, b, ranges),
            }
        }
        _ => MaskTree::Opaque,
    }
}

/// A [`RangeAtom`] for an integer comparison that reads tensors and whose sides interval
/// arithmetic can bound; otherwise an opaque node.
fn range_atom(
    spec: &VariantSpec,
    op: CmpOp,
    a: &Expr,
    b: &Expr,
    ranges: &mut Vec<RangeAtom>,
) -> MaskTree {
    let mut reads_tensor = false;
    for side in [a, b] {
        side.visit(&mut |e| reads_tensor |= matches!(e, Expr::Index(..)));
    }
    if !reads_tensor || !bounded(spec, a) || !bounded(spec, b) {
        return MaskTree::Opaque;
    }
    let atom = RangeAtom {
        lhs: a.clone(),
        rhs: b.clone(),
        op,
    };
    let index = ranges.iter().position(|r| *r == atom).unwrap_or_else(|| {
        ranges.push(atom);
        ranges.len() - 1
    });
    MaskTree::Range(index)
}

/// Whether interval arithmetic bounds the integer expression `e` over a tile.
fn bounded(spec: &VariantSpec, e: &Expr) -> bool {
    match e {
        Expr::Int(_) | Expr::Var(_) | Expr::Scalar(_) => true,
        Expr::Unary(UnOp::Neg, a) => bounded(spec, a),
        Expr::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul, a, b) => {
            bounded(spec, a) && bounded(spec, b)
        }
        Expr::Index(i, idx) => range_lookup(&spec.params, *i, idx).is_some(),
        _ => false,
    }
}

/// How a lookup qualifies for range bounds: the position variable (`q` or `k`) indexing the
/// last, `seq`, dimension, and the index of the leading dimension if there is one.
pub fn range_lookup<'e>(
    params: &[ParamDecl],
    param: usize,
    idx: &'e [Expr],
) -> Option<(Var, Option<&'e Expr>)> {
    let ParamKind::Tensor {
        elem: ScalarTy::I32,
        dims,
    } = &params[param].kind
    else {
        return None;
    };
    let pos = match idx.last()? {
        Expr::Var(v @ (Var::Q | Var::K)) => *v,
        _ => return None,
    };
    match (dims.as_slice(), idx) {
        ([Dim::Seq], [_]) => Some((pos, None)),
        ([Dim::Batch, Dim::Seq], [lead @ Expr::Var(Var::B), _])
        | ([Dim::Heads, Dim::Seq], [lead @ Expr::Var(Var::H), _])
        | ([Dim::Fixed(_), Dim::Seq], [lead @ Expr::Int(_), _]) => Some((pos, Some(lead))),
        _ => None,
    }
}

/// Splits a mask into affine atoms and opaque parts (see [`MaskPlan`]).
pub fn analyse_mask(spec: &VariantSpec, mask: &Expr) -> MaskPlan {
    let mut atoms = Vec::new();
    let mut ranges = Vec::new();
    let tree = mask_tree(spec, mask, &mut atoms, &mut ranges);
    MaskPlan {
        expr: mask.clone(),
        atoms,
        tree,
        ranges,
    }
}

// ---------------------------------------------------------------------------------------------
// Tile classification
// ---------------------------------------------------------------------------------------------

/// The tile-constant values an atom's offset may read: sizes, the block's batch and head, and
/// integer scalar params (by param index; other params read as 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TileEnv {
    pub seq_q: i64,
    pub seq_k: i64,
    pub b: i64,
    pub h: i64,
    pub scalars: Vec<i64>,
    /// Integer tensor params by param index (empty for others), for [`RangeAtom`] bounds.
    pub int_tensors: Vec<Vec<i64>>,
}

impl TileEnv {
    /// The environment of the block `(b, h)` of a launch with `params`.
    pub fn new(b: usize, h: usize, seq_q: usize, seq_k: usize, params: &ParamValues) -> Self {
        TileEnv {
            seq_q: seq_q as i64,
            seq_k: seq_k as i64,
            b: b as i64,
            h: h as i64,
            scalars: params
                .0
                .iter()
                .map(|p| match p {
                    ParamValue::Int(v) => *v,
                    _ => 0,
                })
                .collect(),
            int_tensors: params
                .0
                .iter()
                .map(|p| match p {
                    ParamValue::IntTensor(v) => v.clone(),
                    _ => Vec::new(),
                })
                .collect(),
        }
    }

    /// Bounds `[lo, hi]` of the integer expression `e` over the tile `[q0,q1] × [k0,k1]`, as
    /// the kernel computes them (see [`RangeAtom`]).
    pub fn interval(&self, e: &Expr, q: (i64, i64), k: (i64, i64)) -> (i128, i128) {
        match e {
            Expr::Var(Var::Q) => (q.0 as i128, q.1 as i128),
            Expr::Var(Var::K) => (k.0 as i128, k.1 as i128),
            Expr::Unary(UnOp::Neg, a) => {
                let (lo, hi) = self.interval(a, q, k);
                (-hi, -lo)
            }
            Expr::Binary(op @ (BinOp::Add | BinOp::Sub | BinOp::Mul), a, b) => {
                let (a, b) = (self.interval(a, q, k), self.interval(b, q, k));
                match op {
                    BinOp::Add => (a.0 + b.0, a.1 + b.1),
                    BinOp::Sub => (a.0 - b.1, a.1 - b.0),
                    _ => {
                        let p = [a.0 * b.0, a.0 * b.1, a.1 * b.0, a.1 * b.1];
                        (*p.iter().min().unwrap(), *p.iter().max().unwrap())
                    }
                }
            }
            Expr::Index(i, idx) => {
                let t = &self.int_tensors[*i];
                let seq = self.seq_q.max(self.seq_k);
                let last = idx.last().expect("a lookup has an index");
                let (p0, p1) = if matches!(last, Expr::Var(Var::Q)) {
                    q
                } else {
                    k
                };
                let lead = match &idx[..idx.len() - 1] {
                    [] => 0,
                    [Expr::Var(Var::B)] => self.b,
                    [Expr::Var(Var::H)] => self.h,
                    [Expr::Int(c)] => *c,
                    other => panic!("not a range lookup: {other:?}"),
                };
                let n_lead = (t.len() as i64 / seq.max(1)).max(1);
                let base = (lead.clamp(0, n_lead - 1) * seq) as usize;
                let (p0, p1) = (p0.clamp(0, seq - 1) as usize, p1.clamp(0, seq - 1) as usize);
                let xs = &t[base + p0..=base + p1];
                (
                    *xs.iter().min().unwrap() as i128,
                    *xs.iter().max().unwrap() as i128,
                )
            }
            other => {
                let v = self.offset(other);
                (v, v)
            }
        }
    }

    /// Value of an atom offset (an integer expression over tile constants).
    pub fn offset(&self, e: &Expr) -> i128 {
        match e {
            Expr::Int(i) => *i as i128,
            Expr::Var(Var::SeqQ) => self.seq_q as i128,
            Expr::Var(Var::SeqK) => self.seq_k as i128,
            Expr::Var(Var::B) => self.b as i128,
            Expr::Var(Var::H) => self.h as i128,
            Expr::Scalar(i) => self.scalars[*i] as i128,
            Expr::Unary(UnOp::Neg, a) => -self.offset(a),
            Expr::Binary(BinOp::Add, a, b) => self.offset(a) + self.offset(b),
            Expr::Binary(BinOp::Sub, a, b) => self.offset(a) - self.offset(b),
            Expr::Binary(BinOp::Mul, a, b) => self.offset(a) * self.offset(b),
            other => panic!("not a tile-constant offset: {other:?}"),
        }
    }
}

/// Three-valued truth of a mask over a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Truth {
    Always,
    Never,
    Mixed,
}

impl Truth {
    fn not(self) -> Self {
        match self {
            Truth::Always => Truth::Never,
            Truth::Never => Truth::Always,
            Truth::Mixed => Truth::Mixed,
        }
    }
}

/// Truth of one atom over the box `[q0, q1] × [k0, k1]`: the affine form's extremes lie at the
/// corners, so its range over the box is `[lo, hi]`.
fn atom_truth(atom: &AffineAtom, env: &TileEnv, q0: i64, q1: i64, k0: i64, k1: i64) -> Truth {
    let off = env.offset(&atom.offset);
    let (cq, ck) = (atom.cq as i128, atom.ck as i128);
    let corners = [
        cq * q0 as i128 + ck * k0 as i128,
        cq * q0 as i128 + ck * k1 as i128,
        cq * q1 as i128 + ck * k0 as i128,
        cq * q1 as i128 + ck * k1 as i128,
    ];
    let lo = corners.iter().min().expect("four corners") + off;
    let hi = corners.iter().max().expect("four corners") + off;
    let (all, none) = match atom.op {
        CmpOp::Lt => (hi < 0, lo >= 0),
        CmpOp::Le => (hi <= 0, lo > 0),
        CmpOp::Gt => (lo > 0, hi <= 0),
        CmpOp::Ge => (lo >= 0, hi < 0),
        CmpOp::Eq => (lo == 0 && hi == 0, lo > 0 || hi < 0),
        CmpOp::Ne => (lo > 0 || hi < 0, lo == 0 && hi == 0),
    };
    match (all, none) {
        (true, _) => Truth::Always,
        (_, true) => Truth::Never,
        _ => Truth::Mixed,
    }
}

/// Truth of a range atom over a tile, from the interval bounds of its two sides.
fn range_truth(r: &RangeAtom, env: &TileEnv, b: (i64, i64, i64, i64)) -> Truth {
    let (l, h) = (
        env.interval(&r.lhs, (b.0, b.1), (b.2, b.3)),
        env.interval(&r.rhs, (b.0, b.1), (b.2, b.3)),
    );
    let (always, never) = match r.op {
        CmpOp::Lt => (l.1 < h.0, l.0 >= h.1),
        CmpOp::Le => (l.1 <= h.0, l.0 > h.1),
        CmpOp::Gt => (l.0 > h.1, l.1 <= h.0),
        CmpOp::Ge => (l.0 >= h.1, l.1 < h.0),
        CmpOp::Eq => (
            l.0 == l.1 && h.0 == h.1 && l.0 == h.0,
            l.1 < h.0 || h.1 < l.0,
        ),
        CmpOp::Ne => (
            l.1 < h.0 || h.1 < l.0,
            l.0 == l.1 && h.0 == h.1 && l.0 == h.0,
        ),
    };
    match (always, never) {
        (true, _) => Truth::Always,
        (_, true) => Truth::Never,
        _ => Truth::Mixed,
    }
}

fn tree_truth(tree: &MaskTree, mask: &MaskPlan, env: &TileEnv, b: (i64, i64, i64, i64)) -> Truth {
    let atoms = &mask.atoms;
    match tree {
        MaskTree::Const(true) => Truth::Always,
        MaskTree::Const(false) => Truth::Never,
        MaskTree::Atom(i) => atom_truth(&atoms[*i], env, b.0, b.1, b.2, b.3),
        MaskTree::Opaque => Truth::Mixed,
        MaskTree::Range(i) => range_truth(&mask.ranges[*i], env, b),
        MaskTree::Not(t) => tree_truth(t, mask, env, b).not(),
        MaskTree::And(ts) => {
            let mut acc = Truth::Always;
            for t in ts {
                match tree_truth(t, mask, env, b) {
                    Truth::Never => return Truth::Never,
                    Truth::Mixed => acc = Truth::Mixed,
                    Truth::Always => {}
                }
            }
            acc
        }
        MaskTree::Or(ts) => {
            let mut acc = Truth::Never;
            for t in ts {
                match tree_truth(t, mask, env, b) {
                    Truth::Always => return Truth::Always,
                    Truth::Mixed => acc = Truth::Mixed,
                    Truth::Never => {}
                }
            }
            acc
        }
    }
}

/// Classifies the tile of query positions `q0..=q1` and key positions `k0..=k1` (inclusive,
/// already clipped to the sequence lengths) as the kernel does at run time. Sound by
/// construction: `Full` only if every element is visible, `Empty` only if every element is
/// masked; anything undecided (opaque parts, mixed atoms) is `Partial`.
pub fn classify(
    mask: &MaskPlan,
    spec: &VariantSpec,
    env: &TileEnv,
    q0: i64,
    q1: i64,
    k0: i64,
    k1: i64,
) -> TileClass {
    debug_assert!(
        env.scalars.len() >= spec.params.len(),
        "tile env has {} param values, `{}` declares {}",
        env.scalars.len(),
        spec.name,
        spec.params.len()
    );
    debug_assert!(q0 <= q1 && k0 <= k1, "empty tile box");
    match tree_truth(&mask.tree, mask, env, (q0, q1, k0, k1)) {
        Truth::Always => TileClass::Full,
        Truth::Never => TileClass::Empty,
        Truth::Mixed => TileClass::Partial,
    }
}

/// Classes of every key tile for query tile `query_tile` of a `seq_q × seq_k` problem (tiles
/// clipped at the sequence ends). A dense plan gives all `Full`.
pub fn key_tile_classes(
    plan: &KernelPlan,
    env: &TileEnv,
    query_tile: usize,
    seq_q: usize,
    seq_k: usize,
) -> Vec<TileClass> {
    let (bm, bn) = (plan.config.block_m as usize, plan.config.block_n as usize);
    let q0 = query_tile * bm;
    assert!(
        q0 < seq_q,
        "query tile {query_tile} starts at {q0}, past seq_q {seq_q}"
    );
    let q1 = (q0 + bm).min(seq_q) - 1;
    (0..plan.key_tiles(seq_k))
        .map(|j| {
            let k0 = j * bn;
            let k1 = (k0 + bn).min(seq_k) - 1;
            match &plan.mask {
                None => TileClass::Full,
                Some(m) => classify(
                    m, &plan.spec, env, q0 as i64, q1 as i64, k0 as i64, k1 as i64,
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::DType;

    fn spec(params: Vec<ParamDecl>, mask: Option<Expr>) -> VariantSpec {
        VariantSpec {
            name: "Gemma-Local2".into(),
            doc: String::new(),
            head_dim_qk: 128,
            head_dim_v: 64,
            dtype: DType::Bf16,
            scale: None,
            params,
            mask,
            score: None,
        }
    }
    fn var(v: Var) -> Expr {
        Expr::Var(v)
    }
    fn causal() -> Expr {
        Expr::bin(
            BinOp::Le,
            var(Var::K),
            Expr::bin(
                BinOp::Add,
                var(Var::Q),
                Expr::bin(BinOp::Sub, var(Var::SeqK), var(Var::SeqQ)),
            ),
        )
    }
    fn cfg(block_m: u32, block_n: u32, warps: u32, stages: u32) -> TileConfig {
        TileConfig {
            block_m,
            block_n,
            warps,
            stages,
            family: KernelFamily::Sm80,
        }
    }

    #[test]
    fn defaults_by_head_dim() {
        let mut s = spec(vec![], None);
        for (dqk, dv, want) in [
            (64, 64, cfg(128, 64, 4, 2)),
            (128, 64, cfg(128, 32, 4, 2)),
            (96, 256, cfg(64, 64, 4, 1)),
            (256, 256, cfg(64, 64, 4, 1)),
        ] {
            (s.head_dim_qk, s.head_dim_v) = (dqk, dv);
            assert_eq!(default_config(&s), want, "d {dqk}x{dv}");
            assert!(plan(&s, None).is_ok());
            let sm90 = default_config_for(&s, KernelFamily::Sm90);
            assert_eq!(
                (sm90.block_m, sm90.warps, sm90.family),
                (128, 8, KernelFamily::Sm90)
            );
            assert!(
                plan(&s, Some(sm90)).is_ok(),
                "sm90 default for d {dqk}x{dv}"
            );
        }
    }

    #[test]
    fn a_score_hook_reading_a_tensor_gets_16_row_warps() {
        let table = ParamDecl {
            name: "bias".into(),
            kind: ParamKind::Tensor {
                elem: ScalarTy::F32,
                dims: vec![crate::spec::Dim::Fixed(8)],
            },
        };
        let score = Expr::bin(BinOp::Add, var(Var::S), Expr::Index(0, vec![var(Var::H)]));
        let mut s = spec(vec![table], None);
        s.score = Some(score);
        assert_eq!(default_config(&s), cfg(64, 64, 4, 2));
    }

    #[test]
    fn sm90_rules_name_the_value() {
        let s = spec(vec![], None);
        let sm90 = |block_m, block_n, warps, stages| TileConfig {
            family: KernelFamily::Sm90,
            ..cfg(block_m, block_n, warps, stages)
        };
        assert_eq!(
            plan(&s, Some(sm90(128, 64, 4, 2))).unwrap_err(),
            PlanError::Warpgroups {
                block_m: 128,
                warps: 4
            }
        );
        assert_eq!(
            plan(&s, Some(sm90(128, 32, 8, 2))).unwrap_err(),
            PlanError::Sm90Tile {
                block_n: 32,
                stages: 2
            }
        );
        let p = plan(&s, Some(sm90(128, 128, 8, 2))).unwrap();
        // Q 128×128, two stages of K (128×128) and V (128×64), plus the alignment slack.
        assert_eq!(p.smem_bytes, 1024 + 2 * (128 * 128 + 2 * 128 * (128 + 64)));
        assert!(p.kernel_name.ends_with("_sm90"));
        assert_eq!(KernelFamily::for_arch("sm_90a"), KernelFamily::Sm90Ws);
        assert_eq!(KernelFamily::for_arch("sm_90"), KernelFamily::Sm80);
        assert!(!KernelFamily::Sm90.runs_on("sm_80"));
        assert!(!KernelFamily::Sm90Ws.runs_on("sm_90"));
    }

    #[test]
    fn warp_specialised_plans_carry_tma_descriptors() {
        let s = spec(vec![], None);
        let ws = |block_m, block_n, warps| TileConfig {
            family: KernelFamily::Sm90Ws,
            ..cfg(block_m, block_n, warps, 2)
        };
        // warps count the producer warpgroup: block_m / 16 + 4.
        assert_eq!(
            plan(&s, Some(ws(128, 128, 8))).unwrap_err(),
            PlanError::Warpgroups {
                block_m: 128,
                warps: 8
            }
        );
        let p = plan(&s, Some(ws(128, 128, 12))).unwrap();
        // 168-byte header, no params: the descriptors start at the next 128-byte boundary.
        assert_eq!(p.params.tma_offset, Some(256));
        assert_eq!(p.params.total_size, 256 + 3 * TMA_DESC_BYTES);
        assert_eq!(p.threads(), 384);
        assert!(p.kernel_name.ends_with("_sm90ws"));
        // Other families have no descriptors; above head dim 128 the default leaves sm90ws.
        assert_eq!(plan(&s, None).unwrap().params.tma_offset, None);
        let mut wide = s.clone();
        (wide.head_dim_qk, wide.head_dim_v) = (256, 256);
        assert_eq!(
            default_config_for(&wide, KernelFamily::Sm90Ws).family,
            KernelFamily::Sm90
        );
    }

    #[test]
    fn invalid_configs_name_the_value() {
        let s = spec(vec![], None);
        let err = |c| plan(&s, Some(c)).unwrap_err();
        assert_eq!(err(cfg(128, 64, 2, 2)), PlanError::Warps(2));
        assert_eq!(
            err(cfg(96, 64, 4, 2)),
            PlanError::RowsPerWarp {
                block_m: 96,
                warps: 4
            }
        );
        assert_eq!(err(cfg(128, 48, 4, 2)), PlanError::BlockN(48));
        assert_eq!(err(cfg(128, 64, 4, 4)), PlanError::Stages(4));
        assert_eq!(
            err(cfg(128, 64, 4, 4)).to_string(),
            "stages must be 1, 2 or 3; got 4"
        );
        let mut big = s.clone();
        (big.head_dim_qk, big.head_dim_v) = (256, 256);
        let e = plan(&big, Some(cfg(128, 128, 4, 3))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the tiles need 458752 bytes of shared memory; the limit is 232448"
        );
        for d in [0, 12, 264] {
            let mut bad = s.clone();
            bad.head_dim_v = d;
            assert_eq!(
                plan(&bad, None).unwrap_err(),
                PlanError::HeadDim {
                    which: "head_dim_v",
                    value: d
                }
            );
        }
    }

    #[test]
    fn smem_threads_name_and_layout() {
        let params = vec![
            ParamDecl {
                name: "cap".into(),
                kind: ParamKind::Scalar(ScalarTy::F32),
            },
            ParamDecl {
                name: "doc".into(),
                kind: ParamKind::Tensor {
                    elem: ScalarTy::I32,
                    dims: vec![Dim::Seq],
                },
            },
            ParamDecl {
                name: "n".into(),
                kind: ParamKind::Scalar(ScalarTy::I32),
            },
        ];
        let mut s = spec(params, None);
        s.head_dim_qk = 40;
        let p = plan(&s, Some(cfg(128, 32, 8, 3))).unwrap();
        // pad64(40) = 64, pad64(64) = 64.
        assert_eq!(p.smem_bytes, 2 * (128 * 64 + 3 * 32 * 128));
        assert_eq!(p.threads(), 256);
        assert_eq!(
            p.kernel_name,
            "flash_fwd_gemma_local2_bf16_d40x64_m128n32w8s3"
        );
        let offsets: Vec<(u32, u32)> = p.params.slots.iter().map(|s| (s.offset, s.size)).collect();
        assert_eq!(offsets, [(168, 4), (176, 8), (184, 4)]);
        assert_eq!(p.params.total_size, 192);
        assert_eq!(param_layout(&spec(vec![], None)).total_size, 168);
    }

    #[test]
    fn causal_is_one_atom() {
        let m = analyse_mask(&spec(vec![], None), &causal());
        assert_eq!(m.tree, MaskTree::Atom(0));
        assert_eq!(
            m.atoms,
            [AffineAtom {
                cq: -1,
                ck: 1,
                offset: Expr::bin(BinOp::Sub, var(Var::SeqQ), var(Var::SeqK)),
                op: CmpOp::Le,
            }]
        );
    }

    #[test]
    fn equal_atoms_are_shared_and_constants_fold() {
        let s = spec(vec![], None);
        // q >= k - (seq_k - seq_q) is causal spelled differently.
        let other = Expr::bin(
            BinOp::Ge,
            var(Var::Q),
            Expr::bin(
                BinOp::Sub,
                var(Var::K),
                Expr::bin(BinOp::Sub, var(Var::SeqK), var(Var::SeqQ)),
            ),
        );
        let m = analyse_mask(&s, &Expr::bin(BinOp::And, causal(), other));
        assert_eq!(m.atoms.len(), 1);
        assert_eq!(m.tree, MaskTree::Atom(0));
        // 3 < 4 || doc-like opaque: true.
        let t = Expr::bin(BinOp::Lt, Expr::Int(3), Expr::Int(4));
        let opaque = Expr::bin(
            BinOp::Eq,
            Expr::bin(BinOp::Rem, var(Var::Q), Expr::Int(2)),
            Expr::Int(0),
        );
        let m = analyse_mask(&s, &Expr::bin(BinOp::Or, t.clone(), opaque.clone()));
        assert_eq!(m.tree, MaskTree::Const(true));
        let m = analyse_mask(&s, &Expr::bin(BinOp::And, t, opaque.clone()));
        assert_eq!(m.tree, MaskTree::Opaque);
        let not_not = Expr::Unary(
            UnOp::Not,
            Box::new(Expr::Unary(UnOp::Not, Box::new(causal()))),
        );
        assert_eq!(analyse_mask(&s, &not_not).tree, MaskTree::Atom(0));
        // q * k is not affine; q * 3 and seq_q * seq_k are.
        let qk = Expr::bin(
            BinOp::Lt,
            Expr::bin(BinOp::Mul, var(Var::Q), var(Var::K)),
            Expr::Int(5),
        );
        assert_eq!(analyse_mask(&s, &qk).tree, MaskTree::Opaque);
        let ok = Expr::bin(
            BinOp::Gt,
            Expr::bin(BinOp::Mul, var(Var::Q), Expr::Int(3)),
            Expr::bin(BinOp::Mul, var(Var::SeqQ), var(Var::SeqK)),
        );
        let m = analyse_mask(&s, &ok);
        // -3q + seq_q·seq_k + 1 <= 0
        assert_eq!((m.atoms[0].cq, m.atoms[0].ck), (-3, 0));
        let env = TileEnv {
            seq_q: 4,
            seq_k: 5,
            b: 0,
            h: 0,
            scalars: vec![],
            int_tensors: vec![],
        };
        assert_eq!(env.offset(&m.atoms[0].offset), 21);
        // A float comparison is opaque.
        let f = Expr::bin(
            BinOp::Lt,
            Expr::ToFloat(Box::new(var(Var::Q))),
            Expr::float(2.5),
        );
        assert_eq!(analyse_mask(&s, &f).tree, MaskTree::Opaque);
    }

    #[test]
    fn classification_of_causal_tiles() {
        let s = spec(vec![], Some(causal()));
        let p = plan(&s, Some(cfg(64, 64, 4, 1))).unwrap();
        let env = TileEnv {
            seq_q: 256,
            seq_k: 256,
            b: 0,
            h: 0,
            scalars: vec![],
            int_tensors: vec![],
        };
        use TileClass::*;
        assert_eq!(
            key_tile_classes(&p, &env, 1, 256, 256),
            [Full, Partial, Empty, Empty]
        );
        // Eq atoms: q == k is mixed on the diagonal, never off it; q != k the reverse.
        let eq = Expr::bin(BinOp::Eq, var(Var::Q), var(Var::K));
        let m = analyse_mask(&s, &eq);
        assert_eq!(classify(&m, &s, &env, 0, 63, 0, 63), Partial);
        assert_eq!(classify(&m, &s, &env, 0, 63, 64, 127), Empty);
        assert_eq!(classify(&m, &s, &env, 5, 5, 5, 5), Full);
        let ne = Expr::Unary(UnOp::Not, Box::new(eq));
        let m = analyse_mask(&s, &ne);
        assert_eq!(classify(&m, &s, &env, 0, 63, 64, 127), Full);
        assert_eq!(classify(&m, &s, &env, 5, 5, 5, 5), Empty);
    }
}
