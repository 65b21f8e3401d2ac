//! FP8 block quantisation on the GPU (see `flash_dsl::plan::quantize`): a bf16/f16 tensor into
//! fp8 codes and one f32 scale per block of rows of each (batch, head), optionally rotated first.
//! Usable alone (to fill an fp8 KV cache, or to check the kernel against `flash_dsl::fp8`).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtrMut};
use flash_dsl::plan::quantize::{plan_quantize, QuantSpec};
use flash_dsl::plan::{Extent, KernelKind};

use super::tensor::{self, ElemType, OperandArg, TensorRef};
use super::{LoadedKernel, Runtime};
use crate::error::FlashError;
use crate::prepared::PreparedLaunch;

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
    /// blocks · block_rows]` in `flash_dsl::fp8::mma_key_order`) and `scales` (`[batch, heads,
    /// blocks]` f32, `blocks = ceil(seq / block_rows)`), through `kernel` from [`Runtime::load_quantize`]; `signs` (`[d]`, ±1)
    /// is the rotation's diagonal when the kernel rotates. Checked like every launch (shapes,
    /// strides, buffer lengths, devices); asynchronous.
    pub fn quantize(
        &self,
        kernel: &LoadedKernel,
        x: &TensorRef<'_>,
        signs: Option<&CudaSlice<f32>>,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
    ) -> Result<(), FlashError> {
        let launch = self.prepare_quantize(kernel, x, signs, codes, scales)?;
        self.launch_checked(&launch)
    }

    /// Median milliseconds of one [`Runtime::quantize`] launch, timed with CUDA events after
    /// `warmup` untimed launches (the arguments are checked once).
    pub fn time_quantize(
        &self,
        kernel: &LoadedKernel,
        x: &TensorRef<'_>,
        signs: Option<&CudaSlice<f32>>,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
        (warmup, iters): (usize, usize),
    ) -> Result<f32, FlashError> {
        let launch = self.prepare_quantize(kernel, x, signs, codes, scales)?;
        self.time_launches(std::slice::from_ref(&launch), warmup, iters, None)
    }

    fn prepare_quantize<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        x: &TensorRef<'_>,
        signs: Option<&CudaSlice<f32>>,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<f32>,
    ) -> Result<PreparedLaunch<'a>, FlashError> {
        let q = kernel.plan.quant.ok_or_else(|| {
            super::check::invalid(format!(
                "kernel `{}` is not a quantisation kernel; load it with Runtime::load_quantize",
                kernel.plan.kernel_name
            ))
        })?;
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
        let (n_codes, n_scales) = (codes.len(), scales.len());
        let (cp, _c) = codes.device_ptr_mut(stream);
        let (sp, _s) = scales.device_ptr_mut(stream);
        let mut ops = vec![
            OperandArg::from(&x.desc),
            OperandArg::flat(cp, n_codes, ElemType::U8, me),
            OperandArg::flat(sp, n_scales, ElemType::F32, me),
        ];
        if let Some(sg) = signs {
            ops.push(tensor::flat_operand(sg, stream));
        }
        let blocks = x.desc.shape[1].div_ceil(q.block_rows as usize);
        let preset = [
            (Extent::ScaleBlocks, blocks),
            (Extent::SeqPadded, blocks * q.block_rows as usize),
        ];
        self.prepare_with(kernel, &ops, &[], &[], &preset)
    }
}
