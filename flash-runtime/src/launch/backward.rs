//! The backward pass on the runtime: the three kernels of `flash_dsl::plan::backward_pipeline`
//! bound to the caller's tensors and two scratch buffers (`delta`, the fp32 dQ accumulator),
//! every launch checked before the first is issued, then launched in order on the runtime's
//! stream.
//!
//! dK and dV are summed over the query heads of each KV group in registers (deterministic); dQ
//! is accumulated with fp32 atomics, so its last bits can differ between runs. Gradients of the
//! score's `f32` parameters are zeroed, then added into (fp32 atomics); a parameter given no
//! gradient buffer is frozen, and the kernels are generated without its terms.

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use flash_dsl::plan::backward::{
    backward_config_is_valid, backward_fallback_config, is_fix_operand, plan_backward_main_with,
    plan_backward_pre_with, plan_dq_convert, planned_grad_params,
};
use flash_dsl::plan::{default_backward_config_for, KernelKind};
use flash_dsl::spec::ScalarTy;
use flash_dsl::{TileConfig, VariantSpec};

use super::check::invalid;
use super::tensor::{ctx_id, ElemType, OperandArg, TensorMut, TensorRef};
use super::{driver, BlockMap, ProblemShape, Runtime};
use crate::error::FlashError;
use crate::variant::{ParamArg, Variant};

/// A read-only flat f32 buffer: the forward's LSE, `[batch, heads_q, seq_q]`.
#[derive(Debug, Clone, Copy)]
pub struct LseRef<'a> {
    ptr: u64,
    len: usize,
    ctx: usize,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> LseRef<'a> {
    /// The LSE view of all of `slice` (the buffer the forward's [`LseMut`](super::LseMut)
    /// wrote); its length is checked against the problem at launch.
    pub fn new(slice: &'a CudaSlice<f32>, stream: &cudarc::driver::CudaStream) -> Self {
        let (ptr, _sync) = slice.device_ptr(stream);
        LseRef {
            ptr,
            len: slice.len(),
            ctx: ctx_id(slice.context()),
            _borrow: PhantomData,
        }
    }
}

/// What the backward pass reads: the forward's inputs, its outputs O and LSE, and dO (same
/// layout as O).
#[derive(Debug, Clone, Copy)]
pub struct BackwardInputs<'a> {
    /// The forward's Q, `[batch, seq_q, heads_q, d_qk]`.
    pub q: TensorRef<'a>,
    /// The forward's K, `[batch, seq_k, heads_kv, d_qk]`.
    pub k: TensorRef<'a>,
    /// The forward's V, `[batch, seq_k, heads_kv, d_v]`.
    pub v: TensorRef<'a>,
    /// The forward's output O, `[batch, seq_q, heads_q, d_v]`.
    pub o: TensorRef<'a>,
    /// The gradient of the loss with respect to O (layout of O).
    pub d_o: TensorRef<'a>,
    /// The forward's log-sum-exp, `[batch, heads_q, seq_q]` f32.
    pub lse: LseRef<'a>,
}

/// What the backward pass writes: dQ, dK, dV (layouts of Q, K, V) and, by parameter index, the
/// gradient of each `f32` parameter the score depends on (`None`: not wanted — the parameter is
/// then frozen, and the kernels run without its gradient terms, as PyTorch's
/// `requires_grad=False`; scalars get a one-element buffer). Parameter gradients are
/// overwritten, not accumulated into.
pub struct BackwardGrads<'a> {
    /// Gradient of Q (layout of Q); accumulated in fp32 scratch, then converted.
    pub dq: TensorMut<'a>,
    /// Gradient of K (layout of K), summed over the query heads of each KV group.
    pub dk: TensorMut<'a>,
    /// Gradient of V (layout of V), summed over the query heads of each KV group.
    pub dv: TensorMut<'a>,
    /// One slot per variant parameter, by index: a buffer for the gradient of an `f32`
    /// parameter the score depends on, or `None` where it is not wanted (frozen: not computed
    /// at all; a shorter list leaves the rest out). A parameter the spec itself already marks
    /// frozen must get `None`.
    pub dparams: Vec<Option<&'a mut CudaSlice<f32>>>,
}

/// The `f32` parameters whose gradient `spec`'s backward would compute but `grads` has no
/// buffer for (to be frozen), or `None` when there are none. Only a call that leaves out an
/// `f32` parameter's buffer differentiates the score here.
fn frozen_params(spec: &VariantSpec, grads: &BackwardGrads<'_>) -> Option<Vec<usize>> {
    let has_buffer = |i: usize| grads.dparams.get(i).is_some_and(|g| g.is_some());
    let is_f32 = |p: &flash_dsl::spec::ParamDecl| p.kind.elem() == ScalarTy::F32;
    if spec
        .params
        .iter()
        .enumerate()
        .all(|(i, p)| !is_f32(p) || p.frozen || has_buffer(i))
    {
        return None;
    }
    let frozen: Vec<usize> = flash_dsl::plan::grad_params(spec)
        .into_iter()
        .filter(|&i| !has_buffer(i))
        .collect();
    (!frozen.is_empty()).then_some(frozen)
}

/// The main kernels pack a step of their walk, (query head of the KV group, query tile), into
/// one i32: the tile in the low bits (as many as the tile count needs), the head above them
/// (`next_step` in the backward templates). A launch whose steps do not fit is refused.
pub(crate) fn walk_fits(
    name: &str,
    group: usize,
    seq_q: usize,
    block_m: usize,
) -> Result<(), FlashError> {
    let tile_slots = seq_q.div_ceil(block_m.max(1)).next_power_of_two();
    if group.saturating_mul(tile_slots) > i32::MAX as usize {
        return Err(invalid(format!(
            "`{name}`: the backward walks {group} query heads per KV head × {tile_slots} query-tile slots ({seq_q} queries in tiles of {block_m}), more than its 2^31 steps; use fewer query heads per KV head or a shorter sequence"
        )));
    }
    Ok(())
}

fn flat(ptr: u64, len: usize, ctx: usize) -> OperandArg {
    OperandArg::flat(ptr, len, ElemType::F32, ctx)
}

/// How to run the backward pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackwardOptions {
    /// Forces the main kernel's tile configuration (default: `default_backward_config_for` the
    /// device's kernel family).
    pub config: Option<TileConfig>,
    /// dQ bit-identical across runs: key tiles add into each query tile's dQ in a fixed order,
    /// through a semaphore per query tile (slower; dK and dV are deterministic either way).
    pub deterministic: bool,
}

impl Runtime {
    /// The backward pass of `spec` (see the module doc): checks every launch against the plans
    /// (shapes, dtypes, strides, alignment, buffer extents, devices, params and gradient
    /// buffers), then runs pre-processing, the main kernel and the dQ conversion on
    /// [`Runtime::stream`]. `config` forces the main kernel's tile configuration.
    pub fn backward_spec(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
        input: &BackwardInputs<'_>,
        params: &[ParamArg<'_>],
        grads: &mut BackwardGrads<'_>,
    ) -> Result<(), FlashError> {
        let opts = BackwardOptions {
            config,
            deterministic: false,
        };
        self.backward_spec_with(spec, &opts, input, params, grads)
    }

    /// [`Runtime::backward_spec`] with [`BackwardOptions`] (e.g. the deterministic mode).
    pub fn backward_spec_with(
        &self,
        spec: &VariantSpec,
        opts: &BackwardOptions,
        input: &BackwardInputs<'_>,
        params: &[ParamArg<'_>],
        grads: &mut BackwardGrads<'_>,
    ) -> Result<(), FlashError> {
        self.backward_mapped(spec, opts, input, params, grads, None)
    }

    /// [`Runtime::backward_spec_with`] with a prebuilt block map (from
    /// [`Runtime::backward_block_map`]) for a variant whose mask reads tensors; with `None`
    /// such a variant's map is built first, on the same stream.
    pub fn backward_mapped(
        &self,
        spec: &VariantSpec,
        opts: &BackwardOptions,
        input: &BackwardInputs<'_>,
        params: &[ParamArg<'_>],
        grads: &mut BackwardGrads<'_>,
        map: Option<&BlockMap>,
    ) -> Result<(), FlashError> {
        // Parameters given no gradient buffer are frozen: the kernels are planned without their
        // gradient terms (and, for per-head terms, without the correction's row sums), as if
        // they were constants.
        let frozen_spec;
        let spec = match frozen_params(spec, grads) {
            Some(frozen) => {
                frozen_spec = spec.with_frozen(&frozen);
                &frozen_spec
            }
            None => spec,
        };
        let det = opts.deterministic;
        let plan_err = |e: flash_dsl::plan::PlanError| FlashError::plan(&spec.name, e);
        let pre = self.load_kind((KernelKind::BackwardPre, det), spec, None, || {
            plan_backward_pre_with(spec, det).map_err(plan_err)
        })?;
        let main = self.backward_main(spec, opts)?;
        let conv = self.load_kind((KernelKind::DqConvert, false), spec, None, || {
            plan_dq_convert(spec).map_err(plan_err)
        })?;

        // Scratch sized from Q; every launch below checks it against its own operands.
        let [b, sq, hq, dqk] = input.q.desc.shape;
        walk_fits(
            &spec.name,
            hq / input.k.desc.shape[2].max(1),
            sq,
            main.plan.config.block_m as usize,
        )?;
        let n_delta = (b * hq * sq).max(1);
        let n_acc = (b * sq * hq * dqk).max(1);
        // Not zeroed here: the pre-processing kernel writes every row of delta and zeroes every
        // element of the accumulator (a memset here would move as many bytes again).
        let mut delta = crate::ffi::alloc_scratch_f32(&self.stream, n_delta)
            .map_err(|e| driver("allocating delta", e))?;
        let mut acc = crate::ffi::alloc_scratch_f32(&self.stream, n_acc)
            .map_err(|e| driver("allocating the dQ accumulator", e))?;
        let me = ctx_id(&self.ctx);
        let (delta_ptr, _s1) = delta.device_ptr_mut(&self.stream);
        let (acc_ptr, _s2) = acc.device_ptr_mut(&self.stream);
        let delta_op = flat(delta_ptr, n_delta, me);
        let acc_op = flat(acc_ptr, n_acc, me);
        // Row sums of the uniform-term correction (see `plan::backward::grad_terms`): `zsum`
        // and one `pw<u>` per uniform term, zeroed by the pre-processing kernel.
        let mut fix_bufs: Vec<CudaSlice<f32>> = Vec::new();
        // Counted off the loaded plan (no symbolic differentiation per launch).
        let n_fix = main
            .plan
            .operands
            .iter()
            .filter(|o| is_fix_operand(o))
            .count();
        for _ in 0..n_fix {
            fix_bufs.push(
                self.stream
                    .alloc_zeros::<f32>(n_delta)
                    .map_err(|e| driver("allocating correction sums", e))?,
            );
        }
        let mut fix_ops = Vec::new();
        for buf in fix_bufs.iter_mut() {
            let (ptr, _sync) = buf.device_ptr_mut(&self.stream);
            fix_ops.push(flat(ptr, n_delta, me));
        }
        // The deterministic mode's semaphores, zeroed by the pre-processing kernel.
        let mut sem_buf: Option<CudaSlice<i32>> = None;
        let mut sem_ops = Vec::new();
        if det {
            let buf = sem_buf.insert(
                self.stream
                    .alloc_zeros::<i32>(n_delta)
                    .map_err(|e| driver("allocating the dQ semaphores", e))?,
            );
            let (ptr, _sync) = buf.device_ptr_mut(&self.stream);
            sem_ops.push(OperandArg::flat(ptr, n_delta, ElemType::I32, me));
        }

        // Gradient buffers: the caller's (every wanted one has one: the others are frozen);
        // all zeroed first.
        let wanted = planned_grad_params(&main.plan);
        if let Some(i) = (0..spec.params.len())
            .find(|&i| spec.params[i].frozen && grads.dparams.get(i).is_some_and(|g| g.is_some()))
        {
            return Err(invalid(format!(
                "`{}`: parameter `{}` is frozen in this spec, so the backward computes no gradient for it; pass no buffer for it, or the spec without `frozen`",
                spec.name, spec.params[i].name
            )));
        }
        let mut grad_args: Vec<Option<ParamArg<'_>>> = vec![None; spec.params.len()];
        for &i in &wanted {
            let Some(dst) = grads.dparams.get_mut(i).and_then(|g| g.as_deref_mut()) else {
                return Err(invalid(format!(
                    "`{}`: no gradient buffer for `{}`, whose gradient the kernel computes",
                    spec.name, spec.params[i].name
                )));
            };
            self.stream
                .memset_zeros(dst)
                .map_err(|e| driver("zeroing a gradient buffer", e))?;
            let len = dst.len();
            let (ptr, _sync) = dst.device_ptr_mut(&self.stream);
            grad_args[i] = Some(ParamArg::raw_tensor(ptr, len, ScalarTy::F32));
        }
        if grads.dparams.len() > spec.params.len() {
            return Err(invalid(format!(
                "`{}` declares {} param(s); got {} gradient buffers",
                spec.name,
                spec.params.len(),
                grads.dparams.len()
            )));
        }

        let lse = flat(input.lse.ptr, input.lse.len, input.lse.ctx);
        let t = |r: &TensorRef<'_>| OperandArg::from(&r.desc);
        let m = |r: &TensorMut<'_>| OperandArg::from(&r.desc);
        let with_fix = |mut v: Vec<OperandArg>| {
            v.extend(fix_ops.iter().cloned());
            v
        };
        // The persistent main kernel's work counter (see `plan::backward::persistent_backward`).
        let sched_op = if main
            .plan
            .operand(flash_dsl::plan::forward::SCHED_OPERAND)
            .is_some()
        {
            Some(self.sched_operand()?)
        } else {
            None
        };
        let with_sem = |mut v: Vec<OperandArg>| {
            v.extend(sem_ops.iter().cloned());
            v
        };
        let with_sched = |mut v: Vec<OperandArg>| {
            v.extend(sched_op.iter().cloned());
            v
        };
        let fixing = !fix_ops.is_empty();
        let mut owned_map = None;
        let shape = ProblemShape::of(&input.q, &input.k);
        let map_op = self.map_operand(&main.plan, shape, params, map, &mut owned_map)?;
        let with_map = |mut v: Vec<OperandArg>| {
            v.extend(map_op.iter().cloned());
            v
        };
        let launches = [
            self.prepare(
                &pre,
                &with_sem(with_fix(vec![
                    t(&input.o),
                    t(&input.d_o),
                    delta_op.clone(),
                    acc_op.clone(),
                ])),
                &[],
                &[],
            )?,
            self.prepare(
                &main,
                &with_map(with_sched(with_sem(with_fix(vec![
                    t(&input.q),
                    t(&input.k),
                    t(&input.v),
                    t(&input.d_o),
                    lse,
                    delta_op,
                    acc_op.clone(),
                    m(&grads.dk),
                    m(&grads.dv),
                ])))),
                params,
                &grad_args,
            )?,
            self.prepare(
                &conv,
                &with_fix(vec![acc_op, m(&grads.dq)]),
                if fixing { params } else { &[] },
                if fixing { &grad_args } else { &[] },
            )?,
        ];
        for l in &launches {
            self.launch_checked(l)?;
        }
        // The scratch buffers are freed on the stream, ordered after the kernels.
        drop(launches);
        drop(fix_bufs);
        drop(sem_buf);
        drop(owned_map);
        Ok(())
    }

    /// The backward main kernel `opts` select, loaded: the forced configuration, or the default
    /// of the device's kernel family (the wgmma kernel on sm_90a, unless `FLASH_FAMILY=sm80`) —
    /// which, when its kernel spills, gives way to its narrower step
    /// (`backward_fallback_config`). The backward pass and [`Runtime::backward_block_map`]
    /// resolve it the same way, so a prebuilt map fits the kernel that walks it.
    pub(crate) fn backward_main(
        &self,
        spec: &VariantSpec,
        opts: &BackwardOptions,
    ) -> Result<std::sync::Arc<crate::build::LoadedKernel>, FlashError> {
        let det = opts.deterministic;
        let cfg = opts
            .config
            .unwrap_or_else(|| default_backward_config_for(spec, self.info.default_family));
        self.require_family(&cfg)?;
        let plan_err = |e: flash_dsl::plan::PlanError| FlashError::plan(&spec.name, e);
        backward_config_is_valid(spec, &cfg).map_err(plan_err)?;
        // A frozen build takes the tile its unfrozen build resolves to: a block map prebuilt for
        // the variant (`backward_block_map` sees the declared spec) must fit it, and the frozen
        // kernel's registers may decide the fallback differently.
        if opts.config.is_none()
            && backward_fallback_config(&cfg).is_some()
            && spec.params.iter().any(|p| p.frozen)
        {
            let resolved = self.backward_main(&spec.unfrozen(), opts)?.plan.config;
            let forced = BackwardOptions {
                config: Some(resolved),
                ..*opts
            };
            return self.backward_main(spec, &forced);
        }
        let main = self.load_kind((KernelKind::BackwardMain, det), spec, Some(cfg), || {
            plan_backward_main_with(spec, cfg, det).map_err(plan_err)
        })?;
        if opts.config.is_none() && main.compiled.resources.spills() {
            if let Some(narrow) = backward_fallback_config(&cfg) {
                return self.load_kind((KernelKind::BackwardMain, det), spec, Some(narrow), || {
                    plan_backward_main_with(spec, narrow, det).map_err(plan_err)
                });
            }
        }
        Ok(main)
    }

    /// The typed backward pass of an `attention!` variant (see [`Runtime::backward_spec`]).
    pub fn backward_variant<V: Variant>(
        &self,
        input: &BackwardInputs<'_>,
        params: &V::Params<'_>,
        grads: &mut BackwardGrads<'_>,
    ) -> Result<(), FlashError> {
        let spec = self.variant_spec::<V>()?;
        let args = V::param_args(params, &self.stream);
        self.backward_spec(&spec, None, input, &args, grads)
    }
}
