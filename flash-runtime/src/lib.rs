//! flash-runtime: compile generated kernels with NVRTC, cache them, launch them through cudarc.
//!
//! The pipeline: [`build`] (plan → emit → compile through the [`cache`] → load), [`launch`]
//! (the [`Runtime`]: checks and packs a launch from the plan's operand list), [`tune`]
//! (autotuning), [`cli`] (the `flash` command).
//!
//! `unsafe` lives in one module, `ffi` (private, `src/ffi.rs`): the crate denies `unsafe_code`
//! everywhere else. Module dependencies form a DAG: `ffi` sees only `prepared` (the checked
//! launch), never `launch` itself.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod build;
pub mod cache;
pub mod cli;
pub mod compile;
pub mod device;
pub mod error;
#[allow(unsafe_code)]
mod ffi;
pub mod launch;
pub mod libs;
pub mod npy;
mod prepared;
pub mod tune;
pub mod variant;

pub use build::{compile_plan, Built, LoadedKernel};
pub use cache::{CacheOutcome, KernelCache};
pub use compile::{compile, nvrtc_version, CompileOptions, CompiledKernel, Resources};
pub use cudarc;
pub use error::FlashError;
pub use flash_dsl;
pub use launch::{BlockMap, LseMut, ProblemShape, Runtime, TensorMut, TensorRef};
pub use variant::{ParamArg, Variant};
