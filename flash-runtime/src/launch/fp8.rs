//! The fp8 forward (`dtype: e4m3` variants, see `flash_dsl::plan::forward::fp8_operands`): Q, K
//! and V as e4m3 codes with f32 scales (per block of 128 positions of each (batch, head), per
//! head, per tensor; V's also per channel) — what
//! [`Runtime::quantize`] writes, or an fp8 KV cache's own codes and scales — O in bf16 and the
//! LSE as in every forward.

use cudarc::driver::CudaSlice;
use flash_dsl::plan::Extent;
use flash_dsl::spec::FP8_SCALE_BLOCK;

use super::block_map::BlockMap;
use super::check::invalid;
use super::tensor::{self, LseMut, OperandArg, TensorMut, TensorRef};
use super::{LoadedKernel, ProblemShape, Runtime};
use crate::error::FlashError;
use crate::prepared::PreparedLaunch;
use crate::variant::ParamArg;

/// The inputs of an fp8 forward.
pub struct Fp8Inputs<'a> {
    /// Q codes `[batch, seq_q, heads_q, d]` (strided, one byte each; d 64, 128 or 256; int8
    /// codes for a `qk: int8` variant, e4m3 otherwise). Bytes carry no format: codes of the
    /// other format are read without an error and give wrong scores, so quantise with the
    /// variant's `qk` (`QuantSpec::format`, `flash quantize --format`).
    pub q: TensorRef<'a>,
    /// Q's scales, f32, contiguous, grouped as the variant's `scales:` declares: `[batch,
    /// heads_q, ceil(seq_q / 128)]` (`per_block(128)`, the default), `[batch, heads_q]`
    /// (`per_head`) or one value (`per_tensor`).
    pub q_scale: &'a CudaSlice<f32>,
    /// K codes `[batch, seq_k, heads_kv, d]` (strided; the format of Q's).
    pub k: TensorRef<'a>,
    /// K's scales, grouped as Q's (`[batch, heads_kv, ceil(seq_k / 128)]` per block).
    pub k_scale: &'a CudaSlice<f32>,
    /// V: e4m3 codes with scales, or bf16 for a `v: bf16` variant.
    pub v: Fp8V<'a>,
}

/// V of an fp8 forward.
pub enum Fp8V<'a> {
    /// e4m3 codes and their scales.
    Codes {
        /// V's codes transposed, `[batch, heads_kv, d, seq_padded]` contiguous with `seq_padded
        /// = ceil(seq_k / 128) · 128` and the keys of each group of 32 in
        /// `flash_dsl::fp8::mma_key_order` (a transposing [`Runtime::quantize`] writes exactly
        /// this).
        v_t: &'a CudaSlice<u8>,
        /// V's scales, grouped as Q's, or as the variant's `v_scales:` declares (`per_channel`:
        /// `[batch, heads_kv, d]`).
        v_scale: &'a CudaSlice<f32>,
    },
    /// e4m3 codes in rows, `[batch, seq_k, heads_kv, d]` (strided, as K's: a non-transposing
    /// [`Runtime::quantize`] writes them), for a `v_layout: rows` variant, whose kernel
    /// transposes them in shared memory.
    Rows {
        /// V's codes.
        v: TensorRef<'a>,
        /// V's scales, grouped as Q's or as `v_scales:` declares (see [`Fp8V::Codes`]).
        v_scale: &'a CudaSlice<f32>,
    },
    /// bf16 `[batch, seq_k, heads_kv, d]` (strided), as the bf16 forward reads it (`v: bf16`).
    Bf16(TensorRef<'a>),
}

impl Runtime {
    /// Runs an fp8 forward (`kernel` from [`Runtime::load`] of a `dtype: e4m3` variant): O
    /// (`[batch, seq_q, heads_q, d]`, bf16) and the LSE from codes and scales. Checked like
    /// every launch — shapes, strides, buffer lengths (the scales' and Vᵀ's from `seq_q`,
    /// `seq_k`), devices — and asynchronous.
    pub fn forward_fp8(
        &self,
        kernel: &LoadedKernel,
        x: &Fp8Inputs<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
    ) -> Result<(), FlashError> {
        let mut owned = None;
        let launch = self.prepare_fp8(kernel, x, o, lse, params, &mut owned)?;
        self.launch_checked(&launch)
    }

    /// Median milliseconds of one [`Runtime::forward_fp8`] launch, timed with CUDA events after
    /// `warmup` untimed launches (a block map is built once, before them).
    #[allow(clippy::too_many_arguments)]
    pub fn time_forward_fp8(
        &self,
        kernel: &LoadedKernel,
        x: &Fp8Inputs<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        warmup: usize,
        iters: usize,
    ) -> Result<f32, FlashError> {
        let mut owned = None;
        let launch = self.prepare_fp8(kernel, x, o, lse, params, &mut owned)?;
        self.time_launches(std::slice::from_ref(&launch), warmup, iters, None)
    }

    fn prepare_fp8<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        x: &Fp8Inputs<'_>,
        o: &TensorMut<'_>,
        lse: &LseMut<'_>,
        params: &[ParamArg<'_>],
        owned: &mut Option<BlockMap>,
    ) -> Result<PreparedLaunch<'a>, FlashError> {
        if kernel.plan.spec.fp8.is_none() {
            return Err(invalid(format!(
                "kernel `{}` is not an fp8 kernel; its variant does not declare `dtype: e4m3` (use Runtime::forward)",
                kernel.plan.kernel_name
            )));
        }
        let stream = self.stream();
        let [b, sk, hkv, d] = x.k.desc.shape;
        let block = FP8_SCALE_BLOCK as usize;
        let (blocks_q, blocks_k) = (x.q.desc.shape[1].div_ceil(block), sk.div_ceil(block));
        let sp = blocks_k * block;
        let f = kernel.plan.spec.fp8.expect("checked above");
        let codes_view;
        let name = &kernel.plan.kernel_name;
        let v = match (&x.v, f.v_bf16, f.v_rows) {
            (Fp8V::Codes { v_t, .. }, false, false) => {
                // Vᵀ as the kernel's `[batch, d, heads_kv, seq_padded]` view of the quantiser's
                // `[batch, heads_kv, d, seq_padded]`.
                codes_view = TensorRef::strided(
                    v_t,
                    [b, d, hkv, sp],
                    [(hkv * d * sp) as i64, sp as i64, (d * sp) as i64, 1],
                    stream,
                );
                &codes_view
            }
            (Fp8V::Rows { v, .. }, false, true) | (Fp8V::Bf16(v), true, _) => v,
            (_, true, _) => {
                return Err(invalid(format!(
                    "kernel `{name}` reads V in bf16 (its variant declares `v: bf16`); pass Fp8V::Bf16"
                )))
            }
            (_, false, true) => {
                return Err(invalid(format!(
                    "kernel `{name}` reads V's e4m3 codes in rows, [batch, seq_k, heads_kv, d] (its variant declares `v_layout: rows`); pass Fp8V::Rows"
                )))
            }
            (_, false, false) => {
                return Err(invalid(format!(
                    "kernel `{name}` reads V's e4m3 codes transposed, [batch, heads_kv, d, seq_padded]; pass Fp8V::Codes (`v_layout: rows` takes them in rows, `v: bf16` a bf16 V)"
                )))
            }
        };
        let mut ops: Vec<OperandArg> = vec![
            (&x.q.desc).into(),
            (&x.k.desc).into(),
            (&v.desc).into(),
            (&o.desc).into(),
            lse.into(),
            tensor::flat_operand(x.q_scale, stream),
            tensor::flat_operand(x.k_scale, stream),
        ];
        if let Fp8V::Codes { v_scale, .. } | Fp8V::Rows { v_scale, .. } = &x.v {
            ops.push(tensor::flat_operand(v_scale, stream));
        }
        if kernel
            .plan
            .operand(flash_dsl::plan::forward::SCHED_OPERAND)
            .is_some()
        {
            ops.push(self.sched_operand()?);
        }
        let shape = ProblemShape::of(&x.q, &x.k);
        if let Some(m) = self.map_operand(&kernel.plan, shape, params, None, owned)? {
            ops.push(m);
        }
        let preset = [
            (Extent::ScaleBlocksQ, blocks_q),
            (Extent::ScaleBlocks, blocks_k),
            (Extent::SeqPadded, sp),
        ];
        self.prepare_with(kernel, &ops, params, &[], &preset)
    }
}
