//! The FP8 block-quantisation kernel: a bf16/f16 tensor `[batch, seq, heads, d]` into fp8 codes
//! (same layout, one byte each) and one f32 scale per block of `block_rows` positions of each
//! (batch, head), optionally after the random Hadamard rotation along `d` (incoherent
//! processing, applied to Q and K with the same signs). It computes exactly what
//! [`crate::fp8::hadamard_rotate_f32`] then [`crate::fp8::quantize`] with
//! [`crate::fp8::Scaling::PerBlock`] compute on the host, bit for bit (the GPU check compares the
//! two): the values widened to f32, rotated in f32 by the same butterflies in the same order, the
//! block's largest magnitude `amax`, `scale = amax / max`, `code = encode(x · (max / amax))`
//! (`cvt.rn.satfinite`), with both divisions rounded to nearest.
//!
//! One block of 128 threads per (row block, head, batch); the rows sit in shared memory as f32
//! while the rotation's stages run. Any GPU from sm_89 converts to fp8; the plan names the sm_90
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
    /// The fp8 format written.
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
}

/// The input tensor.
pub const X_OPERAND: &str = "x";
/// The fp8 codes written.
pub const CODES_OPERAND: &str = "codes";
/// The scales written, `[batch, heads, scale_blocks]` f32.
pub const SCALES_OPERAND: &str = "scales";
/// The rotation's signs, `[head_dim]` f32 (±1), with `hadamard`.
pub const SIGNS_OPERAND: &str = "signs";

/// Threads per block of the kernel.
const THREADS: u32 = 128;

impl QuantSpec {
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
        if self.hadamard && !self.head_dim.is_power_of_two() {
            return Err(format!(
                "the Hadamard rotation needs a power-of-two head dim (64, 128, 256); got {}",
                self.head_dim
            ));
        }
        Ok(())
    }

    /// Shared memory: the block's rows as f32.
    pub fn smem_bytes(&self) -> u32 {
        self.block_rows * self.head_dim * 4
    }

    /// The entry point's name, e.g. `flash_quant_e4m3_bf16_d128_r128_had`.
    pub fn kernel_name(&self) -> String {
        format!(
            "flash_quant_{}_{}_d{}_r{}{}",
            self.format.name(),
            self.input.name(),
            self.head_dim,
            self.block_rows,
            if self.hadamard { "_had" } else { "" },
        ) + if self.transpose { "_t" } else { "" }
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
/// };
/// let p = plan_quantize(&q).unwrap();
/// assert_eq!(p.kernel_name, "flash_quant_e4m3_bf16_d128_r128_had");
/// assert_eq!(p.smem_bytes(), 128 * 128 * 4);
/// let names: Vec<&str> = p.operands.iter().map(|o| o.name.as_str()).collect();
/// assert_eq!(names, ["x", "codes", "scales", "signs"]);
///
/// // The rotation needs a power-of-two head dim.
/// assert!(plan_quantize(&QuantSpec { head_dim: 96, ..q }).is_err());
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
        name: format!(
            "quantize_{}{}{}",
            q.format.name(),
            if q.hadamard { "_had" } else { "" },
            if q.transpose { "_t" } else { "" }
        ),
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
    let mut operands = vec![
        Operand::new(
            X_OPERAND,
            Role::Input,
            OperandType::Storage(q.input),
            &[Batch, SeqQ, HeadsQ, HeadDimQk],
            Layout::Strided,
        ),
        Operand::new(
            CODES_OPERAND,
            Role::Output,
            OperandType::Fp8(q.format),
            if q.transpose {
                &[Batch, HeadsQ, HeadDimQk, SeqPadded]
            } else {
                &[Batch, SeqQ, HeadsQ, HeadDimQk]
            },
            Layout::Contiguous,
        ),
        Operand::new(
            SCALES_OPERAND,
            Role::Output,
            OperandType::F32,
            &[Batch, HeadsQ, ScaleBlocks],
            Layout::Contiguous,
        ),
    ];
    if q.hadamard {
        operands.push(Operand::new(
            SIGNS_OPERAND,
            Role::Input,
            OperandType::F32,
            &[HeadDimQk],
            Layout::Contiguous,
        ));
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
            grid: GridRule::QueryTiles { rows: q.block_rows },
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
