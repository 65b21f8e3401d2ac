//! The contract between the `attention!` macro and the runtime.
//!
//! The macro turns each declaration into a unit struct implementing [`Variant`] and a typed
//! params struct; the runtime re-parses [`Variant::SOURCE`] with the same parser (so the macro
//! never has to serialise a spec) and receives params as a checked list of [`ParamArg`].

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use flash_dsl::dropout::DropoutRng;
use flash_dsl::generated::Generated;
use flash_dsl::plan::KernelFamily;
use flash_dsl::spec::{ScalarTy, VariantSpec};

use crate::error::FlashError;

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

    /// The validated declaration, re-parsed from [`Variant::SOURCE`]. The macro validated the
    /// same text at compile time, so this fails only if the macro and the runtime come from
    /// different flash versions that disagree on the language.
    fn spec() -> Result<VariantSpec, FlashError> {
        let specs = flash_dsl::parse::parse_str(Self::SOURCE).map_err(|diags| {
            FlashError::Parse(format!(
                "the source of variant `{}` does not parse: {}",
                Self::NAME,
                diags
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            ))
        })?;
        specs
            .into_iter()
            .find(|s| s.name == Self::NAME)
            .ok_or_else(|| {
                FlashError::Invalid(format!(
                    "`{}` is not declared in its own source",
                    Self::NAME
                ))
            })
    }

    /// Every kernel flash generates for this variant when the GPU's default family is `family`
    /// (plans and CUDA of the forward and backward passes, block-map builders included; see
    /// [`flash_dsl::generated`]). Needs no GPU and no NVRTC, and is deterministic: snapshot
    /// [`Generated::summary`] and each kernel's
    /// [`snapshot_text`](flash_dsl::generated::GeneratedKernel::snapshot_text) to review every
    /// change of the kernels that a declaration change or a flash upgrade makes.
    ///
    /// ```
    /// use flash_runtime::Variant;
    /// use flash_runtime::flash_dsl::plan::KernelFamily;
    ///
    /// flash_macros::attention! {
    ///     /// Causal attention with soft-capped logits.
    ///     pub Capped { head_dim: 64, dtype: bf16, mask: causal, score: softcap(s, 30.0) }
    /// }
    ///
    /// let g = Capped::generate(KernelFamily::Sm90Ws).unwrap();
    /// let first = g.kernels().next().unwrap();
    /// assert_eq!(first.snapshot_name, "capped_sm90ws_fwd");
    /// assert!(first.snapshot_text().contains("extern \"C\" __global__"));
    /// assert!(g.summary().contains("d score / d s ="));
    /// ```
    fn generate(family: KernelFamily) -> Result<Generated, FlashError> {
        let spec = Self::spec()?;
        flash_dsl::generated::generate(&spec, family).map_err(|e| FlashError::plan(&spec.name, e))
    }
}

/// One runtime parameter value, in declaration order.
#[derive(Debug, Clone, Copy)]
pub enum ParamArg<'a> {
    /// A device tensor: pointer, element count and element type.
    Tensor {
        /// The device address of element 0.
        ptr: u64,
        /// Elements in the buffer; the launch checks it against the shape the declaration
        /// gives the tensor, so a kernel never reads past it.
        len: usize,
        /// The element type; must match the declaration's (`f32` or `i32`).
        elem: ScalarTy,
        /// Ties the value to the borrow of the buffer it points into.
        _borrow: PhantomData<&'a ()>,
    },
    /// A scalar `i32` parameter.
    I32(i32),
    /// A scalar `f32` parameter.
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
    /// An `i32` tensor parameter (e.g. document ids), borrowed for the launch; `stream` is the
    /// stream the launch runs on, so cudarc orders the buffer's use after its writes.
    pub fn tensor_i32(s: &'a CudaSlice<i32>, stream: &CudaStream) -> Self {
        let (ptr, _sync) = s.device_ptr(stream);
        Self::raw_tensor(ptr, s.len(), ScalarTy::I32)
    }
    /// An `f32` tensor parameter (e.g. ALiBi slopes or a bias table); see
    /// [`ParamArg::tensor_i32`].
    pub fn tensor_f32(s: &'a CudaSlice<f32>, stream: &CudaStream) -> Self {
        let (ptr, _sync) = s.device_ptr(stream);
        Self::raw_tensor(ptr, s.len(), ScalarTy::F32)
    }
}
