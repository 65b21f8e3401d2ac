//! flash-dsl: the attention-variant language and the generator.
//!
//! The pipeline, one plain function per arrow:
//!
//! ```text
//! tokens ──parse──► ast::Decl ──validate──► VariantSpec ──plan──► KernelPlan ──emit──► CudaSource
//! ```
//!
//! The same parser serves the `attention!` proc macro (compile time) and `.flash` files read by
//! the CLI (run time). [`model`] holds the CPU models of the computation (float64 reference,
//! tile emulation) that tests and the GPU check compare kernels against.

pub mod ast;
pub mod deriv;
pub mod diag;
pub mod dropout;
pub mod emit;
pub mod eval;
pub mod files;
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
