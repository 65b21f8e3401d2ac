# Writes the overlap probe's CUDA source to stdout (the 96-accumulator wgmma asm is spelled out
# here): `python3 bench/overlap_probe_gen.py > probe.cu` (bench/next_call.sh probe does it).
N = 96  # accumulators for m64n192 f32
acc = ", ".join(f"%{i}" for i in range(N))
cons = ", ".join(f'"+f"(d[{i}])' for i in range(N))
ss = (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{N+2}, 0;\\n'
      f'wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {{{acc}}}, %{N}, %{N+1}, p, 1, 1;\\n}}\\n"'
      f' : {cons} : "l"(da), "l"(db), "r"(scale));')
rs = (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{N+5}, 0;\\n'
      f'wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {{{acc}}}, {{%{N}, %{N+1}, %{N+2}, %{N+3}}}, %{N+4}, p, 1, 1;\\n}}\\n"'
      f' : {cons} : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale));')
src = r'''// Microbenchmark (run on the GPU machine): `bash bench/next_call.sh probe`, which writes this
// with bench/overlap_probe_gen.py and builds it with `nvcc -O3 -gencode arch=compute_90a,code=sm_90a`. Question: does an H200 SM run e4m3 wgmma (the tensor
// pipe) and MUFU.EX2 (the XU pipe) at the same time when they come from different warpgroups,
// and does a register A operand (RS, as P.V uses) change that? One block of three warpgroups
// per SM; roles are switched on by a mask, each role runs a fixed amount of work; the kernel's
// time for two roles together against each alone says whether the pipes overlap.
#include <cstdio>
#include <cstdint>
typedef uint32_t u32;
typedef uint64_t u64;
__device__ __forceinline__ u64 desc(const void* p) {
  u32 a = (u32)__cvta_generic_to_shared(p);
  // 128-byte swizzle, stride 1024 B between 8-row groups.
  return (u64)((a & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)64 << 32) | ((u64)1 << 62);
}
__device__ __forceinline__ void mma_ss(float* d, u64 da, u64 db, u32 scale) {
  SS_ASM
}
__device__ __forceinline__ void mma_rs(float* d, const u32* a, u64 db, u32 scale) {
  RS_ASM
}
// role bits: 1 WG0 wgmma SS, 2 WG1 exps, 4 WG0 uses RS instead of SS, 8 WG1 wgmma SS,
// 16 WG0 exps interleaved with its own wgmmas (issue, exps, wait), 32 WG1 likewise,
// 64 WG0 exps (alone).
template <int roles>
__global__ void __launch_bounds__(384, 1) k(float* out, int mma_iters, int exp_iters) {
  extern __shared__ __align__(1024) unsigned char smem[];
  for (int i = threadIdx.x; i < 64 * 1024 / 4; i += blockDim.x) reinterpret_cast<u32*>(smem)[i] = 0;
  __syncthreads();
  int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);  // warp-uniform for ptxas
  float d[96];
  for (int i = 0; i < 96; ++i) d[i] = 0.f;
  u32 a[4] = {0, 0, 0, 0};
  float e[8];
  for (int i = 0; i < 8; ++i) e[i] = -0.001f * (threadIdx.x + i);
  bool do_mma = (wg == 0 && (roles & 1)) || (wg == 1 && (roles & 8));
  bool rs = wg == 0 && (roles & 4);
  bool do_exp = (wg == 1 && (roles & 2)) || (wg == 0 && (roles & 64));
  bool inter = (wg == 0 && (roles & 16)) || (wg == 1 && (roles & 32));
  if (inter) {
    // like the forward's steady state: a product of 64x192x128 in flight, 64x192/128 = 96
    // exponentials a thread under it.
    for (int it = 0; it < mma_iters; ++it) {
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
      for (int kk = 0; kk < 4; ++kk) mma_ss(d, desc(smem + kk * 32), desc(smem + 32768 + kk * 32), 1);
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#pragma unroll
      for (int r = 0; r < 12; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(e[i]));
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
  } else if (do_mma) {
    for (int it = 0; it < mma_iters; ++it) {
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
      for (int kk = 0; kk < 4; ++kk) {
        if (rs) mma_rs(d, a, desc(smem + 32768 + kk * 32), 1);
        else mma_ss(d, desc(smem + kk * 32), desc(smem + 32768 + kk * 32), 1);
      }
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      // RS: wait for each group (a second group in flight over the same A registers makes ptxas
      // serialise, C7512); SS keeps one group in flight.
      if (rs) asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      else asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  } else if (do_exp) {
    for (int it = 0; it < exp_iters; ++it)
#pragma unroll
      for (int r = 0; r < 12; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(e[i]));
  }
  float s = 0;
  for (int i = 0; i < 96; ++i) s += d[i];
  for (int i = 0; i < 8; ++i) s += e[i];
  if (s == 1234.5f) out[threadIdx.x] = s;
}
int main() {
  float* o; cudaMalloc(&o, 4096);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  // per iteration: one warpgroup's 64x192x128 e4m3 product (768 clocks of an SM's tensor pipe at
  // 4096 e4m3 FMA a clock) and, for an exp warpgroup, 96 exps a thread (12288 a warpgroup, 768
  // clocks of the XU at 16 a clock): the forward's balance at d 128.
  int iters = 2048;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto time = [&](const char* name, void (*f)(float*, int, int)) {
    cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
    f<<<sms, 384, 200 * 1024>>>(o, 16, 16);
    cudaEventRecord(e0);
    f<<<sms, 384, 200 * 1024>>>(o, iters, iters);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    double clocks = ms * 1e-3 * clk * 1e3 / iters;
    printf("%-48s %.3f ms  %.0f clocks an iteration at %d MHz\n", name, ms, clocks, clk / 1000);
  };
  for (int rep = 0; rep < 2; ++rep) {
    time("WG0 wgmma SS alone", k<1>);
    time("WG1 exps alone", k<2>);
    time("WG0 wgmma SS + WG1 exps", k<1 | 2>);
    time("WG0 wgmma RS alone", k<1 | 4>);
    time("WG0 wgmma RS + WG1 exps", k<1 | 4 | 2>);
    time("WG0 + WG1 wgmma SS (2x work)", k<1 | 8>);
    time("WG0 + WG1 exps (2x work)", k<64 | 2>);
    time("WG0 + WG1 each: issue SS, exps, wait (2x both)", k<16 | 32>);
    time("WG0: issue SS, exps, wait (1x both)", k<16>);
  }
  cudaError_t err = cudaDeviceSynchronize();
  printf("%s\n", cudaGetErrorString(err));
}
'''
import sys

sys.stdout.write(src.replace("SS_ASM", ss).replace("RS_ASM", rs))
