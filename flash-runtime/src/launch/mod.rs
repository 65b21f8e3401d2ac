//! Loading generated kernels onto a GPU and launching them: the one module of the runtime that
//! hands raw pointers to the device.
//!
//! A [`Runtime`] owns one CUDA context and stream on one device, the kernel cache, and the
//! kernels already loaded into the context (keyed by spec and configuration, so a second
//! [`Runtime::load`] costs one hash-map lookup and no planning).
//!
//! Launches are checked and packed from the plan's operand list ([`check`], [`pack`]): no code
//! here is written per operand, so a new kernel kind needs a binding of its operands, not new
//! checks. [`tensor`] holds the caller-facing tensor views.
//!
//! A forward pass takes [`TensorRef`]s for Q, K, V, a [`TensorMut`] for O, the LSE buffer and the
//! variant's parameters as [`ParamArg`]s. Everything the kernel will touch is checked before the
//! launch (see [`Runtime::forward`] and the numbered `# Safety` comment of
//! `ffi::launch_prepared`, which only a checked `PreparedLaunch` can reach);
//! every failure is a [`FlashError::Invalid`] naming the offending value and the limit it broke.
//!
//! Layouts (the kernel's contract, see `flash_dsl::args`): Q `[batch, seq_q, heads_q, d_qk]`,
//! K `[batch, seq_k, heads_kv, d_qk]`, V `[batch, seq_k, heads_kv, d_v]`, O `[batch, seq_q,
//! heads_q, d_v]`, strides in elements with the last dimension contiguous; LSE a contiguous
//! `[batch, heads_q, seq_q]` f32 array in natural-log units. Query head `h` reads key/value head
//! `h / (heads_q / heads_kv)`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdevice_attribute};
use cudarc::driver::{result, CudaContext, CudaSlice, CudaStream};
use flash_dsl::plan::KernelKind;
use flash_dsl::{KernelPlan, TileConfig, VariantSpec};

use crate::build::load_module;
pub use crate::build::LoadedKernel;
use crate::cache::KernelCache;
pub use crate::device::{default_family, DeviceInfo};
use crate::error::FlashError;
use crate::ffi;
use crate::libs;
use crate::prepared::PreparedLaunch;
use crate::variant::{ParamArg, Variant};

pub mod backward;
pub mod block_map;
pub mod check;
pub mod fp8;
pub mod pack;
pub mod quantize;
pub mod splitkv;
pub mod tensor;
pub mod varlen;

pub use block_map::BlockMap;
use check::invalid;
pub use check::{contiguous, Extents};
pub use fp8::{Fp8Inputs, Fp8V};
pub use splitkv::{PackedQueries, PagedKv, SPLITKV_MAX_ROWS};
pub use tensor::{
    contiguous_strides, ElemType, LseMut, OperandArg, TensorDesc, TensorElem, TensorMut, TensorRef,
};
pub use varlen::{VarlenBatch, VarlenShape};

fn driver(what: &str, e: result::DriverError) -> FlashError {
    FlashError::Driver(format!("{what}: {e:?}"))
}

/// The SM count the persistent kernels' grid is sized by: `sm_count`, or `cap`
/// (`FLASH_PERSISTENT_BLOCKS`) where that is smaller — a whole number from 1 (unset or empty:
/// `sm_count`); anything else is an error naming the value.
fn persistent_blocks(sm_count: u32, cap: Option<&str>) -> Result<usize, FlashError> {
    let sms = sm_count.max(1) as usize;
    match cap.map(str::trim) {
        None | Some("") => Ok(sms),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n.min(sms)),
            _ => Err(invalid(format!(
                "FLASH_PERSISTENT_BLOCKS must be a whole number of blocks from 1; got {v:?}"
            ))),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Runtime and loaded kernels
// ---------------------------------------------------------------------------------------------

/// The split-KV workspaces: fp32 partials, i32 arrival counters.
type SplitWorkspace = (Option<CudaSlice<f32>>, Option<CudaSlice<i32>>);

/// Loaded kernels by the (kind, spec, forced configuration, deterministic mode) they were
/// loaded for.
/// Keyed by spec first so that a lookup borrows the spec instead of cloning it per launch.
type KernelMemo =
    HashMap<VariantSpec, HashMap<(KernelKind, Option<TileConfig>, bool), Arc<LoadedKernel>>>;

/// One CUDA context and stream on one GPU, with its kernel cache.
///
/// Create one per device and reuse it: loaded kernels are memoised in it, and every launch is
/// issued on its one stream (launches are asynchronous; [`Runtime::synchronize`] waits).
///
/// ```no_run
/// use flash_runtime::{Runtime, TensorRef};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let decl = "pub Causal { head_dim: 64, dtype: bf16, mask: causal }";
/// let spec = flash_dsl::parse::parse_str(decl).expect("a valid declaration").remove(0);
/// let rt = Runtime::new(0)?; // an error, not a panic, on a machine without a GPU
/// let s = rt.stream();
/// let shape = [2, 512, 4, 64]; // [batch, seq, heads, head_dim]
/// let n: usize = shape.iter().product();
/// let (q, k, v) = (s.alloc_zeros::<u16>(n)?, s.alloc_zeros::<u16>(n)?, s.alloc_zeros::<u16>(n)?);
/// let (o, lse) = rt.forward_alloc(
///     &spec,
///     &TensorRef::new(&q, shape, s),
///     &TensorRef::new(&k, shape, s),
///     &TensorRef::new(&v, shape, s),
///     &[], // the variant declares no params
/// )?;
/// rt.synchronize()?;
/// assert_eq!(o.len(), n);
/// assert_eq!(lse.len(), 2 * 4 * 512); // [batch, heads_q, seq_q]
/// # Ok(())
/// # }
/// ```
pub struct Runtime {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    cache: KernelCache,
    kernels: Mutex<KernelMemo>,
    variant_specs: Mutex<HashMap<&'static str, Arc<VariantSpec>>>,
    /// The persistent kernels' work counter (see `sched_operand`).
    sched: Mutex<Option<CudaSlice<i32>>>,
    /// The split-KV pass's fp32 partials and arrival counters (see `splitkv`).
    split_ws: Mutex<SplitWorkspace>,
    /// The SM count the persistent kernels size their grid by (`GridRule::grid`: one block per
    /// SM for the forward, the backward's blocks per SM for it): the device's, or fewer with
    /// `FLASH_PERSISTENT_BLOCKS` — a check's small problems then hand each block several work
    /// items, which exercises what happens between a block's items (the stage ring, the
    /// schedule that runs across them).
    persistent_blocks: usize,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("info", &self.info).finish()
    }
}

/// Sizes of one forward problem, derived from Q and K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemShape {
    /// Number of independent sequences (dimension 0 of every tensor).
    pub batch: usize,
    /// Query positions (dimension 1 of Q and O).
    pub seq_q: usize,
    /// Key/value positions (dimension 1 of K and V).
    pub seq_k: usize,
    /// Query heads (dimension 2 of Q and O).
    pub heads_q: usize,
    /// Key/value heads (dimension 2 of K and V); divides `heads_q` (GQA/MQA when smaller).
    pub heads_kv: usize,
}

impl ProblemShape {
    /// The sizes of a launch on Q `[batch, seq_q, heads_q, d]` and K `[batch, seq_k, heads_kv, d]`.
    pub fn of(q: &TensorRef<'_>, k: &TensorRef<'_>) -> ProblemShape {
        let [batch, seq_q, heads_q, _] = q.desc.shape;
        let [_, seq_k, heads_kv, _] = k.desc.shape;
        ProblemShape {
            batch,
            seq_q,
            seq_k,
            heads_q,
            heads_kv,
        }
    }
}

impl Runtime {
    /// A runtime on GPU `ordinal` with the default kernel cache folder.
    pub fn new(ordinal: usize) -> Result<Runtime, FlashError> {
        Self::with_cache(ordinal, KernelCache::new(None))
    }

    /// A runtime on GPU `ordinal` using `cache`. Errors (never panics) when no driver library
    /// is found, the driver fails to initialise or the device does not exist. Sets the device's
    /// default memory pool to keep the memory freed into it (see `ffi::keep_pool_memory`).
    pub fn with_cache(ordinal: usize, cache: KernelCache) -> Result<Runtime, FlashError> {
        libs::ensure_driver()?;
        result::init().map_err(|e| driver("cuInit", e))?;
        let count = result::device::get_count().map_err(|e| driver("cuDeviceGetCount", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(invalid(format!(
                "gpu {ordinal} does not exist; the driver reports {count} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("creating a context", e))?;
        let stream = ctx.default_stream();
        if ctx.has_async_alloc() {
            ffi::keep_pool_memory(ctx.cu_device())
                .map_err(|e| driver("keeping freed memory in the default pool", e))?;
        }
        let attr = |a: CUdevice_attribute| {
            ctx.attribute(a)
                .map_err(|e| driver("cuDeviceGetAttribute", e))
        };
        let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let gpu = libs::GpuInfo {
            ordinal: ordinal as i32,
            name: ctx.name().unwrap_or_else(|_| "unknown".into()),
            compute_capability: (major, minor),
            total_mem_bytes: 0,
        };
        let arch = gpu.arch();
        let env = std::env::var("FLASH_FAMILY").ok();
        let default_family = default_family(&arch, env.as_deref())?;
        let info = DeviceInfo {
            ordinal,
            default_family,
            arch,
            name: gpu.name,
            compute_capability: (major, minor),
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            max_smem_optin: attr(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )? as u32,
        };
        let persistent_blocks = persistent_blocks(
            info.sm_count,
            std::env::var("FLASH_PERSISTENT_BLOCKS").ok().as_deref(),
        )?;
        Ok(Runtime {
            ctx,
            stream,
            info,
            cache,
            kernels: Mutex::new(HashMap::new()),
            variant_specs: Mutex::new(HashMap::new()),
            sched: Mutex::new(None),
            split_ws: Mutex::new((None, None)),
            persistent_blocks,
        })
    }

    /// The device this runtime runs on (name, architecture, limits, default kernel family).
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
    /// The stream every launch of this runtime is issued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// The CUDA context the runtime's kernels are loaded into; buffers must be allocated in it.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The kernel cache loads compile through.
    pub fn cache(&self) -> &KernelCache {
        &self.cache
    }

    /// The plan [`Runtime::load`] uses for `spec`: `config`, or the default configuration of
    /// the fastest kernel family this device runs.
    pub fn plan(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
    ) -> Result<KernelPlan, FlashError> {
        // The default is the fastest kernel family this GPU runs (wgmma on sm_90a); a forced
        // configuration must name a family the device can run.
        let family = self.info.default_family;
        let config = match config {
            Some(c) => {
                self.require_family(&c)?;
                c
            }
            None => flash_dsl::plan::default_config_for(spec, family),
        };
        flash_dsl::plan(spec, Some(config)).map_err(|e| FlashError::plan(&spec.name, e))
    }

    /// A tile configuration must name a kernel family this device runs (forward or backward).
    pub(crate) fn require_family(&self, c: &TileConfig) -> Result<(), FlashError> {
        if c.family.runs_on(&self.info.arch) {
            return Ok(());
        }
        Err(invalid(format!(
            "tile configuration {c:?} needs the {:?} kernel family, which {} ({}) cannot run",
            c.family, self.info.name, self.info.arch
        )))
    }

    /// Plans, emits, compiles (through the cache) and loads the kernel of `spec`; memoised per
    /// (spec, config), so a repeated launch neither re-plans nor re-hashes the source. Errors:
    /// the planner's, NVRTC's, the driver's, or a shared-memory request above the device's
    /// opt-in limit.
    pub fn load(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        self.load_kind((KernelKind::Forward, false), spec, config, || {
            self.plan(spec, config)
        })
    }

    /// The memoised load behind [`Runtime::load`] and the backward pass: `plan` runs only on
    /// the first load of (kind, spec, config).
    pub(crate) fn load_kind(
        &self,
        (kind, deterministic): (KernelKind, bool),
        spec: &VariantSpec,
        config: Option<TileConfig>,
        plan: impl FnOnce() -> Result<KernelPlan, FlashError>,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        let key = (kind, config, deterministic);
        if let Some(k) = self.lock_kernels().get(spec).and_then(|m| m.get(&key)) {
            return Ok(k.clone());
        }
        let k = Arc::new(load_module(plan()?, &self.ctx, &self.info, &self.cache)?);
        Ok(self
            .lock_kernels()
            .entry(spec.clone())
            .or_default()
            .entry(key)
            .or_insert(k)
            .clone())
    }

    fn lock_kernels(&self) -> std::sync::MutexGuard<'_, KernelMemo> {
        self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the forward pass of `kernel`: checks shapes, strides, dtypes, alignment, params and
    /// shared memory against the plan's operands (`launch::check`), then launches on
    /// [`Runtime::stream`] (asynchronously).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
    ) -> Result<(), FlashError> {
        self.forward_mapped(kernel, q, k, v, o, lse, params, None)
    }

    /// [`Runtime::forward`] with a prebuilt block map (see [`block_map`]) for a variant whose
    /// mask reads tensors; with `None` such a variant's map is built first, on the same stream.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_mapped(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        map: Option<&BlockMap>,
    ) -> Result<(), FlashError> {
        let mut owned = None;
        let ops = self.forward_args(kernel, q, k, v, o, lse, params, map, &mut owned)?;
        let launch = self.prepare(kernel, &ops, params, &[])?;
        self.launch_checked(&launch)
    }

    /// The forward kernel's operands, the block map (given or built into `owned`) last when
    /// the plan reads one.
    #[allow(clippy::too_many_arguments)]
    fn forward_args(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &TensorMut<'_>,
        lse: &LseMut<'_>,
        params: &[ParamArg<'_>],
        map: Option<&BlockMap>,
        owned: &mut Option<BlockMap>,
    ) -> Result<Vec<OperandArg>, FlashError> {
        if kernel.plan.spec.fp8.is_some() {
            return Err(invalid(format!(
                "kernel `{}` reads fp8 codes and block scales (`dtype: e4m3`): launch it with Runtime::forward_fp8",
                kernel.plan.kernel_name
            )));
        }
        let mut ops = forward_operands(q, k, v, o, lse).to_vec();
        if kernel
            .plan
            .operand(flash_dsl::plan::forward::SCHED_OPERAND)
            .is_some()
        {
            ops.push(self.sched_operand()?);
        }
        let shape = ProblemShape::of(q, k);
        if let Some(m) = self.map_operand(&kernel.plan, shape, params, map, owned)? {
            ops.push(m);
        }
        Ok(ops)
    }

    /// Loads `spec` (memoised) and runs it: [`Runtime::load`] then [`Runtime::forward`].
    ///
    /// Without a forced `config`, decode-sized launches (at most [`SPLITKV_MAX_ROWS`] packed
    /// query rows per KV head, see [`Runtime::takes_split_kv`]) run through the split-KV pass
    /// instead ([`Runtime::forward_split_kv`]), which packs the query heads of a KV group into
    /// one tile and spreads the keys over the GPU; the returned kernel is then the split-KV one.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_spec(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        if config.is_none() && self.takes_split_kv(spec, ProblemShape::of(q, k)) {
            let kernel = self.load_split_kv(spec, None)?;
            self.forward_split_kv(&kernel, q, k, v, o, lse, params, None)?;
            return Ok(kernel);
        }
        let config = config.unwrap_or_else(|| self.launch_config(spec, &ProblemShape::of(q, k)));
        let kernel = self.load(spec, Some(config))?;
        self.forward(&kernel, q, k, v, o, lse, params)?;
        Ok(kernel)
    }

    /// The configuration a forward launch of `shape` takes when none is forced or remembered:
    /// the default of the fastest kernel family this device runs, for that shape
    /// ([`flash_dsl::plan::default_config_for_launch`]: a few defaults depend on the length).
    pub fn launch_config(&self, spec: &VariantSpec, shape: &ProblemShape) -> TileConfig {
        flash_dsl::plan::default_config_for_launch(spec, self.info.default_family, shape.seq_q)
    }

    /// Like [`Runtime::forward_spec`] but allocates O (contiguous, 16-bit elements of the
    /// variant's dtype) and the LSE, and returns them.
    pub fn forward_alloc(
        &self,
        spec: &VariantSpec,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        params: &[ParamArg<'_>],
    ) -> Result<(CudaSlice<u16>, CudaSlice<f32>), FlashError> {
        let [b, sq, hq, _] = q.desc.shape;
        let o_shape = [b, sq, hq, spec.head_dim_v as usize];
        let n_o = o_shape.iter().product::<usize>().max(1);
        let n_l = (b * hq * sq).max(1);
        let mut o = self
            .stream
            .alloc_zeros::<u16>(n_o)
            .map_err(|e| driver("allocating O", e))?;
        let mut lse = self
            .stream
            .alloc_zeros::<f32>(n_l)
            .map_err(|e| driver("allocating the LSE", e))?;
        {
            let mut om = TensorMut::new(&mut o, o_shape, &self.stream);
            let mut lm = LseMut::new(&mut lse, &self.stream);
            self.forward_spec(spec, None, q, k, v, &mut om, &mut lm, params)?;
        }
        Ok((o, lse))
    }

    /// The typed entry point for `attention!`-declared variants: the spec is parsed from
    /// `V::SOURCE` once per runtime and the params come from `V::param_args`.
    pub fn forward_variant<V: Variant>(
        &self,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &V::Params<'_>,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        let spec = self.variant_spec::<V>()?;
        let args = V::param_args(params, &self.stream);
        self.forward_spec(&spec, None, q, k, v, o, lse, &args)
    }

    /// The work counter of the persistent kernels: one `i32` per runtime, zeroed once; every
    /// launch leaves it at zero (its last fetch resets it), and launches on the runtime's one
    /// stream never overlap.
    fn sched_operand(&self) -> Result<OperandArg, FlashError> {
        let mut slot = self.sched.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(
                self.stream
                    .alloc_zeros::<i32>(1)
                    .map_err(|e| driver("allocating the work counter", e))?,
            );
        }
        let buf = slot.as_mut().expect("just allocated");
        let (ptr, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(buf, &self.stream);
        Ok(OperandArg::flat(
            ptr,
            1,
            ElemType::I32,
            tensor::ctx_id(&self.ctx),
        ))
    }

    /// The spec of a macro-declared variant, parsed once.
    pub fn variant_spec<V: Variant>(&self) -> Result<Arc<VariantSpec>, FlashError> {
        let mut map = self.variant_specs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(V::NAME) {
            return Ok(s.clone());
        }
        let spec = V::spec()?;
        let spec = Arc::new(spec);
        map.insert(V::NAME, spec.clone());
        Ok(spec)
    }

    /// Median milliseconds of one launch of `kernel` on these buffers, timed with CUDA events
    /// around each launch after `warmup` untimed launches. The arguments are checked once.
    #[allow(clippy::too_many_arguments)]
    pub fn time_forward(
        &self,
        kernel: &LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &mut TensorMut<'_>,
        lse: &mut LseMut<'_>,
        params: &[ParamArg<'_>],
        warmup: usize,
        iters: usize,
    ) -> Result<f32, FlashError> {
        // A block map is built once, before the timed launches (its build is timed apart).
        let mut owned = None;
        let ops = self.forward_args(kernel, q, k, v, o, lse, params, None, &mut owned)?;
        let launch = self.prepare(kernel, &ops, params, &[])?;
        self.time_launches(std::slice::from_ref(&launch), warmup, iters, None)
    }

    /// Median milliseconds of `launches` run in order, timed with CUDA events around each
    /// round after `warmup` untimed rounds; `flush`, when given, is zeroed before each round
    /// (outside the events) to evict the L2 cache.
    pub(crate) fn time_launches(
        &self,
        launches: &[PreparedLaunch<'_>],
        warmup: usize,
        iters: usize,
        mut flush: Option<&mut CudaSlice<u8>>,
    ) -> Result<f32, FlashError> {
        let run = || -> Result<(), FlashError> {
            for l in launches {
                self.launch_checked(l)?;
            }
            Ok(())
        };
        for _ in 0..warmup {
            run()?;
        }
        let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let ev = |what| {
            self.ctx
                .new_event(timing)
                .map_err(|e| driver(&format!("creating the {what} event"), e))
        };
        let (start, end) = (ev("start")?, ev("end")?);
        let mut times = Vec::with_capacity(iters.max(1));
        for _ in 0..iters.max(1) {
            if let Some(buf) = flush.as_deref_mut() {
                self.stream
                    .memset_zeros(buf)
                    .map_err(|e| driver("flushing the L2 cache", e))?;
            }
            start
                .record(&self.stream)
                .map_err(|e| driver("recording an event", e))?;
            run()?;
            end.record(&self.stream)
                .map_err(|e| driver("recording an event", e))?;
            end.synchronize()
                .map_err(|e| driver("waiting for the kernel", e))?;
            times.push(
                start
                    .elapsed_ms(&end)
                    .map_err(|e| driver("reading an event", e))?,
            );
        }
        times.sort_by(f32::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Waits for all work on the stream; surfaces asynchronous kernel faults.
    pub fn synchronize(&self) -> Result<(), FlashError> {
        self.stream
            .synchronize()
            .map_err(|e| driver("synchronising the stream", e))
    }

    // -----------------------------------------------------------------------------------------
    // Checks
    // -----------------------------------------------------------------------------------------

    /// Every check of a launch of `kernel` with `operands` bound in the plan's operand order
    /// (see the `# Safety` list of `ffi::launch_prepared`); on success the packed argument
    /// struct and the grid.
    pub(crate) fn prepare<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        operands: &[OperandArg],
        params: &[ParamArg<'_>],
        grads: &[Option<ParamArg<'_>>],
    ) -> Result<PreparedLaunch<'a>, FlashError> {
        self.prepare_with(kernel, operands, params, grads, &[])
    }

    /// [`Runtime::prepare`] with launch extents given up front (see
    /// [`check::resolve_extents_with`]).
    pub(crate) fn prepare_with<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        operands: &[OperandArg],
        params: &[ParamArg<'_>],
        grads: &[Option<ParamArg<'_>>],
        preset: &[(flash_dsl::plan::Extent, usize)],
    ) -> Result<PreparedLaunch<'a>, FlashError> {
        let plan = &kernel.plan;
        let ext = check::resolve_extents_with(plan, operands, preset)?;
        let me = tensor::ctx_id(&self.ctx);
        for (op, a) in plan.operands.iter().zip(operands) {
            let bytes = check::check_operand(op, a, &ext)?;
            if bytes > 0 && a.ctx != me {
                return Err(invalid(format!(
                    "{} lives in another CUDA context than this runtime's (gpu {})",
                    op.name, self.info.ordinal
                )));
            }
            self.check_allocation(&op.name, a.ptr, bytes)?;
        }
        if plan.smem_bytes() > self.info.max_smem_optin {
            return Err(invalid(format!(
                "kernel `{}` needs {} bytes of shared memory per block; {} allows at most {}",
                plan.kernel_name,
                plan.smem_bytes(),
                self.info.name,
                self.info.max_smem_optin
            )));
        }
        let packed = pack::pack_args(plan, operands, &ext, params, grads)?;
        for (name, ptr, len) in &packed.param_regions {
            self.check_allocation(name, *ptr, *len)?;
        }
        let [gx, gy, gz] = plan
            .launch
            .grid
            .grid(|e| ext.get(e), self.persistent_blocks);
        if gx > i32::MAX as usize || gy > 65535 || gz > 65535 {
            return Err(invalid(format!(
                "grid ({gx}, {gy}, {gz}) exceeds the launch limits (2^31-1, 65535, 65535)"
            )));
        }
        Ok(PreparedLaunch::new(
            &kernel.func,
            &self.stream,
            &plan.kernel_name,
            pack::to_words(&packed.bytes),
            (gx as u32, gy as u32, gz as u32),
            plan.threads(),
            plan.smem_bytes(),
        ))
    }

    /// Checks with the driver that `[ptr, ptr + bytes)` lies inside one allocation on this
    /// runtime's device.
    fn check_allocation(&self, name: &str, ptr: u64, bytes: usize) -> Result<(), FlashError> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("binding the context", e))?;
        let (start, size, ordinal) = ffi::pointer_range(ptr).map_err(|r| {
            invalid(format!(
                "{name} ({ptr:#x}) is not device memory the driver knows ({r:?})"
            ))
        })?;
        // The device, not the context: stream-ordered (pool) allocations, which cudarc makes
        // where the driver supports them, belong to no context.
        if ordinal != self.info.ordinal as i32 {
            return Err(invalid(format!(
                "{name} lives on gpu {ordinal}; this runtime runs on gpu {}",
                self.info.ordinal
            )));
        }
        let end = start + size as u64;
        if ptr + bytes as u64 > end {
            return Err(invalid(format!(
                "{name} reaches {bytes} bytes past {ptr:#x}, but its allocation ends {} bytes after it",
                end - ptr
            )));
        }
        Ok(())
    }

    /// Launches a prepared forward pass (see the `# Safety` comment of
    /// [`ffi::launch_prepared`] for what `prepare` established).
    fn launch_checked(&self, launch: &PreparedLaunch<'_>) -> Result<(), FlashError> {
        if launch.is_empty() {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("binding the context", e))?;
        ffi::launch_prepared(launch)
            .map_err(|e| driver(&format!("launching `{}`", launch.name()), e))
    }
}

/// The forward kernel's operands (q, k, v, o, lse: the plan's order) as untyped arguments.
fn forward_operands(
    q: &TensorRef<'_>,
    k: &TensorRef<'_>,
    v: &TensorRef<'_>,
    o: &TensorMut<'_>,
    lse: &LseMut<'_>,
) -> [OperandArg; 5] {
    [
        (&q.desc).into(),
        (&k.desc).into(),
        (&v.desc).into(),
        (&o.desc).into(),
        lse.into(),
    ]
}

#[cfg(test)]
mod tests;
