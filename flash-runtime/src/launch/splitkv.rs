//! The split-KV pass for inference shapes (see `flash_dsl::plan::splitkv`): the attention
//! kernel over (batch, KV head, packed row tile, split) blocks, then the combine kernel when
//! there is more than one split. The runtime picks the split count from the shape and the GPU,
//! and keeps the splits' fp32 partials in a workspace it owns and reuses.

use std::sync::Arc;

use flash_dsl::plan::splitkv::{
    choose_splits, default_splitkv_config, splitkv_pipeline, splitkv_unsupported, SplitShape,
    MAX_SPLITS,
};
use flash_dsl::plan::{Extent, KernelKind};
use flash_dsl::{TileConfig, VariantSpec};

use super::check::invalid;
use super::tensor::{self, ElemType, LseMut, OperandArg, TensorMut, TensorRef};
use super::{driver, forward_operands, LoadedKernel, ProblemShape, Runtime};
use crate::error::FlashError;
use crate::prepared::PreparedLaunch;
use crate::variant::ParamArg;

/// Packed (query, head) rows per KV head up to which [`Runtime::forward_spec`] takes the
/// split-KV path: decode and speculative decode (G · seq_q ≤ 64, e.g. 4 query tokens at GQA
/// 16). Above it every row tile re-reads the keys, and the forward kernel's larger query tiles
/// win.
pub const SPLITKV_MAX_ROWS: usize = 64;

/// The loaded kernels of a split-KV pass.
#[derive(Clone)]
pub struct SplitKvKernels {
    /// The attention kernel.
    pub attention: Arc<LoadedKernel>,
    /// The combine kernel.
    pub combine: Arc<LoadedKernel>,
}

impl Runtime {
    /// Whether [`Runtime::forward_spec`] runs `spec` at `shape` through the split-KV pass: the
    /// variant has one ([`splitkv_unsupported`]) and the packed rows of a KV head are at most
    /// [`SPLITKV_MAX_ROWS`].
    pub fn takes_split_kv(&self, spec: &VariantSpec, shape: ProblemShape) -> bool {
        splitkv_unsupported(spec).is_none()
            && shape.heads_kv > 0
            && shape.heads_q.is_multiple_of(shape.heads_kv)
            && shape.seq_q > 0
            && shape.heads_q / shape.heads_kv * shape.seq_q <= SPLITKV_MAX_ROWS
    }

    /// Loads (memoised) the split-KV attention and combine kernels of `spec`.
    pub fn load_split_kv(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
    ) -> Result<SplitKvKernels, FlashError> {
        let cfg = config.unwrap_or_else(|| default_splitkv_config(spec));
        self.require_family(&cfg)?;
        let pipe = || splitkv_pipeline(spec, cfg).map_err(|e| FlashError::plan(&spec.name, e));
        let attention = self.load_kind((KernelKind::SplitKv, false), spec, Some(cfg), || {
            Ok(pipe()?.kernels.remove(0))
        })?;
        let combine = self.load_kind((KernelKind::Combine, false), spec, None, || {
            Ok(pipe()?.kernels.remove(1))
        })?;
        Ok(SplitKvKernels { attention, combine })
    }

    /// The split count [`Runtime::forward_split_kv`] uses for `shape` with `kernel`, by
    /// [`choose_splits`] with the blocks of it that fit on one SM (shared memory, threads and
    /// registers).
    pub fn split_kv_splits(&self, kernel: &LoadedKernel, shape: ProblemShape) -> usize {
        let p = &kernel.plan;
        let threads = p.threads().max(1) as usize;
        let regs = kernel.compiled.resources.registers.max(1) as usize;
        // Shared memory per SM on sm_80/sm_90 is the opt-in block limit plus the 1 KiB the
        // driver reserves per block.
        let smem_sm = self.info.max_smem_optin as usize + 1024;
        let smem =
            (p.smem_bytes() as usize + kernel.compiled.resources.smem_static as usize + 1024)
                .max(1);
        let per_sm = (smem_sm / smem)
            .min(2048 / threads)
            .min(65536 / (regs * threads))
            .max(1);
        let s = SplitShape {
            batch: shape.batch,
            heads_q: shape.heads_q,
            heads_kv: shape.heads_kv,
            seq_q: shape.seq_q,
            seq_k: shape.seq_k,
        };
        choose_splits(&s, &p.config, self.info.sm_count as usize, per_sm)
    }

    /// Attention through the split-KV pass: the same contract as [`Runtime::forward`] (Q, K, V
    /// `[batch, seq, heads, d]` strided, O strided, the LSE `[batch, heads_q, seq_q]`), the same
    /// checks, and the variant's params. Returns the split count used.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_split_kv(
        &self,
        kernels: &SplitKvKernels,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
    ) -> Result<usize, FlashError> {
        let (launches, n) = self.prepare_split_kv(kernels, q, k, v, o, lse, params, splits)?;
        for l in &launches {
            self.launch_checked(l)?;
        }
        Ok(n)
    }

    /// The checked launches of a split-KV pass (the combine only with several splits) and the
    /// split count.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prepare_split_kv<'a>(
        &'a self,
        kernels: &'a SplitKvKernels,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &TensorMut<'_>,
        lse: &LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
    ) -> Result<(Vec<PreparedLaunch<'a>>, usize), FlashError> {
        let shape = ProblemShape::of(q, k);
        let n = match splits {
            Some(s) if s == 0 || s > MAX_SPLITS => {
                return Err(invalid(format!(
                    "splits is {s}; the split-KV pass takes 1 to {MAX_SPLITS}"
                )))
            }
            Some(s) => s,
            None => self.split_kv_splits(&kernels.attention, shape),
        };
        let dv = kernels.attention.plan.spec.head_dim_v as usize;
        let rows = shape.batch * shape.heads_q * shape.seq_q;
        let (o_len, l_len) = if n > 1 {
            (n * rows * dv, n * rows)
        } else {
            (0, 0)
        };
        let base = self.split_kv_workspace(o_len + l_len)?;
        let me = tensor::ctx_id(self.context());
        let part = |off: usize, len: usize| {
            OperandArg::flat(base + 4 * off as u64, len, ElemType::F32, me)
        };
        let mut ops = forward_operands(q, k, v, o, lse).to_vec();
        ops.push(part(0, o_len));
        ops.push(part(o_len, l_len));
        // One split binds `splits` to 0: the partial workspaces are then empty (the kernel
        // writes O and the LSE itself), so nothing is allocated or checked for them.
        let preset = [(Extent::Splits, if n > 1 { n } else { 0 })];
        let attention = self.prepare_with(&kernels.attention, &ops, params, &[], &preset)?;
        let mut launches = vec![attention];
        if n > 1 {
            let comb = [
                part(0, o_len),
                part(o_len, l_len),
                (&o.desc).into(),
                lse.into(),
            ];
            launches.push(self.prepare_with(&kernels.combine, &comb, &[], &[], &preset)?);
        }
        Ok((launches, n))
    }

    /// The device address of the split-KV workspace, grown (never shrunk) to at least `len`
    /// f32 elements. Launches are ordered on the runtime's one stream, and a replaced buffer is
    /// freed in stream order, so a kernel still reading the old one is unaffected.
    fn split_kv_workspace(&self, len: usize) -> Result<u64, FlashError> {
        let mut slot = self.split_ws.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_none_or(|b| b.len() < len.max(1)) {
            *slot = Some(
                self.stream()
                    .alloc_zeros::<f32>(len.max(1))
                    .map_err(|e| driver("allocating the split-KV workspace", e))?,
            );
        }
        let buf = slot.as_mut().expect("just allocated");
        let (ptr, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(buf, self.stream());
        Ok(ptr)
    }

    /// Median milliseconds of one split-KV pass (attention and, with several splits, combine),
    /// timed like [`Runtime::time_forward`], with the L2 cache flushed (a 256 MiB memset)
    /// before every timed round when `flush_l2`: decode reads each byte of K and V once, so a
    /// cache warmed by the previous round would time a workload no model runs. Returns it with
    /// the split count.
    #[allow(clippy::too_many_arguments)]
    pub fn time_split_kv(
        &self,
        kernels: &SplitKvKernels,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
        (warmup, iters, flush_l2): (usize, usize, bool),
    ) -> Result<(f32, usize), FlashError> {
        let (launches, n) = self.prepare_split_kv(kernels, q, k, v, o, lse, params, splits)?;
        let mut flush = if flush_l2 {
            Some(
                self.stream()
                    .alloc_zeros::<u8>(256 << 20)
                    .map_err(|e| driver("allocating the L2 flush buffer", e))?,
            )
        } else {
            None
        };
        Ok((
            self.time_launches(&launches, warmup, iters, flush.as_mut())?,
            n,
        ))
    }
}
