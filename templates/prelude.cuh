// flash device prelude: everything generated kernels need, with no CUDA toolkit header.
// Tensor-core and async-copy instructions are reached through inline PTX, so NVRTC needs no
// include path and the runtime needs only the driver and libnvrtc.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;
typedef unsigned long long u64;

#define FLASH_INF __int_as_float(0x7f800000)
#define FLASH_LOG2E 1.4426950408889634f  // 1/ln 2: exp(x) = exp2(x * LOG2E)
#define FLASH_LN2 0.6931471805599453f

namespace flash {

// ---- shared memory addressing -------------------------------------------------------------

/// 32-bit shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 r;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows are `pitch` bytes
/// (a multiple of 128). Within each 128-byte segment the chunk index is XORed with the row
/// (mod 8), so the 8 rows that one ldmatrix phase reads land in 8 different bank groups.
__device__ __forceinline__ u32 swz(int row, int chunk, int pitch) {
  return (u32)(row * pitch + (((chunk & ~7) | ((chunk ^ row) & 7)) << 4));
}

// ---- dropout's generator ------------------------------------------------------------------

/// Philox4x32-7 as Random123 defines it: `flash_dsl::dropout::philox4x32` with
/// `flash_dsl::dropout::ROUNDS` (7) rounds, bit for bit.
__device__ __forceinline__ uint4 philox(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
#pragma unroll
  for (int r = 0; r < 7; ++r) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // One wide multiply each (IMAD.WIDE.U32) rather than separate low and high halves.
    u32 lo0, hi0, lo1, hi1;
    asm("{ .reg .u64 t; mul.wide.u32 t, %2, 0xD2511F53; mov.b64 {%0, %1}, t; }" : "=r"(lo0), "=r"(hi0) : "r"(c0));
    asm("{ .reg .u64 t; mul.wide.u32 t, %2, 0xCD9E8D57; mov.b64 {%0, %1}, t; }" : "=r"(lo1), "=r"(hi1) : "r"(c2));
    const u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return make_uint4(c0, c1, c2, c3);
}

// ---- asynchronous global -> shared copies (sm_80+) ----------------------------------------

/// Copies 16 bytes, or zero-fills them when `src_bytes` is 0 (rows past the sequence end).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
/// Copies 4 bytes, or zero-fills them when `src_bytes` is 0 (per-row values past the end).
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// ---- tensor-core fragments ----------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// ---- fast math on the special-function unit -------------------------------------------------

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float ftanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
/// Division to 2 ulp over the full range, without the IEEE slow path.
__device__ __forceinline__ float fdivf(float a, float b) {
  float y;
  asm("div.full.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}
__device__ __forceinline__ float fexp(float x) { return ex2(x * FLASH_LOG2E); }
__device__ __forceinline__ float flog(float x) { return lg2(x) * FLASH_LN2; }
__device__ __forceinline__ float fsigmoid(float x) { return 0.5f * ftanh(0.5f * x) + 0.5f; }
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ int iabs(int a) { return a < 0 ? -a : a; }
/// Clamps a parameter index into [0, n-1]: every tensor lookup is in bounds by construction.
__device__ __forceinline__ int clampi(int i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
/// `clampi` of an index computed in 64 bits (see `validate::arith`).
__device__ __forceinline__ int clampl(long long i, int n) { return i < 0 ? 0 : (i >= n ? n - 1 : (int)i); }
/// The language's `%`: C's truncating remainder, with `x % 0 == 0` (and `INT_MIN % -1 == 0`,
/// undefined in C), as the CPU evaluator defines it.
__device__ __forceinline__ int irem(int a, int b) { return (b == 0 || b == -1) ? 0 : a % b; }
__device__ __forceinline__ long long lrem(long long a, long long b) { return (b == 0 || b == -1) ? 0 : a % b; }
__device__ __forceinline__ long long labs(long long a) { return a < 0 ? -a : a; }

// ---- data-dependent tile classification ------------------------------------------------------

/// Minimum and maximum of p[i0..=i1], reduced across the calling warp: every lane of the warp
/// must call it with the same arguments (tile classification is block-uniform).
__device__ __forceinline__ void warp_range(const int* p, i64 i0, i64 i1, i64& lo, i64& hi) {
  int mn = 0x7fffffff, mx = -0x7fffffff - 1;
  for (i64 i = i0 + (threadIdx.x & 31); i <= i1; i += 32) {
    const int v = __ldg(p + i);
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    mn = imin(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    mx = imax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  }
  lo = mn;
  hi = mx;
}

// ---- integer floor/ceil division, for the key-range hull of affine masks --------------------

__device__ __forceinline__ i64 fdiv(i64 a, i64 b) {  // b > 0
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
__device__ __forceinline__ i64 cdiv(i64 a, i64 b) { return -fdiv(-a, b); }
__device__ __forceinline__ i64 lmin(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 lmax(i64 a, i64 b) { return a > b ? a : b; }

}  // namespace flash
