//! The split-KV pass for inference shapes (see `flash_dsl::plan::splitkv`): one kernel over
//! (batch, KV head, packed row tile, split) blocks, the last split of each row tile merging the
//! others. The runtime picks the split count from the shape and the GPU, and keeps the splits'
//! fp32 partials and the row tiles' arrival counters in workspaces it owns and reuses.

use std::sync::Arc;

use flash_dsl::plan::splitkv::{
    choose_splits, default_splitkv_config, plan_splitkv, splitkv_unsupported, SplitShape,
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

    /// Loads (memoised) the split-KV kernel of `spec` with `config` (default:
    /// [`default_splitkv_config`]).
    pub fn load_split_kv(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        let cfg = config.unwrap_or_else(|| default_splitkv_config(spec));
        self.require_family(&cfg)?;
        self.load_kind((KernelKind::SplitKv, false), spec, Some(cfg), || {
            plan_splitkv(spec, cfg).map_err(|e| FlashError::plan(&spec.name, e))
        })
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
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
    ) -> Result<usize, FlashError> {
        let (launch, n) = self.prepare_split_kv(kernel, q, k, v, o, lse, params, splits)?;
        self.launch_checked(&launch)?;
        Ok(n)
    }

    /// The checked launch of a split-KV pass and its split count.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prepare_split_kv<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &TensorMut<'_>,
        lse: &LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
    ) -> Result<(PreparedLaunch<'a>, usize), FlashError> {
        let shape = ProblemShape::of(q, k);
        let n = match splits {
            Some(s) if s == 0 || s > MAX_SPLITS => {
                return Err(invalid(format!(
                    "splits is {s}; the split-KV pass takes 1 to {MAX_SPLITS}"
                )))
            }
            Some(s) => s,
            None => self.split_kv_splits(kernel, shape),
        };
        let dv = kernel.plan.spec.head_dim_v as usize;
        let rows = shape.batch * shape.heads_q * shape.seq_q;
        let (o_len, l_len) = if n > 1 {
            (n * rows * dv, n * rows)
        } else {
            (0, 0)
        };
        let (base, sem) = self.split_kv_workspace(o_len + l_len, rows)?;
        let me = tensor::ctx_id(self.context());
        let part = |off: usize, len: usize| {
            OperandArg::flat(base + 4 * off as u64, len, ElemType::F32, me)
        };
        let mut ops = forward_operands(q, k, v, o, lse).to_vec();
        ops.push(part(0, o_len));
        ops.push(part(o_len, l_len));
        ops.push(OperandArg::flat(sem, rows, ElemType::I32, me));
        // One split binds `splits` to 0: the partial workspaces are then empty (the kernel
        // writes O and the LSE itself), so nothing is allocated or checked for them.
        let preset = [(Extent::Splits, if n > 1 { n } else { 0 })];
        let launch = self.prepare_with(kernel, &ops, params, &[], &preset)?;
        Ok((launch, n))
    }

    /// The device addresses of the split-KV workspaces, grown (never shrunk): at least
    /// `partials` f32 elements, and `sems` i32 arrival counters, zeroed when allocated and left
    /// at zero by every launch. Launches are ordered on the runtime's one stream, and a replaced
    /// buffer is freed in stream order, so a kernel still using the old one is unaffected.
    fn split_kv_workspace(&self, partials: usize, sems: usize) -> Result<(u64, u64), FlashError> {
        let mut slot = self.split_ws.lock().unwrap_or_else(|e| e.into_inner());
        let (parts, counters) = &mut *slot;
        if parts.as_ref().is_none_or(|b| b.len() < partials.max(1)) {
            *parts = Some(
                self.stream()
                    .alloc_zeros::<f32>(partials.max(1))
                    .map_err(|e| driver("allocating the split-KV partials", e))?,
            );
        }
        if counters.as_ref().is_none_or(|b| b.len() < sems.max(1)) {
            *counters = Some(
                self.stream()
                    .alloc_zeros::<i32>(sems.max(1))
                    .map_err(|e| driver("allocating the split-KV counters", e))?,
            );
        }
        let s = self.stream();
        let p = parts.as_mut().expect("just allocated");
        let (pp, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(p, s);
        let c = counters.as_mut().expect("just allocated");
        let (cp, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(c, s);
        Ok((pp, cp))
    }

    /// Median milliseconds of one split-KV pass, timed like [`Runtime::time_forward`], with the L2 cache flushed (a 256 MiB memset)
    /// before every timed round when `flush_l2`: decode reads each byte of K and V once, so a
    /// cache warmed by the previous round would time a workload no model runs. Returns it with
    /// the split count.
    #[allow(clippy::too_many_arguments)]
    pub fn time_split_kv(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
        (warmup, iters, flush_l2): (usize, usize, bool),
    ) -> Result<(f32, usize), FlashError> {
        let (launch, n) = self.prepare_split_kv(kernel, q, k, v, o, lse, params, splits)?;
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
            self.time_launches(std::slice::from_ref(&launch), warmup, iters, flush.as_mut())?,
            n,
        ))
    }
}
