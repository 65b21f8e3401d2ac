//! `flash quantize`: FP8 block quantisation of one `.npy` tensor on the GPU.
//!
//! ```text
//! flash quantize --x X.npy --codes CODES.npy --scales SCALES.npy [--dtype bf16|f16]
//!                [--block-rows 64|128] [--per block|head|tensor|channel] [--hadamard-seed N]
//!                [--transpose] [--smooth] [--format e4m3|int8] [--gpu N]
//! ```
//!
//! X is `[batch, seq, heads, d]` (any float `.npy`, rounded to `--dtype` first, as `flash run`
//! rounds its inputs). CODES are the e4m3 codes as `uint8` (`[batch, seq, heads, d]`, or with
//! `--transpose` `[batch, heads, d, seq_padded]` in the key order an fp8 P·V product reads), and
//! SCALES the f32 scales `[batch, heads, ceil(seq / block_rows)]` (`--per block`, the default),
//! `[batch, heads]` (`--per head`), `[1]` (`--per tensor`) or `[batch, heads, d]` (`--per
//! channel`: V of a variant declared `v_scales: per_channel`; neither rotated nor smoothed):
//! `x ≈ e4m3(code) · scale`.
//! `--hadamard-seed N` rotates every row by the random Hadamard matrix of `flash_dsl::fp8`
//! (`random_signs(d, N)`) first; rotate Q and K with the same seed. The arguments and the input
//! are checked before the GPU is touched. `--format int8` writes int8 codes (their two's-complement
//! bytes, `uint8` in the file; `x ≈ code · scale`, scale = amax / 127) for the Q and K of a
//! variant declared `qk: int8`. `--smooth` (K only) subtracts each (batch, head)'s mean over
//! positions from its rows before the rotation: the softmax, and so O, do not change, the LSE
//! moves by `scale · q·mean` per query row.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use flash_dsl::fp8::{random_signs, Fp8Format};
use flash_dsl::plan::quantize::{QuantSpec, ScaleGroup};
use flash_dsl::DType;

use crate::error::FlashError;
use crate::launch::{Runtime, TensorRef};
use crate::npy::{NpyArray, NpyData};

/// Arguments of `flash quantize`.
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// The tensor, `[batch, seq, heads, head_dim]`.
    #[arg(long)]
    pub x: PathBuf,
    /// Where to write the e4m3 codes (`uint8`).
    #[arg(long)]
    pub codes: PathBuf,
    /// Where to write the scales (f32, one per block of rows of each (batch, head)).
    #[arg(long)]
    pub scales: PathBuf,
    /// The 16-bit type the input is rounded to and read as.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Positions per scale block: 64 or 128.
    #[arg(long, default_value_t = 128)]
    pub block_rows: u32,
    /// What one scale covers: `block` (block-rows positions of one batch and head), `head`,
    /// `tensor` — as a variant's `scales: per_block(128)`, `per_head`, `per_tensor` — or
    /// `channel` (one column of one batch and head: V's `v_scales: per_channel`).
    #[arg(long, default_value = "block")]
    pub per: String,
    /// Rotate every row by the random Hadamard matrix with this seed first.
    #[arg(long)]
    pub hadamard_seed: Option<u64>,
    /// Write the codes transposed for an fp8 P·V product (V).
    #[arg(long)]
    pub transpose: bool,
    /// Smooth K: subtract each (batch, head)'s mean over positions first (not for V).
    #[arg(long)]
    pub smooth: bool,
    /// The codes' format: `e4m3`, or `int8` (Q and K of a `qk: int8` variant).
    #[arg(long, default_value = "e4m3")]
    pub format: String,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
}

fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

/// Runs `flash quantize`.
pub fn cmd_quantize(a: &QuantizeArgs) -> Result<ExitCode, FlashError> {
    let input = match a.dtype.as_str() {
        "bf16" => DType::Bf16,
        "f16" => DType::F16,
        other => {
            return Err(invalid(format!(
                "--dtype is bf16 or f16 (the type the input is read as); got `{other}`"
            )))
        }
    };
    let group = match a.per.as_str() {
        "block" => ScaleGroup::Block,
        "head" => ScaleGroup::Head,
        "tensor" => ScaleGroup::Tensor,
        "channel" => ScaleGroup::Channel,
        other => {
            return Err(invalid(format!(
                "--per is block, head, tensor or channel (what one scale covers); got `{other}`"
            )))
        }
    };
    let format = match a.format.as_str() {
        "e4m3" => Fp8Format::E4m3,
        "int8" => Fp8Format::Int8,
        other => {
            return Err(invalid(format!(
                "--format is e4m3 or int8 (the codes written); got `{other}`"
            )))
        }
    };
    let x = NpyArray::read(&a.x)?;
    let shape: [usize; 4] = x.shape.as_slice().try_into().map_err(|_| {
        invalid(format!(
            "--x must be a 4-d array [batch, seq, heads, head_dim]; got shape {:?}",
            x.shape
        ))
    })?;
    let q = QuantSpec {
        hadamard: a.hadamard_seed.is_some(),
        transpose: a.transpose,
        group,
        smooth: a.smooth,
        ..QuantSpec::new(input, shape[3] as u32, format, a.block_rows)
    };
    q.check().map_err(invalid)?;
    let [b, s, h, d] = shape;
    let blocks = s.div_ceil(a.block_rows as usize);
    let scale_shape = group.scaling(a.block_rows as usize).scale_shape(shape);
    let n_scales: usize = scale_shape.iter().product();
    let n_codes = if a.transpose {
        b * h * d * blocks * a.block_rows as usize
    } else {
        b * s * h * d
    };

    let rt = Runtime::new(a.gpu)?;
    let st = rt.stream().clone();
    let drv = |what: &'static str| move |e| FlashError::Driver(format!("{what}: {e:?}"));
    let mut bits = x.data.to_half_bits(input);
    bits.resize(bits.len().max(8), 0);
    let dx = st.clone_htod(&bits).map_err(drv("copying X to the GPU"))?;
    let mut codes = st
        .alloc_zeros::<u8>(n_codes.max(1))
        .map_err(drv("allocating the codes"))?;
    let mut scales = st
        .alloc_zeros::<f32>(n_scales.max(1))
        .map_err(drv("allocating the scales"))?;
    let signs: Vec<f32> = random_signs(d, a.hadamard_seed.unwrap_or(0))
        .iter()
        .map(|&v| v as f32)
        .collect();
    let dsigns = st.clone_htod(&signs).map_err(drv("copying the signs"))?;
    let kernel = rt.load_quantize(&q)?;
    let xt = TensorRef::new(&dx, shape, &st);
    rt.quantize(
        &kernel,
        &xt,
        q.hadamard.then_some(&dsigns),
        &mut codes,
        &mut scales,
    )?;
    rt.synchronize()?;
    let mut c = st
        .clone_dtoh(&codes)
        .map_err(drv("copying the codes back"))?;
    c.truncate(n_codes);
    let mut sc = st
        .clone_dtoh(&scales)
        .map_err(drv("copying the scales back"))?;
    sc.truncate(n_scales);
    let code_shape = if a.transpose {
        vec![b, h, d, blocks * a.block_rows as usize]
    } else {
        shape.to_vec()
    };
    NpyArray::new(code_shape, NpyData::U8(c))?.write(&a.codes)?;
    NpyArray::new(scale_shape, NpyData::F32(sc))?.write(&a.scales)?;
    eprintln!(
        "quantised {shape:?} with {} on {}",
        kernel.plan.kernel_name,
        rt.info().name
    );
    Ok(ExitCode::SUCCESS)
}
