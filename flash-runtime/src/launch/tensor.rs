//! Device tensors as the caller hands them over: typed borrows of `CudaSlice`s with a shape and
//! strides, and their untyped form ([`OperandArg`]) that the checks and the packing work on.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use flash_dsl::plan::OperandType;
use flash_dsl::spec::DType;

/// Element type of a device buffer as the caller declared it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    /// bfloat16 (`CudaSlice<half::bf16>`).
    Bf16,
    /// IEEE half (`CudaSlice<half::f16>`).
    F16,
    /// Untyped 16-bit elements (`CudaSlice<u16>` holding bf16 or f16 bits): accepted for either
    /// 16-bit dtype; the caller vouches for the interpretation.
    Bits16,
    /// float32: the LSE, the backward's scratch (`delta`, the dQ accumulator), `f32`
    /// parameter gradients.
    F32,
    /// int32: block maps, the deterministic backward's semaphores and the persistent kernels'
    /// work counter.
    I32,
    /// Bytes (`CudaSlice<u8>`): fp8 codes, of any fp8 format.
    U8,
}

impl ElemType {
    /// Whether buffers of this type can feed a variant of `dtype`.
    ///
    /// ```
    /// use flash_dsl::DType;
    /// use flash_runtime::launch::ElemType;
    ///
    /// assert!(ElemType::Bf16.matches(DType::Bf16));
    /// assert!(!ElemType::F16.matches(DType::Bf16));
    /// assert!(ElemType::Bits16.matches(DType::F16)); // raw u16 bits fit either 16-bit dtype
    /// ```
    pub fn matches(self, dtype: DType) -> bool {
        self.matches_operand(OperandType::Storage(dtype))
    }
    /// Whether buffers of this type can be bound to an operand of type `ty`.
    pub fn matches_operand(self, ty: OperandType) -> bool {
        match (self, ty) {
            (ElemType::Bits16, OperandType::Storage(d)) => d.size() == 2,
            (ElemType::Bf16, OperandType::Storage(DType::Bf16))
            | (ElemType::F16, OperandType::Storage(DType::F16))
            | (ElemType::F32, OperandType::F32)
            | (ElemType::I32, OperandType::I32)
            | (ElemType::U8, OperandType::Fp8(_)) => true,
            _ => false,
        }
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElemType::Bf16 | ElemType::F16 | ElemType::Bits16 => 2,
            ElemType::F32 | ElemType::I32 => 4,
            ElemType::U8 => 1,
        }
    }
    /// The short name error messages use (`bf16`, `f16`, `u16`, `f32`, `i32`, `u8`).
    pub fn name(self) -> &'static str {
        match self {
            ElemType::Bf16 => "bf16",
            ElemType::F16 => "f16",
            ElemType::Bits16 => "u16",
            ElemType::F32 => "f32",
            ElemType::I32 => "i32",
            ElemType::U8 => "u8",
        }
    }
}

/// Host element types whose device buffers can be used as Q/K/V/O.
pub trait TensorElem: Copy + 'static {
    /// The element type recorded in a [`TensorDesc`] built over a `CudaSlice<Self>`, checked
    /// against the operand's type at launch.
    const ELEM: ElemType;
}
impl TensorElem for half::bf16 {
    const ELEM: ElemType = ElemType::Bf16;
}
impl TensorElem for half::f16 {
    const ELEM: ElemType = ElemType::F16;
}
impl TensorElem for u16 {
    const ELEM: ElemType = ElemType::Bits16;
}
impl TensorElem for u8 {
    const ELEM: ElemType = ElemType::U8;
}
impl TensorElem for f32 {
    const ELEM: ElemType = ElemType::F32;
}
impl TensorElem for i32 {
    const ELEM: ElemType = ElemType::I32;
}

/// Pointer, extent and layout of one 4-d tensor, without a borrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDesc {
    /// Device address of element `[0, 0, 0, 0]`.
    pub ptr: u64,
    /// Elements available from `ptr` (the buffer's length).
    pub len: usize,
    /// Extents, e.g. Q `[batch, seq_q, heads_q, d_qk]` (see the [`launch`](crate::launch)
    /// module doc for every operand's layout).
    pub shape: [usize; 4],
    /// Strides in elements.
    pub strides: [i64; 4],
    /// The element type of the buffer, from the `CudaSlice`'s type.
    pub elem: ElemType,
    /// The context the buffer was allocated in.
    pub(crate) ctx: usize,
}

/// Row-major strides of a contiguous `shape`, in elements.
///
/// ```
/// use flash_runtime::launch::contiguous_strides;
///
/// // Q of [batch, seq_q, heads_q, d_qk] = [2, 128, 8, 64]
/// assert_eq!(contiguous_strides([2, 128, 8, 64]), [128 * 8 * 64, 8 * 64, 64, 1]);
/// ```
pub fn contiguous_strides(shape: [usize; 4]) -> [i64; 4] {
    let mut s = [1i64; 4];
    for i in (0..3).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1] as i64);
    }
    s
}

impl TensorDesc {
    /// Elements reached by the shape and strides: `1 + Σ (shape_i − 1)·stride_i`, or 0 for an
    /// empty tensor; `None` on overflow or a negative stride.
    pub fn extent(&self) -> Option<usize> {
        super::check::extent(&self.shape, &self.strides)
    }
}

/// A read-only device tensor borrowed from a `CudaSlice`.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    /// Pointer, shape, strides and element type; checked against the plan at launch.
    pub desc: TensorDesc,
    _borrow: PhantomData<&'a ()>,
}

/// A device tensor the kernel writes, mutably borrowed from a `CudaSlice`.
#[derive(Debug)]
pub struct TensorMut<'a> {
    /// Pointer, shape, strides and element type; checked against the plan at launch.
    pub desc: TensorDesc,
    _borrow: PhantomData<&'a mut ()>,
}

pub(crate) fn ctx_id(ctx: &Arc<CudaContext>) -> usize {
    ctx.cu_ctx() as usize
}

impl<'a> TensorRef<'a> {
    /// A contiguous `shape` tensor over `slice`.
    pub fn new<T: TensorElem>(
        slice: &'a CudaSlice<T>,
        shape: [usize; 4],
        stream: &CudaStream,
    ) -> Self {
        Self::strided(slice, shape, contiguous_strides(shape), stream)
    }
    /// A tensor over `slice` with explicit element strides (checked at launch).
    pub fn strided<T: TensorElem>(
        slice: &'a CudaSlice<T>,
        shape: [usize; 4],
        strides: [i64; 4],
        stream: &CudaStream,
    ) -> Self {
        Self::strided_at(slice, 0, shape, strides, stream)
    }
    /// A strided tensor whose element `[0, 0, 0, 0]` is element `offset` of `slice` (e.g. K
    /// inside a packed QKV buffer). `offset` past the end gives an empty buffer, which the
    /// launch checks reject for any non-empty shape.
    pub fn strided_at<T: TensorElem>(
        slice: &'a CudaSlice<T>,
        offset: usize,
        shape: [usize; 4],
        strides: [i64; 4],
        stream: &CudaStream,
    ) -> Self {
        let (base, _sync) = slice.device_ptr(stream);
        let offset = offset.min(slice.len());
        TensorRef {
            desc: TensorDesc {
                ptr: base + (offset * std::mem::size_of::<T>()) as u64,
                len: slice.len() - offset,
                shape,
                strides,
                elem: T::ELEM,
                ctx: ctx_id(slice.context()),
            },
            _borrow: PhantomData,
        }
    }
}

impl<'a> TensorMut<'a> {
    /// A contiguous `shape` tensor over `slice`.
    pub fn new<T: TensorElem>(
        slice: &'a mut CudaSlice<T>,
        shape: [usize; 4],
        stream: &CudaStream,
    ) -> Self {
        Self::strided(slice, shape, contiguous_strides(shape), stream)
    }
    /// A tensor over `slice` with explicit element strides (checked at launch).
    pub fn strided<T: TensorElem>(
        slice: &'a mut CudaSlice<T>,
        shape: [usize; 4],
        strides: [i64; 4],
        stream: &CudaStream,
    ) -> Self {
        let ctx = ctx_id(slice.context());
        let len = slice.len();
        let (ptr, _sync) = slice.device_ptr_mut(stream);
        TensorMut {
            desc: TensorDesc {
                ptr,
                len,
                shape,
                strides,
                elem: T::ELEM,
                ctx,
            },
            _borrow: PhantomData,
        }
    }
}

/// The LSE output: a contiguous f32 buffer of at least `batch·heads_q·seq_q` elements.
#[derive(Debug)]
pub struct LseMut<'a> {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) ctx: usize,
    _borrow: PhantomData<&'a mut ()>,
}

impl<'a> LseMut<'a> {
    /// The LSE view of all of `slice`; its length is checked against the problem at launch.
    pub fn new(slice: &'a mut CudaSlice<f32>, stream: &CudaStream) -> Self {
        let ctx = ctx_id(slice.context());
        let len = slice.len();
        let (ptr, _sync) = slice.device_ptr_mut(stream);
        LseMut {
            ptr,
            len,
            ctx,
            _borrow: PhantomData,
        }
    }
}

/// One operand as the checks see it: a [`TensorRef`], [`TensorMut`] or [`LseMut`] without its
/// borrow. `shape: None` is a flat buffer (a contiguous operand such as the LSE), whose shape
/// comes from the plan and whose length is checked against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperandArg {
    /// Device address of the first element.
    pub ptr: u64,
    /// Elements available from `ptr`.
    pub len: usize,
    /// Extents of a strided tensor; `None` for a flat buffer.
    pub shape: Option<Vec<usize>>,
    /// Strides in elements, one per `shape` dimension; empty for a flat buffer.
    pub strides: Vec<i64>,
    /// The element type of the buffer, checked against the operand's type.
    pub elem: ElemType,
    pub(crate) ctx: usize,
}

impl From<&TensorDesc> for OperandArg {
    fn from(t: &TensorDesc) -> Self {
        OperandArg {
            ptr: t.ptr,
            len: t.len,
            shape: Some(t.shape.to_vec()),
            strides: t.strides.to_vec(),
            elem: t.elem,
            ctx: t.ctx,
        }
    }
}

impl OperandArg {
    /// A flat buffer of `len` elements of `elem` at `ptr` (in the context `ctx`): its shape
    /// comes from the extents the other operands bind (scratch, the LSE, block maps, counters).
    pub(crate) fn flat(ptr: u64, len: usize, elem: ElemType, ctx: usize) -> OperandArg {
        OperandArg {
            ptr,
            len,
            shape: None,
            strides: Vec::new(),
            elem,
            ctx,
        }
    }
}

impl From<&LseMut<'_>> for OperandArg {
    fn from(l: &LseMut<'_>) -> Self {
        OperandArg::flat(l.ptr, l.len, ElemType::F32, l.ctx)
    }
}

/// A device buffer as a flat operand (its whole length, its element type), for the workspaces,
/// offsets, tables and scales the kernels take without a shape.
pub(crate) fn flat_operand<T: TensorElem>(buf: &CudaSlice<T>, stream: &CudaStream) -> OperandArg {
    let (ptr, _sync) = buf.device_ptr(stream);
    OperandArg::flat(ptr, buf.len(), T::ELEM, ctx_id(buf.context()))
}
