//! The FP8 block-quantisation kernel: a bf16/f16 tensor `[batch, seq, heads, d]` into fp8 codes
//! (same layout, one byte each) and one f32 scale per block of `block_rows` positions of each
//! (batch, head), optionally after the random Hadamard rotation along `d` (incoherent
//! processing, applied to Q and K with the same signs). It computes exactly what
//! [`crate::fp8::hadamard_rotate_f32`] then [`crate::fp8::quantize`] with
//! [`crate::fp8::Scaling::PerBlock`] compute on the host, bit for bit (the GPU check compares the
//! two): the values widened to f32, rotated in f32 by the same butterflies in the same order, the
//! block's largest magnitude `amax`, `scale = amax / max`, `code = encode(x · (max / amax))`
//! (`cvt.rn.satfinite` for e4m3; int8 rounds to nearest even and clamps to ±127), with both
//! divisions rounded to nearest.
//!
//! One block of 512 threads per (row block, head, batch); at head dims 64, 128 and 256 the rows
//! stay in registers, a warp holding whole rows (`QuantSpec::in_registers`), elsewhere (and for
//! the per-channel and smoothing-sum passes) they sit in shared memory as f32. Any GPU from sm_89 converts to fp8; the plan names the sm_90
//! family (FP8 attention is a Hopper feature here).

use serde::{Deserialize, Serialize};

use super::operand::{
    arg_layout, ArgField, Extent, GridRule, LaunchShape, Layout, Operand, OperandType, Role,
};
use super::tile::{KernelFamily, PlanError, TileConfig, MAX_SMEM_BYTES};
use super::{KernelKind, KernelPlan};
use crate::fp8::Fp8Format;
use crate::spec::{DType, VariantSpec};

use Extent::*;

/// What one quantisation kernel does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QuantSpec {
    /// The element type read.
    pub input: DType,
    /// The head dimension (the rotation needs a power of two).
    pub head_dim: u32,
    /// The code format written: e4m3, or int8 (Q and K of a `qk: int8` variant; never
    /// transposed, V stays e4m3).
    pub format: Fp8Format,
    /// Positions per scale block (64 or 128).
    pub block_rows: u32,
    /// Rotate each row by the random Hadamard matrix first (signs from the `signs` operand).
    pub hadamard: bool,
    /// Write the codes transposed, `[batch, heads, d, seq_padded]` with the positions of each
    /// group of 32 permuted by [`crate::fp8::mma_key_order`]: V as an fp8 P·V product reads it
    /// (keys contiguous, in the order the probabilities sit in the first product's registers).
    #[serde(default)]
    pub transpose: bool,
    /// What one scale covers: a block of `block_rows` positions of one (batch, head) (the
    /// default), one (batch, head), or the whole tensor. The last two take two passes: the
    /// kernel with [`QuantSpec::amax_pass`] writes every block's largest magnitude into a scratch
    /// `[batch, heads, blocks]` tensor, then the encoding kernel reduces its group's entries.
    #[serde(default)]
    pub group: ScaleGroup,
    /// The first pass of a per-head or per-tensor quantisation (see [`QuantSpec::group`]): block
    /// amaxes only, no codes and no scales.
    #[serde(default)]
    pub amax_pass: bool,
    /// Smooth K first: subtract from each row the mean over the positions of its (batch, head)
    /// (before the rotation), which moves every score of a query row by the same amount — the
    /// softmax, and so O, are unchanged, the LSE moves by that amount, and the codes spend their
    /// range on what differs between keys. For K only (V's mean would change O). Takes two first
    /// passes: [`QuantSpec::sum_pass`] writes each block's column sums into a scratch `[batch,
    /// heads, blocks, d]` tensor, then [`QuantSpec::mean_pass`] reduces each (batch, head)'s sums
    /// in block order into its mean (over its first block's sums), so the mean is one f32 value,
    /// equal to [`crate::fp8::smooth_keys_f32`]'s, and the later passes read d floats a block.
    #[serde(default)]
    pub smooth: bool,
    /// The first pass of a smoothing quantisation (see [`QuantSpec::smooth`]): column sums only.
    #[serde(default)]
    pub sum_pass: bool,
    /// The second pass of a smoothing quantisation (see [`QuantSpec::smooth`]): the means, one
    /// thread per column of each (batch, head), in place of the first block's column sums.
    #[serde(default)]
    pub mean_pass: bool,
    /// The second pass of a per-channel quantisation ([`ScaleGroup::Channel`]): each column's
    /// largest magnitude over the blocks of its (batch, head), one thread per column, in place
    /// of the first block's column amaxes (no codes, no scales).
    #[serde(default)]
    pub reduce_pass: bool,
}

/// What one scale of a quantised tensor covers (the kernel-side [`crate::fp8::Scaling`]). The
/// discriminants are the templates' numbering (`GROUP`, `SCALE_UNIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum ScaleGroup {
    /// A block of `block_rows` positions of one (batch, head).
    #[default]
    Block = 0,
    /// One (batch, head).
    Head = 1,
    /// The whole tensor.
    Tensor = 2,
    /// One channel (column of the head dim) of one (batch, head), over every position: V's
    /// `v_scales: per_channel`. Takes three passes: [`QuantSpec::amax_pass`] writes each
    /// block's column amaxes into the scratch `[batch, heads, blocks, d]` tensor, the reduce
    /// pass ([`QuantSpec::reduce_pass`]) takes each column's largest over the blocks, in
    /// place of the first block's, then the encoding pass reads its d scales.
    Channel = 3,
}

impl ScaleGroup {
    /// The group of a host-side scaling (a block's rows are the kernel's `block_rows`).
    pub fn of(s: crate::fp8::Scaling) -> ScaleGroup {
        match s {
            crate::fp8::Scaling::PerBlock { .. } => ScaleGroup::Block,
            crate::fp8::Scaling::PerHead => ScaleGroup::Head,
            crate::fp8::Scaling::PerTensor => ScaleGroup::Tensor,
            crate::fp8::Scaling::PerChannel => ScaleGroup::Channel,
        }
    }

    /// The host-side scaling of this group with blocks of `block_rows` positions (the inverse of
    /// [`ScaleGroup::of`]); its [`crate::fp8::Scaling::scale_shape`] is the scales' shape.
    pub fn scaling(self, block_rows: usize) -> crate::fp8::Scaling {
        match self {
            ScaleGroup::Block => crate::fp8::Scaling::PerBlock { rows: block_rows },
            ScaleGroup::Head => crate::fp8::Scaling::PerHead,
            ScaleGroup::Tensor => crate::fp8::Scaling::PerTensor,
            ScaleGroup::Channel => crate::fp8::Scaling::PerChannel,
        }
    }
}

/// The input tensor.
pub const X_OPERAND: &str = "x";
/// The fp8 codes written.
pub const CODES_OPERAND: &str = "codes";
/// The scales written: `[batch, heads, scale_blocks]`, `[batch, heads]` or one f32, by
/// [`QuantSpec::group`].
pub const SCALES_OPERAND: &str = "scales";
/// The block amaxes of a two-pass quantisation, `[batch, heads, scale_blocks]` f32: written by
/// the first pass, read by the second.
pub const AMAX_OPERAND: &str = "amax";
/// The rotation's signs, `[head_dim]` f32 (±1), with `hadamard`.
pub const SIGNS_OPERAND: &str = "signs";
/// The column sums of each block of a smoothing quantisation, `[batch, heads, scale_blocks,
/// head_dim]` f32: written by its first pass, read by the others.
pub const COLSUM_OPERAND: &str = "colsum";

/// Threads a block. Chosen when the rows sat in shared memory as f32 (64 KB at d 128, 128 KB at
/// 256), so few blocks fit on an SM and each needed many loads in flight: 512 against 128
/// measured +46 % at d 128 and ×2.2 at d 256, the rotation +55 % and ×2.9 (H200, one call,
/// `bench/results/ab-quant-threads/`). The register path (`QuantSpec::in_registers`) keeps 512:
/// a warp a row, 8 rows a warp of a 128-row block (not re-tuned).
const THREADS: u32 = 512;

impl QuantSpec {
    /// The codes of `input` in `format` with one scale per block of `block_rows` positions:
    /// not rotated, transposed or smoothed, and not one of the first passes. Other groupings
    /// and options by struct update, e.g. `QuantSpec { group: ScaleGroup::Head, ..q }`.
    pub fn new(input: DType, head_dim: u32, format: Fp8Format, block_rows: u32) -> QuantSpec {
        QuantSpec {
            input,
            head_dim,
            format,
            block_rows,
            hadamard: false,
            transpose: false,
            group: ScaleGroup::Block,
            amax_pass: false,
            smooth: false,
            sum_pass: false,
            mean_pass: false,
            reduce_pass: false,
        }
    }

    /// The checks of a quantisation kernel's configuration, each naming the value and the rule.
    pub fn check(&self) -> Result<(), String> {
        if !matches!(self.block_rows, 64 | 128) {
            return Err(format!(
                "a scale block is 64 or 128 positions; got {}",
                self.block_rows
            ));
        }
        if !self.head_dim.is_multiple_of(8) || !(8..=256).contains(&self.head_dim) {
            return Err(format!(
                "the head dim must be a multiple of 8 in 8..=256; got {}",
                self.head_dim
            ));
        }
        if self.amax_pass && self.group == ScaleGroup::Block {
            return Err(
                "the amax pass belongs to per-head, per-tensor and per-channel scales; per-block scales take one pass".into(),
            );
        }
        if self.reduce_pass && (self.group != ScaleGroup::Channel || self.amax_pass) {
            return Err("the reduce pass belongs to a per-channel quantisation, alone".into());
        }
        if self.group == ScaleGroup::Channel && (self.hadamard || self.smooth) {
            return Err(
                "per-channel scales are V's, and V is neither rotated nor smoothed (either would change O)".into(),
            );
        }
        if self.group == ScaleGroup::Channel && self.format == Fp8Format::Int8 {
            return Err(
                "per-channel scales are V's, whose codes are e4m3; int8 codes are for Q and K"
                    .into(),
            );
        }
        if self.format == Fp8Format::Int8 && self.transpose {
            return Err("int8 codes are for Q and K; V (the transposed layout) stays e4m3".into());
        }
        if self.smooth && self.transpose {
            return Err(
                "smoothing subtracts K's mean over keys; V (the transposed layout) is never smoothed: its mean would change O".into(),
            );
        }
        if self.sum_pass && (!self.smooth || self.amax_pass) {
            return Err("the column-sum pass belongs to a smoothing quantisation, alone".into());
        }
        if self.mean_pass && (!self.smooth || self.amax_pass || self.sum_pass) {
            return Err("the means pass belongs to a smoothing quantisation, alone".into());
        }
        if self.hadamard && !matches!(self.head_dim, 64 | 128 | 256) {
            return Err(format!(
                "the Hadamard rotation needs a power-of-two head dim (64, 128, 256); got {}",
                self.head_dim
            ));
        }
        Ok(())
    }

    /// Whether the block's rows stay in registers (no f32 tile in shared memory): one scale per
    /// block, head or tensor, and a head dim of 64, 128 or 256 (a warp holds whole rows,
    /// `head_dim / 32` values a lane, the rotation's layout). That covers Q's, K's and V's
    /// quantisation and the per-head/per-tensor first pass; a transposing kernel (V) stages its
    /// codes, one byte each, in shared memory for the gather. The per-channel kernels and the
    /// smoothing's first two passes keep the f32 tile. Why: with the tile (64 KB at d 128) three
    /// blocks fit an SM and each block loads, reduces and stores in turn: the plain kernel moved
    /// 1.9 TB/s on an H200, 2.9 TB/s from registers (`bench/results/quant-registers-2026-11-29/`).
    pub fn in_registers(&self) -> bool {
        self.group != ScaleGroup::Channel
            && !self.sum_pass
            && !self.mean_pass
            && !self.reduce_pass
            && matches!(self.head_dim, 64 | 128 | 256)
    }

    /// Shared memory: the block's rows as f32; where they stay in registers none, or for the
    /// transposing kernel its codes (rows `head_dim + 4` bytes apart: the gather's four rows of
    /// a word fall in different banks).
    pub fn smem_bytes(&self) -> u32 {
        if self.in_registers() {
            if self.transpose {
                self.block_rows * (self.head_dim + 4)
            } else {
                0
            }
        } else {
            self.block_rows * self.head_dim * 4
        }
    }

    /// The entry point's name, e.g. `flash_quant_e4m3_bf16_d128_r128_had` (`_t` transposed,
    /// `_head` / `_tensor` / `_channel` for those groups, `_amax` for their first pass and
    /// `_reduce` for the per-channel second, `_smooth` smoothed, `_sum` and `_mean` for its first
    /// two passes).
    pub fn kernel_name(&self) -> String {
        format!(
            "flash_quant_{}_{}_d{}_r{}{}{}{}{}{}{}{}{}",
            self.format.name(),
            self.input.name(),
            self.head_dim,
            self.block_rows,
            if self.hadamard { "_had" } else { "" },
            if self.transpose { "_t" } else { "" },
            match self.group {
                ScaleGroup::Block => "",
                ScaleGroup::Head => "_head",
                ScaleGroup::Tensor => "_tensor",
                ScaleGroup::Channel => "_channel",
            },
            if self.amax_pass { "_amax" } else { "" },
            if self.reduce_pass { "_reduce" } else { "" },
            if self.smooth { "_smooth" } else { "" },
            if self.sum_pass { "_sum" } else { "" },
            if self.mean_pass { "_mean" } else { "" },
        )
    }

    /// The column-sum pass of this smoothing quantisation; `None` without smoothing (or for a
    /// pass of one). It writes no codes, so its format is always e4m3: int8 and e4m3 K share
    /// one kernel.
    pub fn sum_pass(&self) -> Option<QuantSpec> {
        (self.smooth && !self.sum_pass && !self.mean_pass && !self.amax_pass).then_some(QuantSpec {
            sum_pass: true,
            format: Fp8Format::E4m3,
            hadamard: false,
            transpose: false,
            group: ScaleGroup::Block,
            ..*self
        })
    }

    /// The means pass of this smoothing quantisation (after [`QuantSpec::sum_pass`]); `None`
    /// without smoothing or for a pass. Like the sum pass it writes no codes: one kernel for
    /// int8 and e4m3 K.
    pub fn mean_pass(&self) -> Option<QuantSpec> {
        self.sum_pass().map(|sum| QuantSpec {
            sum_pass: false,
            mean_pass: true,
            ..sum
        })
    }

    /// The first pass of this (per-head, per-tensor or per-channel) quantisation; `None` for
    /// per-block scales, which take one. It writes no codes: transposing or not, one kernel.
    pub fn amax_pass(&self) -> Option<QuantSpec> {
        (self.group != ScaleGroup::Block && !self.is_pass()).then_some(QuantSpec {
            amax_pass: true,
            transpose: false,
            ..*self
        })
    }

    /// The second pass of this per-channel quantisation (after [`QuantSpec::amax_pass`]): the
    /// columns' largest magnitudes over the blocks; `None` for other groups or for a pass.
    pub fn reduce_pass(&self) -> Option<QuantSpec> {
        (self.group == ScaleGroup::Channel && !self.is_pass()).then_some(QuantSpec {
            reduce_pass: true,
            transpose: false,
            ..*self
        })
    }

    /// Whether this is a first pass of a multi-pass quantisation (no codes, no scales).
    pub fn is_pass(&self) -> bool {
        self.amax_pass || self.sum_pass || self.mean_pass || self.reduce_pass
    }

    /// The f32 normalisation of the rotation, `1/√d` rounded to f32 (the host model uses the
    /// same value).
    pub fn hadamard_norm(&self) -> f32 {
        (1.0 / (self.head_dim as f64).sqrt()) as f32
    }
}

/// Plans the quantisation kernel of `q` (see the module docs).
///
/// ```
/// use flash_dsl::fp8::Fp8Format;
/// use flash_dsl::plan::quantize::{plan_quantize, QuantSpec};
/// use flash_dsl::DType;
///
/// let q = QuantSpec {
///     input: DType::Bf16,
///     head_dim: 128,
///     format: Fp8Format::E4m3,
///     block_rows: 128,
///     hadamard: true,
///     transpose: false,
///     group: Default::default(),
///     amax_pass: false,
///     smooth: false,
///     sum_pass: false,
///     mean_pass: false,
///     reduce_pass: false,
/// };
/// let p = plan_quantize(&q).unwrap();
/// assert_eq!(p.kernel_name, "flash_quant_e4m3_bf16_d128_r128_had");
/// assert_eq!(p.smem_bytes(), 0); // rows in registers
/// let t = QuantSpec { transpose: true, ..q }; // V: its codes staged for the gather
/// assert_eq!(plan_quantize(&t).unwrap().smem_bytes(), 128 * (128 + 4));
/// let names: Vec<&str> = p.operands.iter().map(|o| o.name.as_str()).collect();
/// assert_eq!(names, ["x", "codes", "scales", "signs"]);
///
/// // The rotation needs a head dim of 64, 128 or 256 (a warp's whole row, 2, 4 or 8 a lane).
/// assert!(plan_quantize(&QuantSpec { head_dim: 96, ..q }).is_err());
/// assert!(plan_quantize(&QuantSpec { head_dim: 32, ..q }).is_err());
///
/// // int8 codes (Q and K of a `qk: int8` variant): round to nearest even and clamp to ±127
/// // instead of an fp8 conversion.
/// let i8 = plan_quantize(&QuantSpec { format: Fp8Format::Int8, ..q }).unwrap();
/// assert_eq!(i8.kernel_name, "flash_quant_int8_bf16_d128_r128_had");
/// let src = flash_dsl::emit(&i8).source;
/// assert!(src.contains("__float2int_rn") && !src.contains("cvt.rn.satfinite"));
/// // …and never transposed: V stays e4m3.
/// let e = plan_quantize(&QuantSpec { format: Fp8Format::Int8, transpose: true, ..q });
/// assert!(e.unwrap_err().to_string().contains("V (the transposed layout) stays e4m3"));
///
/// // One scale per head: a first pass writes the block amaxes, the second reads them.
/// use flash_dsl::plan::quantize::ScaleGroup;
/// let head = QuantSpec { group: ScaleGroup::Head, ..q };
/// let first = plan_quantize(&head.amax_pass().unwrap()).unwrap();
/// let names: Vec<&str> = first.operands.iter().map(|o| o.name.as_str()).collect();
/// assert_eq!(names, ["x", "signs", "amax"]);
/// let second = plan_quantize(&head).unwrap();
/// let names: Vec<&str> = second.operands.iter().map(|o| o.name.as_str()).collect();
/// assert_eq!(names, ["x", "codes", "scales", "signs", "amax"]);
/// assert_eq!(second.operands[2].dims.len(), 2);
///
/// // Smoothing K: a first pass writes each block's column sums, a second turns them into the
/// // (batch, head)'s means, the encoding reads those.
/// let smooth = QuantSpec { smooth: true, ..q };
/// let sums = plan_quantize(&smooth.sum_pass().unwrap()).unwrap();
/// assert_eq!(sums.kernel_name, "flash_quant_e4m3_bf16_d128_r128_smooth_sum");
/// let means = plan_quantize(&smooth.mean_pass().unwrap()).unwrap();
/// assert_eq!(means.kernel_name, "flash_quant_e4m3_bf16_d128_r128_smooth_mean");
/// let names: Vec<&str> = sums.operands.iter().map(|o| o.name.as_str()).collect();
/// assert_eq!(names, ["x", "colsum"]);
/// let enc = plan_quantize(&smooth).unwrap();
/// let names: Vec<&str> = enc.operands.iter().map(|o| o.name.as_str()).collect();
/// assert_eq!(names, ["x", "codes", "scales", "signs", "colsum"]);
/// // Never V.
/// let e = plan_quantize(&QuantSpec { transpose: true, ..smooth });
/// assert!(e.unwrap_err().to_string().contains("never smoothed"));
/// ```
pub fn plan_quantize(q: &QuantSpec) -> Result<KernelPlan, PlanError> {
    q.check().map_err(PlanError::Quantize)?;
    let bytes = q.smem_bytes();
    if bytes > MAX_SMEM_BYTES {
        return Err(PlanError::SharedMemory {
            bytes,
            limit: MAX_SMEM_BYTES,
        });
    }
    // The argument machinery (and the runtime's kernel memo) is keyed by a variant; the
    // quantiser's stands for its input and names what else differs.
    let spec = VariantSpec {
        name: q.kernel_name().replacen("flash_quant", "quantize", 1),
        doc: String::new(),
        head_dim_qk: q.head_dim,
        head_dim_v: q.head_dim,
        dtype: q.input,
        scale: None,
        params: Vec::new(),
        mask: None,
        score: None,
        dropout: None,
        sparsity: None,
        fp8: None,
    };
    let x = Operand::new(
        X_OPERAND,
        Role::Input,
        OperandType::Storage(q.input),
        &[Batch, SeqQ, HeadsQ, HeadDimQk],
        Layout::Strided,
    );
    // Per channel: each block's column amaxes.
    let amax = |role| {
        Operand::new(
            AMAX_OPERAND,
            role,
            OperandType::F32,
            if q.group == ScaleGroup::Channel {
                &[Batch, HeadsQ, ScaleBlocks, HeadDimQk]
            } else {
                &[Batch, HeadsQ, ScaleBlocks]
            },
            Layout::Contiguous,
        )
    };
    let colsum = |role| {
        Operand::new(
            COLSUM_OPERAND,
            role,
            OperandType::F32,
            &[Batch, HeadsQ, ScaleBlocks, HeadDimQk],
            Layout::Contiguous,
        )
    };
    let mut operands = vec![x];
    if q.sum_pass || q.mean_pass {
        operands.push(colsum(Role::Output));
    }
    if !q.is_pass() {
        operands.push(Operand::new(
            CODES_OPERAND,
            Role::Output,
            OperandType::Fp8(q.format),
            if q.transpose {
                &[Batch, HeadsQ, HeadDimQk, SeqPadded]
            } else {
                &[Batch, SeqQ, HeadsQ, HeadDimQk]
            },
            Layout::Contiguous,
        ));
        operands.push(Operand::new(
            SCALES_OPERAND,
            Role::Output,
            OperandType::F32,
            match q.group {
                ScaleGroup::Block => &[Batch, HeadsQ, ScaleBlocks],
                ScaleGroup::Head => &[Batch, HeadsQ],
                ScaleGroup::Tensor => &[],
                ScaleGroup::Channel => &[Batch, HeadsQ, HeadDimQk],
            },
            Layout::Contiguous,
        ));
    }
    if q.hadamard && !q.sum_pass && !q.mean_pass {
        operands.push(Operand::new(
            SIGNS_OPERAND,
            Role::Input,
            OperandType::F32,
            &[HeadDimQk],
            Layout::Contiguous,
        ));
    }
    if q.amax_pass || q.reduce_pass {
        operands.push(amax(Role::Output));
    } else if q.group != ScaleGroup::Block && !q.sum_pass && !q.mean_pass {
        operands.push(amax(Role::Input));
    }
    if q.smooth && !q.sum_pass && !q.mean_pass {
        operands.push(colsum(Role::Input));
    }
    let mut scalars = vec![
        ArgField::Size(Batch),
        ArgField::Size(SeqQ),
        ArgField::Size(HeadsQ),
        ArgField::Size(ScaleBlocks),
    ];
    if q.transpose {
        scalars.push(ArgField::Size(SeqPadded));
    }
    let args = arg_layout(&spec, &operands, &scalars);
    let config = TileConfig {
        block_m: q.block_rows,
        block_n: 16,
        warps: THREADS / 32,
        stages: 1,
        family: KernelFamily::Sm90,
    };
    Ok(KernelPlan {
        kind: KernelKind::Quantize,
        spec,
        config,
        args,
        operands,
        launch: LaunchShape {
            // The reduce and mean passes read a (batch, head)'s blocks in one thread per column:
            // a block per query tile would launch blocks with nothing to do.
            grid: if q.reduce_pass || q.mean_pass {
                GridRule::Heads
            } else {
                GridRule::QueryTiles { rows: q.block_rows }
            },
            threads: THREADS,
            smem_bytes: bytes,
        },
        mask: None,
        kernel_name: q.kernel_name(),
        deterministic: false,
        block_map: None,
        quant: Some(*q),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k_spec() -> QuantSpec {
        QuantSpec {
            input: DType::Bf16,
            head_dim: 128,
            format: Fp8Format::E4m3,
            block_rows: 128,
            hadamard: true,
            transpose: false,
            group: ScaleGroup::Head,
            amax_pass: false,
            smooth: true,
            sum_pass: false,
            mean_pass: false,
            reduce_pass: false,
        }
    }

    /// The passes of a smoothing per-head quantisation: sums (unrotated, per block, no codes),
    /// then amaxes and codes that both read the sums; no pass has a pass of its own.
    #[test]
    fn smoothing_passes_chain() {
        let q = k_spec();
        let sum = q.sum_pass().expect("smoothing takes a sum pass");
        assert!(sum.sum_pass && !sum.hadamard && sum.group == ScaleGroup::Block);
        let int8 = QuantSpec {
            format: Fp8Format::Int8,
            ..q
        };
        assert_eq!(
            int8.sum_pass(),
            Some(sum),
            "one sum kernel for int8 and e4m3 K"
        );
        assert_eq!(sum.sum_pass(), None);
        assert_eq!(sum.amax_pass(), None);
        let mean = q.mean_pass().expect("smoothing takes a means pass");
        assert!(
            mean.mean_pass && !mean.sum_pass && !mean.hadamard && mean.group == ScaleGroup::Block
        );
        assert_eq!(int8.mean_pass(), Some(mean));
        assert_eq!(
            (mean.sum_pass(), mean.mean_pass(), mean.amax_pass()),
            (None, None, None)
        );
        assert!(plan_quantize(&mean)
            .unwrap()
            .kernel_name
            .ends_with("_smooth_mean"));
        let amax = q.amax_pass().expect("per-head scales take an amax pass");
        assert!(amax.smooth && amax.amax_pass && amax.sum_pass().is_none());
        let names = |s: &QuantSpec| -> Vec<String> {
            plan_quantize(s)
                .unwrap()
                .operands
                .iter()
                .map(|o| o.name.clone())
                .collect()
        };
        assert_eq!(names(&sum), ["x", "colsum"]);
        assert_eq!(names(&mean), ["x", "colsum"]);
        // The sum pass has a block per tile of rows; the means pass one per (batch, head).
        let grid = |s: &QuantSpec| {
            let extent = |e| match e {
                Extent::SeqQ => 1000,
                Extent::HeadsQ => 3,
                Extent::Batch => 2,
                _ => 0,
            };
            plan_quantize(s).unwrap().launch.grid.grid(extent, 132)
        };
        assert_eq!(grid(&sum), [8, 3, 2]);
        assert_eq!(grid(&mean), [1, 3, 2]);
        let channel = QuantSpec {
            group: ScaleGroup::Channel,
            smooth: false,
            hadamard: false,
            ..q
        };
        let reduce = channel
            .reduce_pass()
            .expect("per-channel scales take a reduce pass");
        assert_eq!(grid(&reduce), [1, 3, 2]);
        assert_eq!(names(&amax), ["x", "signs", "amax", "colsum"]);
        assert_eq!(
            names(&q),
            ["x", "codes", "scales", "signs", "amax", "colsum"]
        );
        // Without smoothing: no sum pass, no colsum.
        let plain = QuantSpec { smooth: false, ..q };
        assert_eq!(plain.sum_pass(), None);
        assert!(!names(&plain).iter().any(|n| n == "colsum"));
        assert_eq!(plain.mean_pass(), None);
        // A sum or means pass on its own, or with another pass, is refused.
        for bad in [
            QuantSpec {
                smooth: false,
                mean_pass: true,
                ..q
            },
            QuantSpec {
                mean_pass: true,
                amax_pass: true,
                ..q
            },
            QuantSpec {
                mean_pass: true,
                sum_pass: true,
                ..q
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        assert!(QuantSpec {
            smooth: false,
            sum_pass: true,
            ..q
        }
        .check()
        .is_err());
        assert!(QuantSpec {
            sum_pass: true,
            amax_pass: true,
            ..q
        }
        .check()
        .is_err());
    }
}
