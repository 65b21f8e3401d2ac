//! flash-runtime: compile generated kernels with NVRTC, cache them, launch them through cudarc.

pub mod cache;
pub mod cli;
pub mod cli_run;
pub mod cli_tune;
pub mod compile;
pub mod error;
pub mod launch;
pub mod libs;
pub mod npy;
pub mod tune;
pub mod variant;

pub use cache::{CacheOutcome, KernelCache};
pub use compile::{compile, nvrtc_version, CompileOptions, CompiledKernel, Resources};
pub use cudarc;
pub use error::FlashError;
pub use launch::{LoadedKernel, LseMut, Runtime, TensorMut, TensorRef};
pub use variant::{ParamArg, Variant};
