//! Loading generated kernels onto a GPU and launching them: the one module of the runtime that
//! hands raw pointers to the device.
//!
//! A [`Runtime`] owns one CUDA context and stream on one device, the kernel cache, and the
//! kernels already loaded into the context (keyed by their [`KernelPlan`], so a second
//! [`Runtime::load`] of the same plan costs one hash-map lookup).
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
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    result, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
};
use cudarc::nvrtc::Ptx;
use flash_dsl::args::KernelArgsHeader;
use flash_dsl::eval::{tensor_shape, Sizes};
use flash_dsl::plan::KernelFamily;
use flash_dsl::spec::{DType, ParamKind, ScalarTy};
use flash_dsl::{KernelPlan, TileConfig, VariantSpec};

use crate::cache::{CacheOutcome, KernelCache};
use crate::compile::{CompileOptions, CompiledKernel};
use crate::error::FlashError;
use crate::ffi;
use crate::libs;
use crate::variant::{ParamArg, Variant};

fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

fn driver(what: &str, e: result::DriverError) -> FlashError {
    FlashError::Driver(format!("{what}: {e:?}"))
}

// ---------------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------------

/// Element type of a Q/K/V/O buffer as the caller declared it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    Bf16,
    F16,
    /// Untyped 16-bit elements (`CudaSlice<u16>` holding bf16 or f16 bits): accepted for either
    /// dtype; the caller vouches for the interpretation.
    Bits16,
}

impl ElemType {
    /// Whether buffers of this type can feed a variant of `dtype`.
    pub fn matches(self, dtype: DType) -> bool {
        matches!(
            (self, dtype),
            (ElemType::Bits16, _) | (ElemType::Bf16, DType::Bf16) | (ElemType::F16, DType::F16)
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            ElemType::Bf16 => "bf16",
            ElemType::F16 => "f16",
            ElemType::Bits16 => "u16",
        }
    }
}

/// Host element types whose device buffers can be used as Q/K/V/O.
pub trait TensorElem: Copy + 'static {
    const ELEM: ElemType;
}
impl TensorElem for half::bf16 {
    const ELEM: ElemType = ElemType::Bf16;
}
impl TensorElem for half::f16 {
    const ELEM: ElemType = ElemType::F16;
}
impl TensorElem for u16 {
    const ELEM: ElemType = ElemType::Bits16;
}

/// Pointer, extent and layout of one 4-d tensor, without a borrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDesc {
    /// Device address of element `[0, 0, 0, 0]`.
    pub ptr: u64,
    /// Elements available from `ptr` (the buffer's length).
    pub len: usize,
    pub shape: [usize; 4],
    /// Strides in elements.
    pub strides: [i64; 4],
    pub elem: ElemType,
    /// The context the buffer was allocated in.
    ctx: usize,
}

/// Row-major strides of a contiguous `shape`.
pub fn contiguous_strides(shape: [usize; 4]) -> [i64; 4] {
    let mut s = [1i64; 4];
    for i in (0..3).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1] as i64);
    }
    s
}

impl TensorDesc {
    /// Elements reached by the shape and strides: `1 + Σ (shape_i − 1)·stride_i`, or 0 for an
    /// empty tensor; `None` on overflow or a negative stride.
    pub fn extent(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        let mut last: i64 = 0;
        for (n, s) in self.shape.iter().zip(self.strides) {
            if s < 0 {
                return None;
            }
            last = last.checked_add((*n as i64 - 1).checked_mul(s)?)?;
        }
        usize::try_from(last.checked_add(1)?).ok()
    }

    /// Whether no two index tuples share an element (needed for outputs: two threads would
    /// write the same element).
    fn non_overlapping(&self) -> bool {
        let mut dims: Vec<(i64, usize)> = self
            .strides
            .iter()
            .zip(self.shape)
            .filter(|(_, n)| *n > 1)
            .map(|(s, n)| (*s, n))
            .collect();
        dims.sort();
        let mut span: i64 = 1; // elements covered by the inner dimensions
        for (s, n) in dims {
            if s < span {
                return false;
            }
            span = s.saturating_mul(n as i64);
        }
        true
    }
}

/// A read-only device tensor borrowed from a `CudaSlice`.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    pub desc: TensorDesc,
    _borrow: PhantomData<&'a ()>,
}

/// A device tensor the kernel writes, mutably borrowed from a `CudaSlice`.
#[derive(Debug)]
pub struct TensorMut<'a> {
    pub desc: TensorDesc,
    _borrow: PhantomData<&'a mut ()>,
}

fn ctx_id(ctx: &Arc<CudaContext>) -> usize {
    ctx.cu_ctx() as usize
}

impl<'a> TensorRef<'a> {
    /// A contiguous `shape` tensor over `slice`.
    pub fn new<T: TensorElem>(
        slice: &'a CudaSlice<T>,
        shape: [usize; 4],
        stream: &CudaStream,
    ) -> Self {
        Self::strided(slice, shape, contiguous_strides(shape), stream)
    }
    /// A tensor over `slice` with explicit element strides (checked at launch).
    pub fn strided<T: TensorElem>(
        slice: &'a CudaSlice<T>,
        shape: [usize; 4],
        strides: [i64; 4],
        stream: &CudaStream,
    ) -> Self {
        Self::strided_at(slice, 0, shape, strides, stream)
    }
    /// A strided tensor whose element `[0, 0, 0, 0]` is element `offset` of `slice` (e.g. K
    /// inside a packed QKV buffer). `offset` past the end gives an empty buffer, which the
    /// launch checks reject for any non-empty shape.
    pub fn strided_at<T: TensorElem>(
        slice: &'a CudaSlice<T>,
        offset: usize,
        shape: [usize; 4],
        strides: [i64; 4],
        stream: &CudaStream,
    ) -> Self {
        let (base, _sync) = slice.device_ptr(stream);
        let offset = offset.min(slice.len());
        TensorRef {
            desc: TensorDesc {
                ptr: base + (offset * std::mem::size_of::<T>()) as u64,
                len: slice.len() - offset,
                shape,
                strides,
                elem: T::ELEM,
                ctx: ctx_id(slice.context()),
            },
            _borrow: PhantomData,
        }
    }
}

impl<'a> TensorMut<'a> {
    /// A contiguous `shape` tensor over `slice`.
    pub fn new<T: TensorElem>(
        slice: &'a mut CudaSlice<T>,
        shape: [usize; 4],
        stream: &CudaStream,
    ) -> Self {
        Self::strided(slice, shape, contiguous_strides(shape), stream)
    }
    /// A tensor over `slice` with explicit element strides (checked at launch).
    pub fn strided<T: TensorElem>(
        slice: &'a mut CudaSlice<T>,
        shape: [usize; 4],
        strides: [i64; 4],
        stream: &CudaStream,
    ) -> Self {
        let ctx = ctx_id(slice.context());
        let len = slice.len();
        let (ptr, _sync) = slice.device_ptr_mut(stream);
        TensorMut {
            desc: TensorDesc {
                ptr,
                len,
                shape,
                strides,
                elem: T::ELEM,
                ctx,
            },
            _borrow: PhantomData,
        }
    }
}

/// The LSE output: a contiguous f32 buffer of at least `batch·heads_q·seq_q` elements.
#[derive(Debug)]
pub struct LseMut<'a> {
    ptr: u64,
    len: usize,
    ctx: usize,
    _borrow: PhantomData<&'a mut ()>,
}

impl<'a> LseMut<'a> {
    pub fn new(slice: &'a mut CudaSlice<f32>, stream: &CudaStream) -> Self {
        let ctx = ctx_id(slice.context());
        let len = slice.len();
        let (ptr, _sync) = slice.device_ptr_mut(stream);
        LseMut {
            ptr,
            len,
            ctx,
            _borrow: PhantomData,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Runtime and loaded kernels
// ---------------------------------------------------------------------------------------------

/// The device a [`Runtime`] runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    /// NVRTC target: `sm_90a` on Hopper (kernels may use sm_90a-only instructions), `sm_XY`
    /// elsewhere.
    pub arch: String,
    pub sm_count: u32,
    /// Dynamic shared memory a block may opt into (`MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`).
    pub max_smem_optin: u32,
    /// The kernel family plans default to: the fastest this GPU runs, or `FLASH_FAMILY`.
    pub default_family: KernelFamily,
}

/// The default kernel family for a GPU of `arch`: `FLASH_FAMILY` (`sm80`, `sm90`, `sm90ws`)
/// when set, else the fastest family the architecture runs. An unknown name, or a family the
/// GPU cannot run, is an error naming the value.
pub fn default_family(arch: &str, env: Option<&str>) -> Result<KernelFamily, FlashError> {
    let family = match env {
        None => return Ok(KernelFamily::for_arch(arch)),
        Some("sm80") => KernelFamily::Sm80,
        Some("sm90") => KernelFamily::Sm90,
        Some("sm90ws") => KernelFamily::Sm90Ws,
        Some(other) => {
            return Err(invalid(format!(
                "FLASH_FAMILY must be sm80, sm90 or sm90ws; got `{other}`"
            )))
        }
    };
    if !family.runs_on(arch) {
        return Err(invalid(format!(
            "FLASH_FAMILY asks for the {family:?} kernel family, which {arch} cannot run"
        )));
    }
    Ok(family)
}

/// A kernel loaded into a [`Runtime`]'s context, ready to launch.
#[derive(Debug)]
pub struct LoadedKernel {
    pub plan: KernelPlan,
    pub compiled: Arc<CompiledKernel>,
    /// How the CUBIN was obtained (memory, disk, fresh compile).
    pub outcome: CacheOutcome,
    /// Milliseconds spent in plan + emit + compile/cache + module load.
    pub load_ms: f64,
    func: CudaFunction,
}

/// One CUDA context and stream on one GPU, with its kernel cache.
pub struct Runtime {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    cache: KernelCache,
    kernels: Mutex<HashMap<KernelPlan, Arc<LoadedKernel>>>,
    variant_specs: Mutex<HashMap<&'static str, Arc<VariantSpec>>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("info", &self.info).finish()
    }
}

/// Sizes of one forward problem, derived from Q and K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemShape {
    pub batch: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
}

impl Runtime {
    /// A runtime on GPU `ordinal` with the default kernel cache folder.
    pub fn new(ordinal: usize) -> Result<Runtime, FlashError> {
        Self::with_cache(ordinal, KernelCache::new(None))
    }

    /// A runtime on GPU `ordinal` using `cache`. Errors (never panics) when no driver library
    /// is found, the driver fails to initialise or the device does not exist.
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
        Ok(Runtime {
            ctx,
            stream,
            info,
            cache,
            kernels: Mutex::new(HashMap::new()),
            variant_specs: Mutex::new(HashMap::new()),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
    /// The stream every launch of this runtime is issued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
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
            Some(c) if !c.family.runs_on(&self.info.arch) => {
                return Err(invalid(format!(
                "tile configuration {c:?} needs the {:?} kernel family, which {} ({}) cannot run",
                c.family, self.info.name, self.info.arch
            )))
            }
            Some(c) => c,
            None => flash_dsl::plan::default_config_for(spec, family),
        };
        flash_dsl::plan(spec, Some(config)).map_err(|e| FlashError::Plan {
            variant: spec.name.clone(),
            message: e.to_string(),
        })
    }

    /// Plans, emits, compiles (through the cache) and loads the kernel of `spec`; memoised per
    /// plan. Errors: the planner's, NVRTC's, the driver's, or a shared-memory request above the
    /// device's opt-in limit.
    pub fn load(
        &self,
        spec: &VariantSpec,
        config: Option<TileConfig>,
    ) -> Result<Arc<LoadedKernel>, FlashError> {
        let start = std::time::Instant::now();
        let plan = self.plan(spec, config)?;
        if let Some(k) = self.lock_kernels().get(&plan) {
            return Ok(k.clone());
        }
        if plan.smem_bytes > self.info.max_smem_optin {
            return Err(invalid(format!(
                "kernel `{}` needs {} bytes of shared memory per block; {} allows at most {}",
                plan.kernel_name, plan.smem_bytes, self.info.name, self.info.max_smem_optin
            )));
        }
        let src = flash_dsl::emit(&plan);
        let opts = CompileOptions::new(self.info.arch.clone());
        let (compiled, outcome) = self.cache.get_or_compile(&src, &opts)?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("binding the context", e))?;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(compiled.cubin.clone()))
            .map_err(|e| driver(&format!("loading the module of `{}`", src.kernel_name), e))?;
        let func = module
            .load_function(&src.kernel_name)
            .map_err(|e| driver(&format!("finding `{}` in its module", src.kernel_name), e))?;
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            plan.smem_bytes as i32,
        )
        .map_err(|e| {
            driver(
                &format!(
                    "raising the dynamic shared memory of `{}` to {} bytes",
                    src.kernel_name, plan.smem_bytes
                ),
                e,
            )
        })?;
        let k = Arc::new(LoadedKernel {
            plan: plan.clone(),
            compiled,
            outcome,
            load_ms: start.elapsed().as_secs_f64() * 1e3,
            func,
        });
        Ok(self.lock_kernels().entry(plan).or_insert(k).clone())
    }

    fn lock_kernels(&self) -> std::sync::MutexGuard<'_, HashMap<KernelPlan, Arc<LoadedKernel>>> {
        self.kernels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the forward pass of `kernel`: checks everything (see [`Runtime::forward`]), then
    /// launches on [`Runtime::stream`] (asynchronously).
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
        let launch = self.prepare(kernel, q, k, v, o, lse, params)?;
        self.launch_checked(&launch)
    }

    /// Loads `spec` (memoised) and runs it: [`Runtime::load`] then [`Runtime::forward`].
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
        let kernel = self.load(spec, config)?;
        self.forward(&kernel, q, k, v, o, lse, params)?;
        Ok(kernel)
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

    /// The spec of a macro-declared variant, parsed once.
    pub fn variant_spec<V: Variant>(&self) -> Result<Arc<VariantSpec>, FlashError> {
        let mut map = self.variant_specs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = map.get(V::NAME) {
            return Ok(s.clone());
        }
        let specs = flash_dsl::parse::parse_str(V::SOURCE).map_err(|diags| {
            FlashError::Parse(format!(
                "the source of variant `{}` does not parse: {}",
                V::NAME,
                diags
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        })?;
        let spec = specs
            .into_iter()
            .find(|s| s.name == V::NAME)
            .ok_or_else(|| invalid(format!("`{}` is not declared in its own source", V::NAME)))?;
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
        let launch = self.prepare(kernel, q, k, v, o, lse, params)?;
        for _ in 0..warmup {
            self.launch_checked(&launch)?;
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
            start
                .record(&self.stream)
                .map_err(|e| driver("recording an event", e))?;
            self.launch_checked(&launch)?;
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

    /// Every check of a launch; on success the packed argument struct and the grid.
    #[allow(clippy::too_many_arguments)]
    fn prepare<'a>(
        &'a self,
        kernel: &'a LoadedKernel,
        q: &TensorRef<'_>,
        k: &TensorRef<'_>,
        v: &TensorRef<'_>,
        o: &TensorMut<'_>,
        lse: &LseMut<'_>,
        params: &[ParamArg<'_>],
    ) -> Result<PreparedLaunch<'a>, FlashError> {
        let plan = &kernel.plan;
        let spec = &plan.spec;
        let shape = check_shapes(spec, &q.desc, &k.desc, &v.desc, &o.desc)?;
        let ProblemShape {
            batch,
            seq_q,
            seq_k,
            heads_q,
            heads_kv,
        } = shape;
        let me = ctx_id(&self.ctx);
        for (name, t) in [
            ("q", &q.desc),
            ("k", &k.desc),
            ("v", &v.desc),
            ("o", &o.desc),
        ] {
            check_layout(name, t)?;
            if t.ctx != me {
                return Err(invalid(format!(
                    "{name} lives in another CUDA context than this runtime's (gpu {})",
                    self.info.ordinal
                )));
            }
            self.check_allocation(name, t.ptr, t.extent().unwrap_or(0) * 2)?;
        }
        if !o.desc.non_overlapping() {
            return Err(invalid(format!(
                "o's strides {:?} make distinct elements share memory (shape {:?})",
                o.desc.strides, o.desc.shape
            )));
        }
        let lse_need = batch * heads_q * seq_q;
        if lse.len < lse_need {
            return Err(invalid(format!(
                "lse has {} elements; batch·heads_q·seq_q = {batch}·{heads_q}·{seq_q} = {lse_need} are needed",
                lse.len
            )));
        }
        if lse.ctx != me {
            return Err(invalid(
                "lse lives in another CUDA context than this runtime's",
            ));
        }
        if !lse.ptr.is_multiple_of(4) {
            return Err(invalid(format!(
                "lse's address {:#x} is not 4-byte aligned",
                lse.ptr
            )));
        }
        self.check_allocation("lse", lse.ptr, lse_need * 4)?;
        if plan.smem_bytes > self.info.max_smem_optin {
            return Err(invalid(format!(
                "kernel needs {} bytes of shared memory; the device allows {}",
                plan.smem_bytes, self.info.max_smem_optin
            )));
        }

        let header = KernelArgsHeader {
            q: q.desc.ptr,
            k: k.desc.ptr,
            v: v.desc.ptr,
            o: o.desc.ptr,
            lse: lse.ptr,
            strides: [
                three(q.desc.strides),
                three(k.desc.strides),
                three(v.desc.strides),
                three(o.desc.strides),
            ],
            batch: batch as i32,
            heads_q: heads_q as i32,
            heads_kv: heads_kv as i32,
            seq_q: seq_q as i32,
            seq_k: seq_k as i32,
            scale: spec.softmax_scale() as f32,
            scale_log2: (spec.softmax_scale() * std::f64::consts::LOG2_E) as f32,
            _pad: 0,
        };
        let mut bytes = vec![0u8; plan.params.total_size as usize];
        write_header(&mut bytes, &header);
        for (name, ptr, len) in pack_params(plan, shape, params, &mut bytes)? {
            self.check_allocation(&name, ptr, len)?;
        }
        // A tensor with an empty dimension has no TMA descriptor (the driver rejects size 0);
        // the kernel then has no tile to load and never reads one.
        let empty_tensor = [&q.desc, &k.desc, &v.desc]
            .iter()
            .any(|t| t.shape.contains(&0));
        if let (Some(at), false) = (plan.params.tma_offset, empty_tensor) {
            // TMA families read Q, K and V through descriptors of the checked views: boxes of
            // 64 columns × the tile's rows (BM for Q, BN for K and V).
            let bf16 = spec.dtype == DType::Bf16;
            let rows = [
                plan.config.block_m,
                plan.config.block_n,
                plan.config.block_n,
            ];
            for (i, (t, rows)) in [&q.desc, &k.desc, &v.desc]
                .into_iter()
                .zip(rows)
                .enumerate()
            {
                let [b_, s_, h_, d_] = t.shape.map(|x| x as u64);
                let st = t.strides.map(|x| x as u64 * 2);
                let map = crate::ffi::encode_tma_4d(t.ptr, bf16, [d_, s_, h_, b_], [st[1], st[2], st[0]], rows)
                    .map_err(|r| {
                        invalid(format!(
                            "encoding the TMA descriptor of {} (shape {:?}, strides {:?}) failed: {r:?}",
                            ["Q", "K", "V"][i],
                            t.shape,
                            t.strides
                        ))
                    })?;
                let o = at as usize + i * 128;
                bytes[o..o + 128].copy_from_slice(&map);
            }
        }

        let grid_x = plan.query_tiles(seq_q);
        if grid_x > i32::MAX as usize || heads_q > 65535 || batch > 65535 {
            return Err(invalid(format!(
                "grid ({grid_x}, {heads_q}, {batch}) exceeds the launch limits (2^31-1, 65535, 65535)"
            )));
        }
        // 8-byte aligned storage for the struct (it holds 8-byte pointers and strides).
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (w, c) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b8 = [0u8; 8];
            b8[..c.len()].copy_from_slice(c);
            *w = u64::from_le_bytes(b8);
        }
        Ok(PreparedLaunch {
            kernel,
            stream: &self.stream,
            args: words,
            grid: (grid_x as u32, heads_q as u32, batch as u32),
            empty: seq_q == 0 || batch == 0 || heads_q == 0,
        })
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
        if launch.empty {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver("binding the context", e))?;
        ffi::launch_prepared(launch).map_err(|e| {
            driver(
                &format!("launching `{}`", launch.kernel.plan.kernel_name),
                e,
            )
        })
    }
}

/// Checks params against the spec (count, kinds, element types, tensor lengths and alignment)
/// and writes them at the plan's offsets. Returns `(name, address, bytes)` of each non-empty
/// tensor param, whose allocation the caller still has to check with the driver.
pub fn pack_params(
    plan: &KernelPlan,
    shape: ProblemShape,
    params: &[ParamArg<'_>],
    bytes: &mut [u8],
) -> Result<Vec<(String, u64, usize)>, FlashError> {
    let spec = &plan.spec;
    if params.len() != spec.params.len() {
        return Err(invalid(format!(
            "`{}` declares {} param(s) ({}); got {}",
            spec.name,
            spec.params.len(),
            spec.params
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            params.len()
        )));
    }
    let sizes = Sizes {
        batch: shape.batch,
        heads: shape.heads_q,
        seq_q: shape.seq_q,
        seq_k: shape.seq_k,
    };
    let mut regions = Vec::new();
    for slot in &plan.params.slots {
        let decl = &spec.params[slot.param];
        let arg = &params[slot.param];
        let at = slot.offset as usize;
        let kind_name = |a: &ParamArg<'_>| match a {
            ParamArg::I32(_) => "an i32 scalar".to_string(),
            ParamArg::F32(_) => "an f32 scalar".to_string(),
            ParamArg::Tensor { elem, .. } => format!("an {} tensor", elem.name()),
        };
        match (&decl.kind, arg) {
            (ParamKind::Scalar(ScalarTy::I32), ParamArg::I32(x)) => {
                bytes[at..at + 4].copy_from_slice(&x.to_le_bytes())
            }
            (ParamKind::Scalar(ScalarTy::F32), ParamArg::F32(x)) => {
                bytes[at..at + 4].copy_from_slice(&x.to_le_bytes())
            }
            (
                ParamKind::Tensor { elem, dims },
                ParamArg::Tensor {
                    ptr, len, elem: e, ..
                },
            ) if elem == e => {
                let dims_n = tensor_shape(dims, sizes);
                let need: usize = dims_n.iter().product();
                if *len < need {
                    return Err(invalid(format!(
                        "param `{}` has {len} elements; its shape {dims_n:?} needs {need}",
                        decl.name
                    )));
                }
                if need > 0 {
                    if !ptr.is_multiple_of(4) {
                        return Err(invalid(format!(
                            "param `{}`'s address {ptr:#x} is not 4-byte aligned",
                            decl.name
                        )));
                    }
                    regions.push((format!("param `{}`", decl.name), *ptr, need * 4));
                }
                bytes[at..at + 8].copy_from_slice(&ptr.to_le_bytes())
            }
            (kind, a) => {
                let want = match kind {
                    ParamKind::Scalar(t) => format!("an {} scalar", t.name()),
                    ParamKind::Tensor { elem, .. } => format!("an {} tensor", elem.name()),
                };
                return Err(invalid(format!(
                    "param `{}` must be {want}; got {}",
                    decl.name,
                    kind_name(a)
                )));
            }
        }
    }
    Ok(regions)
}

/// A launch whose arguments passed every check: only [`Runtime::prepare`] builds one (the
/// fields are private to this module), so holding one is what [`ffi::launch_prepared`] needs.
pub(crate) struct PreparedLaunch<'a> {
    /// The kernel the arguments were checked against.
    kernel: &'a LoadedKernel,
    /// The runtime's stream, which the views were taken on.
    stream: &'a CudaStream,
    args: Vec<u64>,
    grid: (u32, u32, u32),
    /// Nothing to compute (`seq_q == 0`, or no batch/heads).
    empty: bool,
}

impl<'a> PreparedLaunch<'a> {
    pub(crate) fn kernel(&self) -> &'a LoadedKernel {
        self.kernel
    }
    pub(crate) fn function(&self) -> &'a CudaFunction {
        &self.kernel.func
    }
    pub(crate) fn stream(&self) -> &'a CudaStream {
        self.stream
    }
    /// The packed argument struct, 8-byte words.
    pub(crate) fn args(&self) -> &[u64] {
        &self.args
    }
    pub(crate) fn grid(&self) -> (u32, u32, u32) {
        self.grid
    }
}

fn three(s: [i64; 4]) -> [i64; 3] {
    [s[0], s[1], s[2]]
}

/// Serialises the header field by field at its `repr(C)` offsets (tested below against the
/// Rust struct), so no byte view of a struct is needed.
fn write_header(out: &mut [u8], h: &KernelArgsHeader) {
    let mut at = 0usize;
    let mut put = |b: &[u8]| {
        out[at..at + b.len()].copy_from_slice(b);
        at += b.len();
    };
    for p in [h.q, h.k, h.v, h.o, h.lse] {
        put(&p.to_le_bytes());
    }
    for t in h.strides {
        for s in t {
            put(&s.to_le_bytes());
        }
    }
    for x in [h.batch, h.heads_q, h.heads_kv, h.seq_q, h.seq_k] {
        put(&x.to_le_bytes());
    }
    put(&h.scale.to_le_bytes());
    put(&h.scale_log2.to_le_bytes());
    put(&h._pad.to_le_bytes());
}

/// Shape agreement of Q, K, V, O with the spec and each other.
pub fn check_shapes(
    spec: &VariantSpec,
    q: &TensorDesc,
    k: &TensorDesc,
    v: &TensorDesc,
    o: &TensorDesc,
) -> Result<ProblemShape, FlashError> {
    for (name, t) in [("q", q), ("k", k), ("v", v), ("o", o)] {
        if !t.elem.matches(spec.dtype) {
            return Err(invalid(format!(
                "{name} holds {} elements; `{}` is a {} variant",
                t.elem.name(),
                spec.name,
                spec.dtype.name()
            )));
        }
    }
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    for (name, t, d) in [("q", q, dqk), ("k", k, dqk), ("v", v, dv), ("o", o, dv)] {
        if t.shape[3] != d {
            return Err(invalid(format!(
                "{name}'s head dim is {}; `{}` has head dim {d}",
                t.shape[3], spec.name
            )));
        }
    }
    let [batch, seq_q, heads_q, _] = q.shape;
    let [bk, seq_k, heads_kv, _] = k.shape;
    if bk != batch || v.shape[0] != batch || o.shape[0] != batch {
        return Err(invalid(format!(
            "batch sizes disagree: q {batch}, k {bk}, v {}, o {}",
            v.shape[0], o.shape[0]
        )));
    }
    if v.shape[1] != seq_k || v.shape[2] != heads_kv {
        return Err(invalid(format!(
            "v is [.., {}, {}, ..]; k is [.., {seq_k}, {heads_kv}, ..]",
            v.shape[1], v.shape[2]
        )));
    }
    if o.shape[1] != seq_q || o.shape[2] != heads_q {
        return Err(invalid(format!(
            "o is [.., {}, {}, ..]; q is [.., {seq_q}, {heads_q}, ..]",
            o.shape[1], o.shape[2]
        )));
    }
    if heads_kv == 0 || heads_q % heads_kv != 0 {
        return Err(invalid(format!(
            "heads_q {heads_q} must be a multiple of heads_kv {heads_kv}"
        )));
    }
    for (name, n) in [
        ("seq_q", seq_q),
        ("seq_k", seq_k),
        ("batch", batch),
        ("heads_q", heads_q),
    ] {
        if n > i32::MAX as usize {
            return Err(invalid(format!(
                "{name} is {n}; the kernel's limit is {}",
                i32::MAX
            )));
        }
    }
    Ok(ProblemShape {
        batch,
        seq_q,
        seq_k,
        heads_q,
        heads_kv,
    })
}

/// Strides, alignment and extent of one tensor.
pub fn check_layout(name: &str, t: &TensorDesc) -> Result<(), FlashError> {
    if t.extent().is_some_and(|e| e == 0) {
        return Ok(()); // nothing is read or written
    }
    if t.strides[3] != 1 {
        return Err(invalid(format!(
            "{name}'s last dimension must be contiguous (stride 1); got stride {}",
            t.strides[3]
        )));
    }
    for (i, s) in t.strides[..3].iter().enumerate() {
        // A dimension of size 1 is never stepped along; its stride is irrelevant.
        if t.shape[i] > 1 && (*s < 0 || s % 8 != 0) {
            return Err(invalid(format!(
                "{name}'s stride {s} (dim {i}) must be a non-negative multiple of 8 elements (16-byte rows)"
            )));
        }
    }
    if !t.ptr.is_multiple_of(16) {
        return Err(invalid(format!(
            "{name}'s address {:#x} must be 16-byte aligned",
            t.ptr
        )));
    }
    let Some(extent) = t.extent() else {
        return Err(invalid(format!(
            "{name}'s shape {:?} and strides {:?} overflow 64-bit offsets",
            t.shape, t.strides
        )));
    };
    if extent > t.len {
        return Err(invalid(format!(
            "{name} needs {extent} elements for shape {:?} and strides {:?}; its buffer has {}",
            t.shape, t.strides, t.len
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(shape: [usize; 4], strides: [i64; 4], len: usize) -> TensorDesc {
        TensorDesc {
            ptr: 0x1000,
            len,
            shape,
            strides,
            elem: ElemType::Bf16,
            ctx: 0,
        }
    }

    #[test]
    fn default_family_by_arch_and_flash_family() {
        assert_eq!(
            default_family("sm_90a", None).unwrap(),
            KernelFamily::Sm90Ws
        );
        assert_eq!(default_family("sm_80", None).unwrap(), KernelFamily::Sm80);
        assert_eq!(
            default_family("sm_90a", Some("sm90")).unwrap(),
            KernelFamily::Sm90
        );
        let e = default_family("sm_90a", Some("hopper"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sm80, sm90 or sm90ws") && e.contains("hopper"),
            "{e}"
        );
        let e = default_family("sm_80", Some("sm90ws"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Sm90Ws") && e.contains("sm_80"), "{e}");
    }

    #[test]
    fn header_bytes_follow_the_repr_c_layout() {
        let h = KernelArgsHeader {
            q: 1,
            k: 2,
            v: 3,
            o: 4,
            lse: 5,
            strides: [[6, 7, 8], [9, 10, 11], [12, 13, 14], [15, 16, 17]],
            batch: 18,
            heads_q: 19,
            heads_kv: 20,
            seq_q: 21,
            seq_k: 22,
            scale: 0.5,
            scale_log2: 0.25,
            _pad: 23,
        };
        let mut b = vec![0u8; flash_dsl::args::HEADER_SIZE as usize];
        write_header(&mut b, &h);
        let at = |off: usize, n: usize| &b[off..off + n];
        use std::mem::offset_of;
        assert_eq!(at(offset_of!(KernelArgsHeader, lse), 8), 5u64.to_le_bytes());
        assert_eq!(
            at(offset_of!(KernelArgsHeader, strides) + 8 * 11, 8),
            17i64.to_le_bytes()
        );
        assert_eq!(
            at(offset_of!(KernelArgsHeader, seq_k), 4),
            22i32.to_le_bytes()
        );
        assert_eq!(
            at(offset_of!(KernelArgsHeader, scale_log2), 4),
            0.25f32.to_le_bytes()
        );
        assert_eq!(
            at(offset_of!(KernelArgsHeader, _pad), 4),
            23i32.to_le_bytes()
        );
    }

    #[test]
    fn layout_checks_name_value_and_limit() {
        let s = [1, 2, 3, 64];
        let ok = desc(s, contiguous_strides(s), 384);
        check_layout("q", &ok).unwrap();
        let short = desc(s, contiguous_strides(s), 383);
        let e = check_layout("q", &short).unwrap_err().to_string();
        assert!(e.contains("384") && e.contains("383"), "{e}");
        let odd = desc(s, [384, 196, 64, 1], 10_000);
        let e = check_layout("k", &odd).unwrap_err().to_string();
        assert!(e.contains("196"), "{e}");
        let last = desc(s, [384, 192, 64, 2], 10_000);
        assert!(check_layout("v", &last)
            .unwrap_err()
            .to_string()
            .contains("contiguous"));
        let mut mis = ok;
        mis.ptr = 0x1008;
        assert!(check_layout("o", &mis)
            .unwrap_err()
            .to_string()
            .contains("16-byte"));
    }

    #[test]
    fn strided_views_and_overlap() {
        // q inside a packed [b, s, 3, h, d] buffer.
        let q = desc(
            [2, 5, 4, 64],
            [5 * 3 * 4 * 64, 3 * 4 * 64, 64, 1],
            2 * 5 * 3 * 4 * 64,
        );
        check_layout("q", &q).unwrap();
        assert!(q.non_overlapping());
        let alias = desc([2, 5, 4, 64], [0, 256, 64, 1], 100_000);
        assert!(!alias.non_overlapping());
        let e = desc([2, 0, 4, 64], [0, 0, 0, 0], 0);
        assert_eq!(e.extent(), Some(0));
        check_layout("k", &e).unwrap();
    }

    fn plan_of(src: &str) -> KernelPlan {
        let spec = flash_dsl::parse::parse_str(src).expect("parses").remove(0);
        flash_dsl::plan(&spec, None).expect("plans")
    }

    const SHAPE: ProblemShape = ProblemShape {
        batch: 2,
        seq_q: 100,
        seq_k: 300,
        heads_q: 4,
        heads_kv: 2,
    };

    #[test]
    fn params_are_checked_and_packed_at_the_plan_offsets() {
        let plan = plan_of(
            "Doc { head_dim: 64, dtype: bf16, params: { cap: f32, doc: [i32; seq], n: i32 }, \
             mask: doc[q] == doc[k] && k < n, score: cap * tanh(s / cap) }",
        );
        let mut bytes = vec![0u8; plan.params.total_size as usize];
        let ok = [
            ParamArg::F32(30.0),
            ParamArg::raw_tensor(0x2000, 300, ScalarTy::I32),
            ParamArg::I32(7),
        ];
        let regions = pack_params(&plan, SHAPE, &ok, &mut bytes).unwrap();
        assert_eq!(regions, vec![("param `doc`".to_string(), 0x2000, 1200)]);
        let off = |i: usize| plan.params.slots[i].offset as usize;
        assert_eq!(bytes[off(0)..off(0) + 4], 30f32.to_le_bytes());
        assert_eq!(bytes[off(1)..off(1) + 8], 0x2000u64.to_le_bytes());
        assert_eq!(bytes[off(2)..off(2) + 4], 7i32.to_le_bytes());

        let mut err = |args: &[ParamArg<'_>]| {
            pack_params(&plan, SHAPE, args, &mut bytes)
                .unwrap_err()
                .to_string()
        };
        // seq = max(seq_q, seq_k) = 300 elements.
        let short = [
            ok[0],
            ParamArg::raw_tensor(0x2000, 299, ScalarTy::I32),
            ok[2],
        ];
        let e = err(&short);
        assert!(
            e.contains("299") && e.contains("300") && e.contains("doc"),
            "{e}"
        );
        let e = err(&ok[..2]);
        assert!(e.contains("3 param(s)") && e.contains("got 2"), "{e}");
        let kind = [ParamArg::I32(30), ok[1], ok[2]];
        let e = err(&kind);
        assert!(
            e.contains("`cap` must be an f32 scalar; got an i32 scalar"),
            "{e}"
        );
        let elem = [
            ok[0],
            ParamArg::raw_tensor(0x2000, 300, ScalarTy::F32),
            ok[2],
        ];
        assert!(err(&elem).contains("must be an i32 tensor"));
        let misaligned = [
            ok[0],
            ParamArg::raw_tensor(0x2002, 300, ScalarTy::I32),
            ok[2],
        ];
        assert!(err(&misaligned).contains("4-byte aligned"));
    }

    #[test]
    fn shapes_must_agree() {
        let plan = plan_of("C { head_dim: 64, dtype: bf16, mask: causal }");
        let t = |shape: [usize; 4], elem| TensorDesc {
            elem,
            ..desc(shape, contiguous_strides(shape), usize::MAX)
        };
        let q = t([2, 100, 4, 64], ElemType::Bf16);
        let k = t([2, 300, 2, 64], ElemType::Bits16);
        let o = t([2, 100, 4, 64], ElemType::Bf16);
        let got = check_shapes(&plan.spec, &q, &k, &k, &o).unwrap();
        assert_eq!(got, SHAPE);
        let f16 = t([2, 100, 4, 64], ElemType::F16);
        let e = check_shapes(&plan.spec, &f16, &k, &k, &o)
            .unwrap_err()
            .to_string();
        assert!(e.contains("f16") && e.contains("bf16"), "{e}");
        let k3 = t([2, 300, 3, 64], ElemType::Bf16);
        let e = check_shapes(&plan.spec, &q, &k3, &k3, &o)
            .unwrap_err()
            .to_string();
        assert!(e.contains("multiple of heads_kv 3"), "{e}");
        let d = t([2, 100, 4, 128], ElemType::Bf16);
        let e = check_shapes(&plan.spec, &d, &k, &k, &o)
            .unwrap_err()
            .to_string();
        assert!(e.contains("128") && e.contains("64"), "{e}");
        let kb = t([1, 300, 2, 64], ElemType::Bf16);
        assert!(check_shapes(&plan.spec, &q, &kb, &kb, &o)
            .unwrap_err()
            .to_string()
            .contains("batch"));
    }
}
