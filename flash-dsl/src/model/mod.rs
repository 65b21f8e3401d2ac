//! CPU models of the computation, the ground truth the GPU kernels are tested against.
//!
//! Nothing here runs in production: `reference` evaluates a variant in float64 (and, for the
//! correctness rule, in plain same precision), `emulate` walks the plan's tiles the way a kernel
//! does so that tile skipping can be checked without a GPU. Tests, the GPU check and the
//! autotuner's spot check use them.

pub mod backward;
pub mod emulate;
pub mod reference;
