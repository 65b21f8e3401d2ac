//! FP8 quantisation on the GPU (see `flash_dsl::plan::quantize`): a bf16/f16 tensor into fp8
//! codes and f32 scales — one per block of rows of each (batch, head), per (batch, head), per
//! tensor, or per channel of each (batch, head) — optionally rotated first.
//! Usable alone (to fill an fp8 KV cache, or to check the kernel against `flash_dsl::fp8`).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtrMut};
use flash_dsl::plan::quantize::{plan_quantize, QuantSpec};
use flash_dsl::plan::{Extent, KernelKind};

use super::tensor::{self, ElemType, OperandArg, TensorRef};
use super::{LoadedKernel, Runtime};
use crate::error::FlashError;
use crate::prepared::PreparedLaunch;

/// A first pass: its kernel and the scratch it fills (block amaxes of a per-head or per-tensor
/// quantisation, or block column sums of a smoothing one).
type Pass = (Arc<LoadedKernel>, CudaSlice<f32>);

/// The passes before the encoding kernel: K's column sums and then their means (smoothing; the
/// means kernel works in the sums' scratch), then the block amaxes (one scale per head or
/// tensor), or the blocks' column amaxes and then each column's largest (per channel; the
/// reduce kernel works in the amaxes' scratch).
#[derive(Default)]
struct FirstPasses {
    sum: Option<(Pass, Arc<LoadedKernel>)>,
    amax: Option<Pass>,
    reduce: Option<Arc<LoadedKernel>>,
}

impl Runtime {
    /// Loads (memoised) the quantisation kernel of `q`. Errors: the plan's rules (block rows,
    /// head dim, a power of two for the rotation), NVRTC's, the driver's.
    pub fn load_quantize(&self, q: &QuantSpec) -> Result<Arc<LoadedKernel>, FlashError> {
        let plan = plan_quantize(q).map_err(|e| FlashError::plan("quantize", e))?;
        self.require_family(&plan.config)?;
        let spec = plan.spec.clone();
        self.load_kind(
            (KernelKind::Quantize, false),
            &spec,
            Some(plan.config),
            || Ok(plan),
        )
    }

    /// Quantises `x` (`[batch, seq, heads, d]`, strided, the kernel's input dtype) into `codes`
    /// (the same shape, row-major, one byte each; for a transposing kernel `[batch, heads, d,
    /// blocks · block_rows]` in `flash_dsl::fp8::mma_key_order`) and `scales` (f32: `[batch,
    /// heads, blocks]` with `blocks = ceil(seq / block_rows)`, `[batch, heads]` for per-head
    /// scales, one value for per-tensor ones, `[batch, heads, d]` per channel), through `kernel`
    /// from [`Runtime::load_quantize`]; `signs` (`[d]`, ±1) is the rotation's diagonal when the
    /// kernel rotates. Per-head and per-tensor scales take two launches (block amaxes into
    /// scratch, then the codes), per-channel ones three (the blocks' column amaxes, each
    /// column's largest, the codes), and a smoothing kernel (`QuantSpec::smooth`, K only) one
    /// more before them (column sums). Checked like every launch (shapes, strides, buffer
    /// lengths, devices); asynchronous.
    pub fn quantize(
        &self,
        kernel: &LoadedKernel,
        x: &TensorRef<'_>,
        signs: Option<&CudaSlice<f32>>,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
    ) -> Result<(), FlashError> {
        let mut first = self.first_passes(kernel, x)?;
        let launches = self.prepare_quantize(kernel, &mut first, x, signs, codes, scales)?;
        for l in &launches {
            self.launch_checked(l)?;
        }
        Ok(())
    }

    /// Median milliseconds of one [`Runtime::quantize`] (every launch of a multi-pass one),
    /// timed with CUDA events after `warmup` untimed runs (the arguments are checked once).
    pub fn time_quantize(
        &self,
        kernel: &LoadedKernel,
        x: &TensorRef<'_>,
        signs: Option<&CudaSlice<f32>>,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
        (warmup, iters): (usize, usize),
    ) -> Result<f32, FlashError> {
        let mut first = self.first_passes(kernel, x)?;
        let launches = self.prepare_quantize(kernel, &mut first, x, signs, codes, scales)?;
        self.time_launches(&launches, warmup, iters, None)
    }

    /// The first-pass kernels and their scratch where `kernel` smooths (column sums, `[batch,
    /// heads, blocks, d]`) or scales per head or tensor (block amaxes, `[batch, heads,
    /// blocks]`) or per channel (column amaxes, `[batch, heads, blocks, d]`); each is written in
    /// full by its pass before a later one reads it.
    fn first_passes(
        &self,
        kernel: &LoadedKernel,
        x: &TensorRef<'_>,
    ) -> Result<FirstPasses, FlashError> {
        let Some(q) = kernel.plan.quant else {
            return Ok(FirstPasses::default());
        };
        let [b, s, h, d] = x.desc.shape;
        let blocks = b * h * s.div_ceil(q.block_rows as usize);
        let scratch = |n: usize, what: &str| {
            crate::ffi::alloc_scratch_f32(self.stream(), n.max(1))
                .map_err(|e| super::driver(&format!("allocating the {what}"), e))
        };
        let mut passes = FirstPasses::default();
        if let (Some(first), Some(means)) = (q.sum_pass(), q.mean_pass()) {
            passes.sum = Some((
                (
                    self.load_quantize(&first)?,
                    scratch(blocks * d, "column sums")?,
                ),
                self.load_quantize(&means)?,
            ));
        }
        if let Some(first) = q.amax_pass() {
            let per_column = q.reduce_pass().is_some();
            passes.amax = Some((
                self.load_quantize(&first)?,
                if per_column {
                    scratch(blocks * d, "column amaxes")?
                } else {
                    scratch(blocks, "block amaxes")?
                },
            ));
        }
        if let Some(reduce) = q.reduce_pass() {
            passes.reduce = Some(self.load_quantize(&reduce)?);
        }
        Ok(passes)
    }

    fn prepare_quantize<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        first: &'a mut FirstPasses,
        x: &TensorRef<'_>,
        signs: Option<&CudaSlice<f32>>,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
    ) -> Result<Vec<PreparedLaunch<'a>>, FlashError> {
        let q = kernel.plan.quant.ok_or_else(|| {
            super::check::invalid(format!(
                "kernel `{}` is not a quantisation kernel; load it with Runtime::load_quantize",
                kernel.plan.kernel_name
            ))
        })?;
        if q.is_pass() {
            return Err(super::check::invalid(format!(
                "kernel `{}` is a first pass (block or column amaxes, their reduction, column sums or their means) of a multi-pass quantisation; pass the kernel of the quantisation itself",
                kernel.plan.kernel_name
            )));
        }
        match (q.hadamard, signs.is_some()) {
            (true, false) => return Err(super::check::invalid(
                "this quantisation kernel rotates: pass the rotation's signs ([head_dim] f32, ±1)",
            )),
            (false, true) => {
                return Err(super::check::invalid(
                    "this quantisation kernel does not rotate: it takes no signs",
                ))
            }
            _ => {}
        }
        let me = tensor::ctx_id(self.context());
        let stream = self.stream();
        let blocks = x.desc.shape[1].div_ceil(q.block_rows as usize);
        let preset = [
            (Extent::ScaleBlocks, blocks),
            (Extent::SeqPadded, blocks * q.block_rows as usize),
        ];
        let sign_op = signs.map(|sg| tensor::flat_operand(sg, stream));
        let mut launches = Vec::new();
        // Operands in the plans' order: x, [codes, scales], [signs], [amax], [colsum].
        let mut sum_op = None;
        if let Some(((k0, scratch), k_mean)) = first.sum.as_mut() {
            let n = scratch.len();
            let (cp, _c) = scratch.device_ptr_mut(stream);
            let op = OperandArg::flat(cp, n, ElemType::F32, me);
            let ops = vec![OperandArg::from(&x.desc), op.clone()];
            launches.push(self.prepare_with(k0, &ops, &[], &[], &preset)?);
            launches.push(self.prepare_with(k_mean, &ops, &[], &[], &preset)?);
            sum_op = Some(op);
        }
        let mut amax_op = None;
        if let Some((k1, scratch)) = first.amax.as_mut() {
            let n = scratch.len();
            let (ap, _a) = scratch.device_ptr_mut(stream);
            let op = OperandArg::flat(ap, n, ElemType::F32, me);
            let mut ops = vec![OperandArg::from(&x.desc)];
            ops.extend(sign_op.clone());
            ops.push(op.clone());
            ops.extend(sum_op.clone());
            launches.push(self.prepare_with(k1, &ops, &[], &[], &preset)?);
            if let Some(k2) = first.reduce.as_ref() {
                let ops = vec![OperandArg::from(&x.desc), op.clone()];
                launches.push(self.prepare_with(k2, &ops, &[], &[], &preset)?);
            }
            amax_op = Some(op);
        }
        let (n_codes, n_scales) = (codes.len(), scales.len());
        let (cp, _c) = codes.device_ptr_mut(stream);
        let (sp, _s) = scales.device_ptr_mut(stream);
        let mut ops = vec![
            OperandArg::from(&x.desc),
            OperandArg::flat(cp, n_codes, ElemType::U8, me),
            OperandArg::flat(sp, n_scales, ElemType::F32, me),
        ];
        ops.extend(sign_op);
        ops.extend(amax_op);
        ops.extend(sum_op);
        launches.push(self.prepare_with(kernel, &ops, &[], &[], &preset)?);
        Ok(launches)
    }
}
