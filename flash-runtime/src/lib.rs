//! flash-runtime: compile generated kernels with NVRTC, cache them, launch them through cudarc.
//!
//! `unsafe` lives in one module, `ffi` (private, `src/ffi.rs`): the crate denies `unsafe_code`
//! everywhere else.

#![deny(unsafe_code)]

pub mod cache;
pub mod cli;
pub mod cli_run;
pub mod cli_tune;
pub mod compile;
pub mod error;
#[allow(unsafe_code)]
mod ffi;
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
