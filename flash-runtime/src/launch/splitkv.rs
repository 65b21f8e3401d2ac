//! The split-KV pass for inference shapes (see `flash_dsl::plan::splitkv`): one kernel over
//! (batch, KV head, packed row tile, split) blocks, the last split of each row tile merging the
//! others. The runtime picks the split count from the shape and the GPU, and keeps the splits'
//! fp32 partials and the row tiles' arrival counters in workspaces it owns and reuses.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use flash_dsl::plan::splitkv::{
    choose_splits, default_splitkv_config, plan_splitkv, plan_splitkv_paged,
    plan_splitkv_paged_varlen, splitkv_unsupported, SplitShape, MAX_SPLITS,
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

/// A paged KV cache for [`Runtime::forward_paged`]: K and V as `[pages, page_size, heads_kv, d]`
/// (strided, last dimension contiguous), a `[batch, max_pages]` page table and each sequence's
/// cached length, on the device. Key `k` of sequence `b` is row `k % page_size` of page
/// `page_table[b][k / page_size]`; any page size and any page order work.
pub struct PagedKv<'a> {
    /// The K cache, `[pages, page_size, heads_kv, head_dim_qk]`.
    pub k: TensorRef<'a>,
    /// The V cache, `[pages, page_size, heads_kv, head_dim_v]`.
    pub v: TensorRef<'a>,
    /// Page indices, `[batch, max_pages]` row-major; entries past a sequence's last page are
    /// never read.
    pub page_table: &'a CudaSlice<i32>,
    /// Entries per sequence of the page table.
    pub max_pages: usize,
    /// Cached keys per sequence, `[batch]`, each at most `max_pages · page_size`.
    pub seqlens_k: &'a CudaSlice<i32>,
    /// Host copies of the page table and the lengths. When given, the launch checks them: every
    /// length in `[0, max_pages · page_size]`, every page a sequence reads in `[0, pages)`.
    /// Without them the kernel still never reads outside the caches (a page index out of range
    /// reads as zeros, a length is clamped into the capacity), but a bad table gives wrong
    /// results instead of an error.
    pub host: Option<(&'a [i32], &'a [i32])>,
}

impl PagedKv<'_> {
    /// Keys per page.
    pub fn page_size(&self) -> usize {
        self.k.desc.shape[1]
    }

    /// The most keys a sequence can hold: `max_pages · page_size`.
    pub fn capacity(&self) -> usize {
        self.max_pages * self.page_size()
    }

    /// The launch-time checks of the host copies (see [`PagedKv::host`]).
    fn check_host(&self, batch: usize) -> Result<(), FlashError> {
        let Some((table, lens)) = self.host else {
            return Ok(());
        };
        let (pages, ps, cap) = (self.k.desc.shape[0], self.page_size(), self.capacity());
        if table.len() < batch * self.max_pages || lens.len() < batch {
            return Err(invalid(format!(
                "the host page table has {} entries and the lengths {}; batch {batch} with max_pages {} needs {} and {batch}",
                table.len(),
                lens.len(),
                self.max_pages,
                batch * self.max_pages
            )));
        }
        for (b, &len) in lens[..batch].iter().enumerate() {
            if len < 0 || len as usize > cap {
                return Err(invalid(format!(
                    "seqlens_k[{b}] is {len}; it must lie in [0, {cap}] (max_pages {} x page_size {ps})",
                    self.max_pages
                )));
            }
            let used = (len as usize).div_ceil(ps.max(1));
            for (j, &page) in table[b * self.max_pages..][..used].iter().enumerate() {
                if page < 0 || page as usize >= pages {
                    return Err(invalid(format!(
                        "page_table[{b}][{j}] is {page}; sequence {b} reads it ({len} keys) and the caches have {pages} pages"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A chunked prefill's new tokens are the last keys of their sequence's cache, so no sequence
/// may have more of them (`cu_seqlens_q[b + 1] − cu_seqlens_q[b]`) than its cached length
/// `seqlens_k[b]`; the message names the first that does. (The offsets and lengths themselves
/// were checked before.)
pub(crate) fn check_chunk_lengths(cu_seqlens_q: &[i32], seqlens_k: &[i32]) -> Result<(), String> {
    for (b, (w, &len)) in cu_seqlens_q.windows(2).zip(seqlens_k).enumerate() {
        let new = w[1] - w[0];
        if new > len {
            return Err(format!(
                "sequence {b} has {new} new tokens (cu_seqlens_q[{}] - cu_seqlens_q[{b}]) but seqlens_k[{b}] is {len}; the cached length counts the new tokens, so it must be at least {new}",
                b + 1
            ));
        }
    }
    Ok(())
}

/// The queries of a chunked prefill for [`Runtime::forward_paged_varlen`]: sequence `b`'s new
/// tokens are rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` of a packed Q `[1, total_q, heads_q,
/// d]` (`batch + 1` non-decreasing i32 offsets from 0 to `total_q`, on the device and as a host
/// copy, which the launch checks; the kernel clamps the device copy).
pub struct PackedQueries<'a> {
    /// Query offsets on the device, `[batch + 1]`.
    pub cu_seqlens_q: &'a CudaSlice<i32>,
    /// The host copy of `cu_seqlens_q`.
    pub host: &'a [i32],
}

impl Runtime {
    /// Whether [`Runtime::forward_spec`] runs `spec` at `shape` through the split-KV pass: the
    /// variant has one ([`splitkv_unsupported`]), has no dropout (its split-KV kernel applies
    /// none, so a training launch keeps the forward kernel; `forward_split_kv` serves it at
    /// p = 0) and the packed rows of a KV head are at most [`SPLITKV_MAX_ROWS`].
    pub fn takes_split_kv(&self, spec: &VariantSpec, shape: ProblemShape) -> bool {
        splitkv_unsupported(spec).is_none()
            && spec.dropout.is_none()
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

    /// Loads (memoised) the split-KV kernel of `spec` over a paged KV cache.
    pub fn load_paged(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        let cfg = config.unwrap_or_else(|| default_splitkv_config(spec));
        self.require_family(&cfg)?;
        self.load_kind((KernelKind::SplitKvPaged, false), spec, Some(cfg), || {
            plan_splitkv_paged(spec, cfg).map_err(|e| FlashError::plan(&spec.name, e))
        })
    }

    /// Loads (memoised) the split-KV kernel of `spec` over a paged KV cache with packed queries
    /// (chunked prefill).
    pub fn load_paged_varlen(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        let cfg = config.unwrap_or_else(|| default_splitkv_config(spec));
        self.require_family(&cfg)?;
        self.load_kind(
            (KernelKind::SplitKvPagedVarlen, false),
            spec,
            Some(cfg),
            || plan_splitkv_paged_varlen(spec, cfg).map_err(|e| FlashError::plan(&spec.name, e)),
        )
    }

    /// Chunked prefill: packed queries (`[1, total_q, heads_q, d]`, each sequence's new tokens)
    /// against a paged KV cache whose `seqlens_k` already count them, through the split-KV
    /// kernel of [`Runtime::load_paged_varlen`]. O is packed like Q, the LSE `[1, heads_q,
    /// total_q]`. Masks and scores see each sequence's own query count and cached length: a
    /// causal mask puts the queries at the end of the cached keys. Returns the split count used
    /// (chosen for the longest sequence and the cache's capacity unless given).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_paged_varlen(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        queries: &PackedQueries<'_>,
        kv: &PagedKv<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
    ) -> Result<usize, FlashError> {
        let (launch, n) =
            self.prepare_paged(kernel, q, Some(queries), kv, o, lse, params, splits)?;
        self.launch_checked(&launch)?;
        Ok(n)
    }

    /// The checks of packed queries for the paged kernel: the kernel's kind, Q and O packed, the
    /// host offsets against Q's tokens. Returns (batch, the longest sequence's queries).
    fn check_packed_queries(
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        o: &TensorMut<'_>,
        queries: &PackedQueries<'_>,
    ) -> Result<(usize, usize), FlashError> {
        if kernel.plan.kind != KernelKind::SplitKvPagedVarlen {
            return Err(invalid(format!(
                "kernel `{}` is not the paged kernel for packed queries; load it with Runtime::load_paged_varlen",
                kernel.plan.kernel_name
            )));
        }
        for (name, shape) in [("q", q.desc.shape), ("o", o.desc.shape)] {
            if shape[0] != 1 {
                return Err(invalid(format!(
                    "{name} has shape {shape:?}; packed queries are one [1, total_q, heads_q, d] tensor"
                )));
            }
        }
        let max_q = flash_dsl::plan::varlen::check_cu_seqlens(
            "cu_seqlens_q",
            queries.host,
            q.desc.shape[1],
        )
        .map_err(invalid)?;
        if queries.cu_seqlens_q.len() < queries.host.len() {
            return Err(invalid(format!(
                "the device cu_seqlens_q has {} entries; its host copy has {}",
                queries.cu_seqlens_q.len(),
                queries.host.len()
            )));
        }
        Ok((queries.host.len() - 1, max_q))
    }

    /// Attention of Q (`[batch, seq_q, heads_q, d]`) against a paged KV cache, through the
    /// split-KV kernel of [`Runtime::load_paged`]: O and the LSE as [`Runtime::forward`] writes
    /// them, masks and scores seeing each sequence's cached length as `seq_k` (a causal mask is
    /// aligned to it: the last query sees the last cached key). Splits are chosen for the
    /// cache's capacity unless given. Returns the split count used.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_paged(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        kv: &PagedKv<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
    ) -> Result<usize, FlashError> {
        let (launch, n) = self.prepare_paged(kernel, q, None, kv, o, lse, params, splits)?;
        self.launch_checked(&launch)?;
        Ok(n)
    }

    /// [`Runtime::forward_paged`] for an `attention!`-declared variant (the spec parsed once,
    /// the params from `V::param_args`).
    pub fn forward_paged_variant<V: crate::variant::Variant>(
        &self,
        q: &TensorRef<'_>,
        kv: &PagedKv<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &V::Params<'_>,
        splits: Option<usize>,
    ) -> Result<usize, FlashError> {
        let spec = self.variant_spec::<V>()?;
        let args = V::param_args(params, self.stream());
        let kernel = self.load_paged(&spec, None)?;
        self.forward_paged(&kernel, q, kv, o, lse, &args, splits)
    }

    /// [`Runtime::time_split_kv`] for [`Runtime::forward_paged`].
    #[allow(clippy::too_many_arguments)]
    pub fn time_paged(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        kv: &PagedKv<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
        timing: (usize, usize, bool),
    ) -> Result<(f32, usize), FlashError> {
        let prepared = self.prepare_paged(kernel, q, None, kv, o, lse, params, splits)?;
        self.time_prepared(prepared, timing)
    }

    /// The checked launch of a paged split-KV kernel and its split count; with `queries`, Q and O
    /// are packed (chunked prefill).
    #[allow(clippy::too_many_arguments)]
    fn prepare_paged<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        q: &TensorRef<'_>,
        queries: Option<&PackedQueries<'_>>,
        kv: &PagedKv<'_>,
        o: &TensorMut<'_>,
        lse: &LseMut<'_>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
    ) -> Result<(PreparedLaunch<'a>, usize), FlashError> {
        let [b0, s0, heads_q, _] = q.desc.shape;
        let (batch, seq_q) = match queries {
            Some(qs) => Self::check_packed_queries(kernel, q, o, qs)?,
            None => (b0, s0),
        };
        kv.check_host(batch)?;
        if let (Some(qs), Some((_, lens))) = (queries, kv.host) {
            check_chunk_lengths(qs.host, lens).map_err(invalid)?;
        }
        let shape = ProblemShape {
            batch,
            seq_q,
            seq_k: kv.capacity(),
            heads_q,
            heads_kv: kv.k.desc.shape[2],
        };
        let mut ops = forward_operands(q, &kv.k, &kv.v, o, lse).to_vec();
        ops.push(tensor::flat_operand(kv.page_table, self.stream()));
        ops.push(tensor::flat_operand(kv.seqlens_k, self.stream()));
        let mut preset = vec![
            (Extent::MaxPages, kv.max_pages),
            (Extent::SeqK, kv.capacity()),
        ];
        if let Some(qs) = queries {
            ops.push(tensor::flat_operand(qs.cu_seqlens_q, self.stream()));
            preset.extend([
                (Extent::Batch, batch),
                (Extent::SeqQ, seq_q),
                (Extent::CuLen, batch + 1),
            ]);
        }
        // Packed queries: the partials hold heads_q · total_q rows per split.
        let packed_rows = queries.map(|_| heads_q * q.desc.shape[1]);
        self.prepare_splits(kernel, ops, shape, packed_rows, params, splits, &preset)
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
        let ops = forward_operands(q, k, v, o, lse).to_vec();
        self.prepare_splits(
            kernel,
            ops,
            ProblemShape::of(q, k),
            None,
            params,
            splits,
            &[],
        )
    }

    /// The split count, the workspaces and the checked launch of a split-KV kernel, after its
    /// attention operands `ops` (dense or paged).
    #[allow(clippy::too_many_arguments)]
    fn prepare_splits<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        mut ops: Vec<OperandArg>,
        shape: ProblemShape,
        packed_rows: Option<usize>,
        params: &[ParamArg<'_>],
        splits: Option<usize>,
        preset: &[(Extent, usize)],
    ) -> Result<(PreparedLaunch<'a>, usize), FlashError> {
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
        // One split's rows: per (batch, head, query) of the longest sequence, or with packed
        // queries per (head, token); the row tiles' counters stay per (batch, head, query).
        let rows = shape.batch * shape.heads_q * shape.seq_q;
        let part_rows = packed_rows.unwrap_or(rows);
        let (o_len, l_len) = if n > 1 {
            (n * part_rows * dv, n * part_rows)
        } else {
            (0, 0)
        };
        let (base, sem) = self.split_kv_workspace(o_len + l_len, rows)?;
        let me = tensor::ctx_id(self.context());
        let part = |off: usize, len: usize| {
            OperandArg::flat(base + 4 * off as u64, len, ElemType::F32, me)
        };
        ops.push(part(0, o_len));
        ops.push(part(o_len, l_len));
        ops.push(OperandArg::flat(sem, rows, ElemType::I32, me));
        // One split binds `splits` to 0: the partial workspaces are then empty (the kernel
        // writes O and the LSE itself), so nothing is allocated or checked for them.
        let mut preset = preset.to_vec();
        preset.push((Extent::Splits, if n > 1 { n } else { 0 }));
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

    /// Median milliseconds of one split-KV pass, timed like [`Runtime::time_forward`];
    /// `timing` is `(warmup, iters, flush_l2)`, the L2 cache flushed (a 256 MiB memset) before
    /// every timed round when `flush_l2`: decode reads each byte of K and V once, so a cache
    /// warmed by the previous round would time a workload no model runs. Returns it with the
    /// split count.
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
        timing: (usize, usize, bool),
    ) -> Result<(f32, usize), FlashError> {
        let prepared = self.prepare_split_kv(kernel, q, k, v, o, lse, params, splits)?;
        self.time_prepared(prepared, timing)
    }

    /// Times a prepared split-KV launch (see [`Runtime::time_split_kv`]).
    fn time_prepared(
        &self,
        (launch, n): (PreparedLaunch<'_>, usize),
        (warmup, iters, flush_l2): (usize, usize, bool),
    ) -> Result<(f32, usize), FlashError> {
        let mut flush = self.flush_buffer(flush_l2)?;
        let ms =
            self.time_launches(std::slice::from_ref(&launch), warmup, iters, flush.as_mut())?;
        Ok((ms, n))
    }

    /// A 256 MiB buffer whose zeroing evicts the L2 cache (timings that read each byte once).
    fn flush_buffer(&self, on: bool) -> Result<Option<CudaSlice<u8>>, FlashError> {
        if !on {
            return Ok(None);
        }
        self.stream()
            .alloc_zeros::<u8>(256 << 20)
            .map(Some)
            .map_err(|e| driver("allocating the L2 flush buffer", e))
    }
}
