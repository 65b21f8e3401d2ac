//! The one path from a plan to a loaded kernel: emit → compile (through the cache) → load into
//! a context. The runtime, the CLI and the tuner all go through [`compile_plan`]; the runtime
//! adds [`load_module`].

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{result, CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;
use flash_dsl::generated::Generated;
use flash_dsl::{CudaSource, KernelPlan};

use crate::cache::{CacheOutcome, KernelCache};
use crate::compile::{CompileOptions, CompiledKernel};
use crate::device::DeviceInfo;
use crate::error::FlashError;

/// A plan's CUDA and its CUBIN.
#[derive(Debug, Clone)]
pub struct Built {
    /// The CUDA C++ that `flash_dsl::emit` generated for the plan (the kernel's name and text).
    pub source: CudaSource,
    /// The CUBIN NVRTC produced for it, with the kernel's register/shared-memory usage; shared
    /// with the cache's in-memory map.
    pub compiled: Arc<CompiledKernel>,
    /// How the CUBIN was obtained (memory, disk, fresh compile).
    pub outcome: CacheOutcome,
}

/// Emits `plan` and compiles it for `arch` through `cache`. Needs NVRTC, no GPU; errors are
/// those of [`crate::compile::compile`].
///
/// ```
/// use flash_dsl::plan::{default_config_for, KernelFamily};
/// use flash_runtime::{compile_plan, CacheOutcome, FlashError, KernelCache};
///
/// let decl = "pub Causal { head_dim: 64, dtype: bf16, mask: causal }";
/// let spec = flash_dsl::parse::parse_str(decl).unwrap().remove(0);
/// let plan = flash_dsl::plan(&spec, Some(default_config_for(&spec, KernelFamily::Sm80))).unwrap();
/// let dir = tempfile::tempdir().unwrap();
/// let cache = KernelCache::new(Some(dir.path().to_path_buf()));
/// match compile_plan(&plan, "sm_80", &cache) {
///     Ok(built) => {
///         assert_eq!(built.outcome, CacheOutcome::Miss);
///         assert_eq!(built.source.kernel_name, plan.kernel_name);
///         assert_eq!(built.compiled.arch, "sm_80");
///         // Asked again, the kernel comes from memory; and one entry was published on disk.
///         let again = compile_plan(&plan, "sm_80", &cache).unwrap();
///         assert_eq!(again.outcome, CacheOutcome::MemoryHit);
///         assert_eq!(cache.list().len(), 1);
///     }
///     // Without NVRTC (set FLASH_NVRTC_PATH to point at it) the error says what was searched.
///     Err(FlashError::LibraryNotFound { lib, .. }) => assert_eq!(lib, "nvrtc"),
///     Err(e) => panic!("{e}"),
/// }
/// ```
pub fn compile_plan(
    plan: &KernelPlan,
    arch: &str,
    cache: &KernelCache,
) -> Result<Built, FlashError> {
    compile_plan_with(plan, &CompileOptions::new(arch), cache)
}

/// Compiles every kernel of `generated` (see [`crate::Variant::generate`]) for `arch` through
/// `cache`, in launch order. Needs NVRTC, not a GPU: a user's CI can check that a declaration
/// still compiles, and read each kernel's registers, shared memory and spills. A kernel whose
/// family cannot run on `arch` (the wgmma kernels anywhere but `sm_90a`) is an error naming
/// both.
pub fn compile_generated(
    generated: &Generated,
    arch: &str,
    cache: &KernelCache,
) -> Result<Vec<Built>, FlashError> {
    let opts = CompileOptions::new(arch);
    generated
        .kernels()
        .map(|k| {
            let family = k.plan.config.family;
            if !family.runs_on(arch) {
                return Err(FlashError::Invalid(format!(
                    "kernel `{}` is of the {family:?} family, which does not run on {arch} \
                     (the wgmma families need sm_90a)",
                    k.source.kernel_name
                )));
            }
            let (compiled, outcome) = cache.get_or_compile(&k.source, &opts)?;
            Ok(Built {
                source: k.source.clone(),
                compiled,
                outcome,
            })
        })
        .collect()
}

/// [`compile_plan`] with explicit NVRTC options (e.g. `flash compile --nvrtc-opt`); the options
/// are part of the cache key.
pub fn compile_plan_with(
    plan: &KernelPlan,
    opts: &CompileOptions,
    cache: &KernelCache,
) -> Result<Built, FlashError> {
    let source = flash_dsl::emit(plan);
    let (compiled, outcome) = cache.get_or_compile(&source, opts)?;
    Ok(Built {
        source,
        compiled,
        outcome,
    })
}

/// A kernel loaded into a [`Runtime`](crate::Runtime)'s context, ready to launch.
#[derive(Debug)]
pub struct LoadedKernel {
    /// The plan the kernel was generated from; launches check and pack their arguments against
    /// its operand list, grid and shared-memory size.
    pub plan: KernelPlan,
    /// The CUBIN the module was loaded from, with the kernel's resource usage.
    pub compiled: Arc<CompiledKernel>,
    /// How the CUBIN was obtained (memory, disk, fresh compile).
    pub outcome: CacheOutcome,
    /// Milliseconds spent in emit + compile/cache + module load.
    pub load_ms: f64,
    pub(crate) func: CudaFunction,
}

fn driver(what: &str, e: result::DriverError) -> FlashError {
    FlashError::Driver(format!("{what}: {e:?}"))
}

/// Compiles `plan` (through the cache) and loads it into `ctx`, raising the function's dynamic
/// shared memory limit to the plan's. A request above the device's opt-in limit is an error
/// naming both.
pub fn load_module(
    plan: KernelPlan,
    ctx: &Arc<CudaContext>,
    info: &DeviceInfo,
    cache: &KernelCache,
) -> Result<LoadedKernel, FlashError> {
    let start = std::time::Instant::now();
    if plan.smem_bytes() > info.max_smem_optin {
        return Err(FlashError::Invalid(format!(
            "kernel `{}` needs {} bytes of shared memory per block; {} allows at most {}",
            plan.kernel_name,
            plan.smem_bytes(),
            info.name,
            info.max_smem_optin
        )));
    }
    let built = compile_plan(&plan, &info.arch, cache)?;
    let name = &built.source.kernel_name;
    ctx.bind_to_thread()
        .map_err(|e| driver("binding the context", e))?;
    let module = ctx
        .load_module(Ptx::from_binary(built.compiled.cubin.clone()))
        .map_err(|e| driver(&format!("loading the module of `{name}`"), e))?;
    let func = module
        .load_function(name)
        .map_err(|e| driver(&format!("finding `{name}` in its module"), e))?;
    func.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        plan.smem_bytes() as i32,
    )
    .map_err(|e| {
        driver(
            &format!(
                "raising the dynamic shared memory of `{name}` to {} bytes",
                plan.smem_bytes()
            ),
            e,
        )
    })?;
    Ok(LoadedKernel {
        plan,
        compiled: built.compiled,
        outcome: built.outcome,
        load_ms: start.elapsed().as_secs_f64() * 1e3,
        func,
    })
}
