//! The device a runtime runs on, and the kernel family it defaults to. Below both `launch`
//! (the runtime) and `build` (which checks a plan's shared memory against the device).

use flash_dsl::plan::KernelFamily;

use crate::error::FlashError;

fn invalid(msg: impl Into<String>) -> FlashError {
    FlashError::Invalid(msg.into())
}

/// The device a [`Runtime`](crate::Runtime) runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The CUDA device ordinal (`0` for the first GPU), as passed to `CudaContext::new`.
    pub ordinal: usize,
    /// The device's marketing name as the driver reports it (e.g. `NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// `(major, minor)`, e.g. `(9, 0)` for Hopper, `(8, 0)` for A100.
    pub compute_capability: (i32, i32),
    /// NVRTC target: `sm_90a` on Hopper (kernels may use sm_90a-only instructions), `sm_XY`
    /// elsewhere.
    pub arch: String,
    /// Number of streaming multiprocessors; persistent kernels size their grid by it.
    pub sm_count: u32,
    /// Dynamic shared memory a block may opt into (`MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`).
    pub max_smem_optin: u32,
    /// The kernel family plans default to: the fastest this GPU runs, or `FLASH_FAMILY`.
    pub default_family: KernelFamily,
}

/// The family a `FLASH_FAMILY` value names (see [`KernelFamily::tag`]); anything else is an
/// error naming the value.
pub fn parse_family(value: &str) -> Result<KernelFamily, FlashError> {
    KernelFamily::from_tag(value).ok_or_else(|| {
        invalid(format!(
            "FLASH_FAMILY must be sm80, sm90 or sm90ws; got `{value}`"
        ))
    })
}

/// The default kernel family for a GPU of `arch`: `FLASH_FAMILY` (`sm80`, `sm90`, `sm90ws`)
/// when set, else the fastest family the architecture runs. An unknown name, or a family the
/// GPU cannot run, is an error naming the value.
pub fn default_family(arch: &str, env: Option<&str>) -> Result<KernelFamily, FlashError> {
    let family = match env {
        None => return Ok(KernelFamily::for_arch(arch)),
        Some(v) => parse_family(v)?,
    };
    if !family.runs_on(arch) {
        return Err(invalid(format!(
            "FLASH_FAMILY asks for the {family:?} kernel family, which {arch} cannot run"
        )));
    }
    Ok(family)
}
