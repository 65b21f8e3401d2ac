// Microbenchmark (run on the GPU machine): `nvcc -O3 -arch=sm_90a -o ex2 bench/mufu_ex2.cu && ./ex2`.
// Result of 2026-11-28 on an H200: bench/results/mufu-ex2-rate-2026-11-28.md.
// Throughput of the exp2 forms on the special-function unit: exps per clock per SM.
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
template <int MODE>
__global__ void k(float* out, int iters) {
  float a[8]; unsigned h[8];
  for (int i = 0; i < 8; ++i) { a[i] = -0.001f * (threadIdx.x + i); h[i] = 0xBC00BC00u ^ (threadIdx.x + i); }
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (MODE == 0) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(a[i]));
      if (MODE == 1) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(h[i]));
      if (MODE == 2) asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(h[i]));
      if (MODE == 3) { unsigned short s = (unsigned short)h[i]; asm volatile("ex2.approx.f16 %0, %0;" : "+h"(s)); h[i] = s; }
    }
  }
  float s = 0; for (int i = 0; i < 8; ++i) s += a[i] + (float)h[i];
  if (s == 1234.5f) out[0] = s;
}
template <int MODE> void run(const char* name, int per) {
  float* o; cudaMalloc(&o, 4);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  int iters = 4096, blocks = sms * 4, threads = 512;
  k<MODE><<<blocks, threads>>>(o, 16);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaEventRecord(e0); k<MODE><<<blocks, threads>>>(o, iters); cudaEventRecord(e1); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  double exps = (double)blocks * threads * iters * 8 * per;
  double per_clk_sm = exps / (ms * 1e-3) / sms / (clk * 1e3);
  printf("%-12s %.3f ms  %.1f exps/clk/SM (at the %d MHz max clock)\n", name, ms, per_clk_sm, clk / 1000);
}
int main() { run<0>("f32", 1); run<1>("f16x2", 2); run<2>("bf16x2", 2); run<3>("f16", 1); run<0>("f32", 1); }
