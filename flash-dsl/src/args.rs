//! The fixed head of every kernel's argument struct, shared by the emitter (which writes its C++
//! mirror into the prelude) and the runtime (which fills it). User params follow it at the
//! offsets of [`ParamLayout`](crate::plan::ParamLayout); the generated source `static_assert`s
//! the total size, so a disagreement between the two sides fails at NVRTC time, not at launch.

/// Device pointers and strides of one launch. Strides are in elements; the last dimension
/// (head_dim) is contiguous. Tensors are `[batch, seq, heads, head_dim]`; the LSE is a
/// contiguous `[batch, heads_q, seq_q]` float array in natural-log units.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KernelArgsHeader {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    /// `[tensor][batch, seq, head]` strides for q, k, v, o.
    pub strides: [[i64; 3]; 4],
    pub batch: i32,
    pub heads_q: i32,
    pub heads_kv: i32,
    pub seq_q: i32,
    pub seq_k: i32,
    /// Softmax scale.
    pub scale: f32,
    /// Softmax scale times log2(e), for the exp2-domain softmax.
    pub scale_log2: f32,
    pub _pad: i32,
}

/// `sizeof(KernelArgsHeader)`; user params start here.
pub const HEADER_SIZE: u32 = std::mem::size_of::<KernelArgsHeader>() as u32;

/// The C++ mirror of [`KernelArgsHeader`], placed in the generated prelude.
pub const HEADER_CPP: &str = r#"struct FlashArgsHeader {
  const void* q; const void* k; const void* v; void* o; float* lse;
  long long strides[4][3];
  int batch, heads_q, heads_kv, seq_q, seq_k;
  float scale, scale_log2;
  int _pad;
};"#;

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn header_is_168_bytes() {
        // 5 pointers, 12 i64 strides, 5 i32 sizes, 2 f32 scales, 1 pad.
        assert_eq!(HEADER_SIZE, 5 * 8 + 12 * 8 + 5 * 4 + 2 * 4 + 4);
        assert_eq!(std::mem::align_of::<KernelArgsHeader>(), 8);
    }
}
