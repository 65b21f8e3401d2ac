//! The contract between the `attention!` macro and the runtime.
//!
//! The macro turns each declaration into a unit struct implementing [`Variant`] and a typed
//! params struct; the runtime re-parses [`Variant::SOURCE`] with the same parser (so the macro
//! never has to serialise a spec) and receives params as a checked list of [`ParamArg`].

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use flash_dsl::dropout::DropoutRng;
use flash_dsl::spec::ScalarTy;

/// A declared attention variant.
pub trait Variant {
    /// The declared name.
    const NAME: &'static str;
    /// The declaration's tokens, re-parsable by `flash_dsl::parse::parse_str`.
    const SOURCE: &'static str;
    /// The typed runtime parameters (tensors and scalars) of this variant.
    type Params<'a>;
    /// The parameters in declaration order.
    fn param_args<'a>(params: &Self::Params<'a>, stream: &CudaStream) -> Vec<ParamArg<'a>>;
}

/// One runtime parameter value, in declaration order.
#[derive(Debug, Clone, Copy)]
pub enum ParamArg<'a> {
    /// A device tensor: pointer, element count and element type.
    Tensor {
        ptr: u64,
        len: usize,
        elem: ScalarTy,
        _borrow: PhantomData<&'a ()>,
    },
    I32(i32),
    F32(f32),
    /// The dropout generator's seed and offset. A variant that declares `dropout` takes exactly
    /// one, after its declared params (`ParamArg::dropout(seed, offset)`); the same seed and
    /// offset give the same mask in the forward and the backward, on every GPU and tile size.
    Rng(DropoutRng),
}

impl<'a> ParamArg<'a> {
    /// A raw device tensor (used by the CLI, which holds untyped buffers).
    pub fn raw_tensor(ptr: u64, len: usize, elem: ScalarTy) -> Self {
        ParamArg::Tensor {
            ptr,
            len,
            elem,
            _borrow: PhantomData,
        }
    }
    /// The dropout generator state of a launch (see [`ParamArg::Rng`]).
    pub fn dropout(seed: u64, offset: u64) -> Self {
        ParamArg::Rng(DropoutRng { seed, offset })
    }
    pub fn tensor_i32(s: &'a CudaSlice<i32>, stream: &CudaStream) -> Self {
        let (ptr, _sync) = s.device_ptr(stream);
        Self::raw_tensor(ptr, s.len(), ScalarTy::I32)
    }
    pub fn tensor_f32(s: &'a CudaSlice<f32>, stream: &CudaStream) -> Self {
        let (ptr, _sync) = s.device_ptr(stream);
        Self::raw_tensor(ptr, s.len(), ScalarTy::F32)
    }
}
