//! flash-dsl: the attention-variant language and the kernel generator.
//!
//! A variant is declared once — its head dimension, dtype, mask, score modification, params,
//! dropout and block sparsity — and flash plans and emits the specialised CUDA of its forward
//! and backward kernels. This crate does everything up to the CUDA text; it needs no GPU and no
//! CUDA toolkit. `flash-runtime` compiles, caches, launches and autotunes what it produces, and
//! `flash-macros` provides `attention!` for declarations in Rust source.
//!
//! # The pipeline, one plain function per arrow
//!
//! ```text
//! tokens ──parse──► ast::Decl ──validate──► VariantSpec ──plan──► KernelPlan ──emit──► CudaSource
//! ```
//!
//! - [`parse`]: the same parser serves the `attention!` proc macro (compile time, spans on
//!   every error) and `.flash` files read by the CLI ([`files`], run time).
//! - [`validate`]: names, types and dimensions resolved; shorthands (`causal`, `window`,
//!   `softcap`, `alibi`, …) lowered; the result is a [`VariantSpec`].
//! - [`plan`](mod@plan): tile configuration per kernel family, operands and argument layout, the mask
//!   split into affine atoms (decidable per tile from its corners) and opaque parts, block maps
//!   for data-dependent masks, the backward pipeline; a [`KernelPlan`] per kernel.
//! - [`emit`](mod@emit): handlebars skeletons (`templates/`, carried inside this package) filled from the
//!   plan; equal plans give byte-identical source.
//!
//! [`deriv`] differentiates the score symbolically for the backward pass; [`model`] holds the
//! CPU models (float64 reference, plain same-precision implementation, tile emulation) that
//! tests and the GPU check compare kernels against; [`eval`] evaluates declarations at a point.
//!
//! ```
//! let spec = flash_dsl::parse::parse_str(
//!     "pub Local { head_dim: 64, dtype: bf16, mask: causal && q - k < 1024 }",
//! )
//! .expect("a valid declaration")
//! .remove(0);
//! let plan = flash_dsl::plan(&spec, None).unwrap();
//! let cuda = flash_dsl::emit(&plan);
//! assert!(cuda.source.contains(&plan.kernel_name));
//!
//! // Errors point at the offending tokens.
//! let errors = flash_dsl::parse::parse_str("Bad { head_dim: 64, dtype: bf16, mask: q >= kk }")
//!     .unwrap_err();
//! assert!(errors[0].to_string().contains("kk"));
//! ```
//!
//! # The three stories
//!
//! **Declare**: in Rust with `flash_macros::attention!`, or in a `.flash` file for the `flash`
//! command — the same grammar. **Snapshot**: [`generated::generate`] (or
//! `flash_runtime::Variant::generate`) gives the plans and CUDA of every kernel of a variant,
//! deterministic across machines, to snapshot with insta. **Autotune**: the planner's tile
//! configurations ([`plan::tile`]) are the search space `flash-runtime`'s tuner times on the
//! GPU.

#![warn(missing_docs)]

pub mod ast;
pub mod deriv;
pub mod diag;
pub mod dropout;
pub mod emit;
pub mod eval;
pub mod files;
pub mod fp8;
pub mod generated;
pub mod model;
pub mod parse;
pub mod plan;
pub mod rng;
pub mod sparsity;
pub mod spec;
pub mod validate;

pub use diag::Diagnostic;
pub use emit::{emit, CudaSource};
pub use plan::{plan, KernelPlan, TileConfig};
pub use spec::{DType, VariantSpec};

/// Version of the generator, part of every compile-cache key: bump it whenever the emitted
/// source for an unchanged plan may change meaning.
pub const GENERATOR_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "+gen2");
