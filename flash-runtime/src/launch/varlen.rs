//! Packed (variable-length) batches (see `flash_dsl::plan::varlen`): sequences of different
//! lengths stored back to back, found through cumulative offsets, run by the forward skeletons of
//! every family in one launch.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use flash_dsl::plan::varlen::{check_cu_seqlens, plan_varlen};
use flash_dsl::plan::{default_config_for, Extent, KernelKind};
use flash_dsl::{TileConfig, VariantSpec};

use super::check::invalid;
use super::tensor::{self, LseMut, TensorMut, TensorRef};
use super::{forward_operands, LoadedKernel, Runtime};
use crate::error::FlashError;
use crate::prepared::PreparedLaunch;
use crate::variant::ParamArg;

/// The offsets of a packed batch for [`Runtime::forward_varlen`]: sequence `b` owns query rows
/// `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` of the packed Q and O and key rows
/// `cu_seqlens_k[b] .. cu_seqlens_k[b + 1]` of the packed K and V. Each array has `batch + 1`
/// non-decreasing i32 entries from 0 to the tensors' token counts; a sequence may be empty.
///
/// The kernel reads the device copies; the launch checks the host copies (which must hold the
/// same values) and takes the longest sequences from them. Offsets that disagree with their host
/// copy still never make the kernel read or write outside the packed tensors (it clamps them),
/// but give wrong rows.
pub struct VarlenBatch<'a> {
    /// Query offsets on the device, `[batch + 1]`.
    pub cu_seqlens_q: &'a CudaSlice<i32>,
    /// Key offsets on the device, `[batch + 1]`.
    pub cu_seqlens_k: &'a CudaSlice<i32>,
    /// The host copy of `cu_seqlens_q`.
    pub host_q: &'a [i32],
    /// The host copy of `cu_seqlens_k`.
    pub host_k: &'a [i32],
}

/// The launch sizes of a packed batch, from its checked host offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VarlenShape {
    /// Sequences.
    pub batch: usize,
    /// The longest query sequence.
    pub max_seq_q: usize,
    /// The longest key sequence.
    pub max_seq_k: usize,
}

impl VarlenBatch<'_> {
    /// Checks the host offsets against the packed tensors' token counts and returns the
    /// launch's sizes; errors name the offending entry.
    pub fn check(&self, total_q: usize, total_k: usize) -> Result<VarlenShape, FlashError> {
        if self.host_q.len() != self.host_k.len() {
            return Err(invalid(format!(
                "cu_seqlens_q has {} entries and cu_seqlens_k {}; both are batch + 1 long",
                self.host_q.len(),
                self.host_k.len()
            )));
        }
        let max_seq_q = check_cu_seqlens("cu_seqlens_q", self.host_q, total_q).map_err(invalid)?;
        let max_seq_k = check_cu_seqlens("cu_seqlens_k", self.host_k, total_k).map_err(invalid)?;
        for (name, dev) in [
            ("cu_seqlens_q", self.cu_seqlens_q),
            ("cu_seqlens_k", self.cu_seqlens_k),
        ] {
            if dev.len() < self.host_q.len() {
                return Err(invalid(format!(
                    "the device {name} has {} entries; its host copy has {}",
                    dev.len(),
                    self.host_q.len()
                )));
            }
        }
        Ok(VarlenShape {
            batch: self.host_q.len() - 1,
            max_seq_q,
            max_seq_k,
        })
    }
}

impl Runtime {
    /// Loads (memoised) the packed forward kernel of `spec` with `config` (default: the forward's
    /// default tile on this GPU's fastest family).
    pub fn load_varlen(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        let cfg = config.unwrap_or_else(|| default_config_for(spec, self.info.default_family));
        self.require_family(&cfg)?;
        self.load_kind((KernelKind::ForwardVarlen, false), spec, Some(cfg), || {
            plan_varlen(spec, cfg).map_err(|e| FlashError::plan(&spec.name, e))
        })
    }

    /// Attention over a packed batch: Q `[1, total_q, heads_q, d]`, K and V `[1, total_k,
    /// heads_kv, d]`, O like Q (all strided, as [`Runtime::forward`] takes them), the LSE
    /// `[1, heads_q, total_q]` f32, and the batch's offsets. Masks and scores see each sequence's
    /// own positions and lengths, `b` its index; tensor params over `seq` positions are sized by
    /// the longest sequence. The same checks as [`Runtime::forward`], plus the offsets'.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        seqs: &VarlenBatch<'_>,
        params: &[ParamArg<'_>],
    ) -> Result<(), FlashError> {
        let launch = self.prepare_varlen(kernel, q, k, v, o, lse, seqs, params)?;
        self.launch_checked(&launch)
    }

    /// [`Runtime::forward_varlen`] for an `attention!`-declared variant (the spec parsed once,
    /// the params from `V::param_args`), on the default kernel.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen_variant<V: crate::variant::Variant>(
        &self,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        seqs: &VarlenBatch<'_>,
        params: &V::Params<'_>,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        let spec = self.variant_spec::<V>()?;
        let args = V::param_args(params, self.stream());
        let kernel = self.load_varlen(&spec, None)?;
        self.forward_varlen(&kernel, q, k, v, o, lse, seqs, &args)?;
        Ok(kernel)
    }

    /// Median milliseconds of one [`Runtime::forward_varlen`] launch, timed with CUDA events
    /// after `warmup` untimed launches (the arguments are checked once).
    #[allow(clippy::too_many_arguments)]
    pub fn time_varlen(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        seqs: &VarlenBatch<'_>,
        params: &[ParamArg<'_>],
        (warmup, iters): (usize, usize),
    ) -> Result<f32, FlashError> {
        let launch = self.prepare_varlen(kernel, q, k, v, o, lse, seqs, params)?;
        self.time_launches(std::slice::from_ref(&launch), warmup, iters, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn prepare_varlen<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &TensorMut<'_>,
        lse: &LseMut<'_>,
        seqs: &VarlenBatch<'_>,
        params: &[ParamArg<'_>],
    ) -> Result<PreparedLaunch<'a>, FlashError> {
        if kernel.plan.kind != KernelKind::ForwardVarlen {
            return Err(invalid(format!(
                "kernel `{}` is not a packed (variable-length) kernel; load it with Runtime::load_varlen",
                kernel.plan.kernel_name
            )));
        }
        for (name, shape) in [
            ("q", q.desc.shape),
            ("k", k.desc.shape),
            ("v", v.desc.shape),
            ("o", o.desc.shape),
        ] {
            if shape[0] != 1 {
                return Err(invalid(format!(
                    "{name} has shape {shape:?}; a packed batch stores every sequence back to back in one [1, total, heads, d] tensor"
                )));
            }
        }
        let s = seqs.check(q.desc.shape[1], k.desc.shape[1])?;
        let mut ops = forward_operands(q, k, v, o, lse).to_vec();
        ops.push(tensor::flat_operand(seqs.cu_seqlens_q, self.stream()));
        ops.push(tensor::flat_operand(seqs.cu_seqlens_k, self.stream()));
        if kernel
            .plan
            .operand(flash_dsl::plan::forward::SCHED_OPERAND)
            .is_some()
        {
            ops.push(self.sched_operand()?);
        }
        let preset = [
            (Extent::Batch, s.batch),
            (Extent::SeqQ, s.max_seq_q),
            (Extent::SeqK, s.max_seq_k),
            (Extent::CuLen, s.batch + 1),
        ];
        self.prepare_with(kernel, &ops, params, &[], &preset)
    }
}
