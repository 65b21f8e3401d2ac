//! CUDA emission. (Owned by the kernel work.)
use crate::plan::KernelPlan;

/// Generated CUDA for one plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CudaSource {
    /// Entry point name.
    pub kernel_name: String,
    /// The translation unit (includes only the named headers below).
    pub source: String,
    /// `(include name, contents)` pairs handed to NVRTC.
    pub headers: Vec<(String, String)>,
    pub smem_bytes: u32,
    pub threads: u32,
}

pub fn emit(_plan: &KernelPlan) -> CudaSource {
    todo!("emit")
}
