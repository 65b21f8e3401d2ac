//! flash-runtime: compiles the kernels `flash-dsl` generates with NVRTC, caches them in memory
//! and on disk, launches them through cudarc, and autotunes their tile sizes.
//!
//! # The pipeline
//!
//! ```text
//! declaration ─► VariantSpec ─► KernelPlan ─► CudaSource ─► CompiledKernel ─► LoadedKernel ─► launch
//!   flash_dsl::parse/validate  ::plan          ::emit       compile + cache    build            launch
//! ```
//!
//! [`build`] is the one path from a plan to a loaded kernel (emit → compile through the
//! [`cache`] → load); [`launch`] holds the [`Runtime`], which checks every launch against the
//! plan's operand list (shapes, strides, dtypes, alignment, shared memory against the device)
//! and packs the kernel's argument struct from the same list; [`tune`] is the autotuner;
//! [`cli`] the `flash` command. Everything a user can cause or meet is a [`FlashError`], never
//! a panic.
//!
//! # The three stories
//!
//! **Declare and launch.** `flash_macros::attention!` turns a declaration into a unit struct
//! implementing [`Variant`] and a typed params struct; [`Runtime::forward_variant`] and
//! [`Runtime::backward_variant`] plan, generate, compile (once, then from the cache) and launch
//! it. `.flash` files go through `flash_dsl::files` and the untyped `Runtime::forward_spec`.
//!
//! **Snapshot.** [`Variant::generate`] hands out the plans and the CUDA of every kernel of a
//! variant for a chosen kernel family, with no GPU and no NVRTC and the same text on every
//! machine; snapshot `summary()` and each kernel's `snapshot_text()` with insta to review any
//! change a declaration edit or a flash upgrade makes to the kernels
//! (`examples/tests/snapshot_kernels.rs` is the recipe). [`build::compile_generated`] compiles
//! them with NVRTC for an architecture, also without a GPU.
//!
//! **Autotune.** [`Runtime::tune`] (or `flash tune FILE --shape …`) times every valid tile
//! configuration of a variant at a shape, checks each against float64, and writes what it
//! learned beside the kernel cache; [`Runtime::load_tuned`] and [`Runtime::backward_tuned`]
//! launch with the remembered configuration on later runs, by GPU and shape bucket.
//!
//! ```no_run
//! use flash_runtime::cudarc::driver::CudaSlice;
//! use flash_runtime::{FlashError, LseMut, Runtime, TensorMut, TensorRef};
//!
//! flash_macros::attention! {
//!     /// Causal attention with a runtime soft-cap on the logits.
//!     pub Softcap { head_dim: 64, dtype: bf16, params: { cap: f32 }, mask: causal, score: softcap(s, cap) }
//! }
//!
//! fn run(q: &CudaSlice<u16>, k: &CudaSlice<u16>, v: &CudaSlice<u16>,
//!        o: &mut CudaSlice<u16>, lse: &mut CudaSlice<f32>) -> Result<(), FlashError> {
//!     let rt = Runtime::new(0)?; // an error, not a panic, without a GPU
//!     let s = rt.stream();
//!     let shape = [2, 512, 4, 64]; // [batch, seq, heads, head_dim]
//!     let (q, k, v) = (TensorRef::new(q, shape, s), TensorRef::new(k, shape, s), TensorRef::new(v, shape, s));
//!     let mut o = TensorMut::new(o, shape, s);
//!     let mut lse = LseMut::new(lse, s);
//!     rt.forward_variant::<Softcap>(&q, &k, &v, &mut o, &mut lse, &SoftcapParams::new(30.0))?;
//!     rt.synchronize()
//! }
//! ```
//!
//! NVRTC and the driver library are found at run time (`FLASH_NVRTC_PATH`, `CUDA_PATH`, the
//! standard folders; see [`libs`]); nothing links against CUDA at build time.
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
pub use launch::{
    BlockMap, Fp8Inputs, Fp8V, LseMut, PackedQueries, PagedKv, ProblemShape, Runtime, TensorMut,
    TensorRef, VarlenBatch,
};
pub use variant::{ParamArg, Variant};
