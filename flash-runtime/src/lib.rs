//! flash-runtime: compile generated kernels with NVRTC, cache them, launch them through cudarc.

pub mod variant;

pub use variant::{ParamArg, Variant};
