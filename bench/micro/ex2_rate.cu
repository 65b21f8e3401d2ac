// Throughput of the special-function unit's base-2 exponential on one SM, per form the fp8
// softmax could use: `ex2.approx.f32` (one result a lane), `ex2.approx.f16x2` (two results a
// lane, one instruction) and `ex2.approx.ftz.bf16x2`; and of the conversions around them.
// Every thread runs 8 independent chains so the pipe, not latency, limits; results per clock
// per SM = threads · iterations · 8 · results per op / (clock64 cycles).
// Build and run on the GPU machine: nvcc -arch=sm_90a -O3 -o ex2_rate ex2_rate.cu && ./ex2_rate
#include <cstdio>
#include <cuda_fp16.h>

constexpr int ITERS = 4096;

template <int KIND>
__global__ void bench(unsigned* out, long long* cycles, float seed) {
  unsigned r[8];
  float f[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    f[i] = seed * (threadIdx.x + i) * 1e-9f - 0.5f;
    __half2 h = __floats2half2_rn(f[i], -f[i]);
    r[i] = *reinterpret_cast<unsigned*>(&h);
  }
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < ITERS; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (KIND == 0) {
        asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(f[i]));
      } else if (KIND == 1) {
        asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(r[i]));
      } else if (KIND == 2) {
        asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(r[i]));
      } else if (KIND == 3) {
        // f32 pair -> f16x2 (the pack before an f16x2 exponential)
        asm volatile("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(r[i]) : "f"(f[i]));
        f[i] = __uint_as_float(r[i]);
      } else if (KIND == 4) {
        // f16x2 -> e4m3x2 (the P pack after it)
        unsigned short x;
        asm volatile("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(x) : "r"(r[i]));
        r[i] = r[i] ^ x;
      } else {
        // f32 pair -> e4m3x2 (today's P pack)
        unsigned short x;
        asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(x) : "f"(f[i]));
        f[i] = f[i] + (float)x;
      }
    }
  }
  __syncthreads();
  long long t1 = clock64();
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) acc ^= r[i] ^ __float_as_uint(f[i]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

int main() {
  unsigned* out;
  long long* cyc;
  cudaMalloc(&out, 1024 * 1024 * 4);
  cudaMalloc(&cyc, 1024 * 8);
  const char* names[] = {"ex2.approx.ftz.f32", "ex2.approx.f16x2", "ex2.approx.ftz.bf16x2",
                         "cvt.rn.f16x2.f32", "cvt.rn.satfinite.e4m3x2.f16x2", "cvt.rn.satfinite.e4m3x2.f32 (+FADD)"};
  const int results[] = {1, 2, 2, 2, 2, 2};
  for (int kind = 0; kind < 6; ++kind) {
    for (int threads : {256, 512, 1024}) {
      long long c = 0;
      for (int rep = 0; rep < 2; ++rep) {
        switch (kind) {
          case 0: bench<0><<<1, threads>>>(out, cyc, 1.f); break;
          case 1: bench<1><<<1, threads>>>(out, cyc, 1.f); break;
          case 2: bench<2><<<1, threads>>>(out, cyc, 1.f); break;
          case 3: bench<3><<<1, threads>>>(out, cyc, 1.f); break;
          case 4: bench<4><<<1, threads>>>(out, cyc, 1.f); break;
          default: bench<5><<<1, threads>>>(out, cyc, 1.f); break;
        }
        cudaMemcpy(&c, cyc, 8, cudaMemcpyDeviceToHost);
      }
      const double ops = (double)threads * ITERS * 8;
      printf("%-38s threads %4d: %6.2f instr/clk/SM, %6.2f results/clk/SM\n", names[kind], threads, ops / c,
             ops * results[kind] / c);
    }
  }
  cudaError_t e = cudaDeviceSynchronize();
  printf("status: %s\n", cudaGetErrorString(e));
  return 0;
}
