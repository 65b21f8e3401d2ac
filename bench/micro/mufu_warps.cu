// Microbenchmark (GPU machine): `nvcc -O3 -arch=sm_90a -o mw bench/micro/mufu_warps.cu && ./mw`.
// How many exponentials a clock one scheduler (SM sub-partition) retires when W warps of it run
// the fp8 forward's softmax inner pattern — p = ex2(fma(s, c, off)), four running sums, P packed
// to e4m3 pairs — over N values held in registers (N = 96: a 64 × 192 warpgroup tile). One block
// an SM of 128·W threads (W warps a scheduler); clock64 around the loop in each warp.
#include <cstdio>
#include <cstdint>
#include <vector>
template <int N, int MODE>
__global__ void __launch_bounds__(512, 1) k(float* out, unsigned long long* cyc, int iters, float c) {
  float s[N];
  for (int i = 0; i < N; ++i) s[i] = -0.01f * ((threadIdx.x * 7 + i * 13) & 255);
  float sum4[4] = {0.f, 0.f, 0.f, 0.f};
  unsigned pk = 0;
  const float off = -0.5f + 1e-7f * threadIdx.x;
  __syncthreads();
  const unsigned long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float p;
      asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(p) : "f"(fmaf(s[i], c, off)));
      if (MODE >= 1) sum4[i & 3] += p;
      s[i] = MODE == 0 ? p - 1.0f : p;
    }
    if (MODE >= 2) {
#pragma unroll
      for (int i = 0; i < N; i += 2) {
        unsigned short h;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(s[i + 1]), "f"(s[i]));
        pk ^= h;
      }
    }
  }
  const unsigned long long t1 = clock64();
  if ((threadIdx.x & 31) == 0) cyc[blockIdx.x * 16 + threadIdx.x / 32] = t1 - t0;
  float t = sum4[0] + sum4[1] + sum4[2] + sum4[3] + (float)pk;
  for (int i = 0; i < N; ++i) t += s[i];
  if (t == 1234.5f) out[0] = t;
}
template <int N, int MODE>
void run(const char* name, int warps_per_sched) {
  float* o; cudaMalloc(&o, 4);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  unsigned long long* cyc; cudaMalloc(&cyc, sms * 16 * 8);
  const int threads = 128 * warps_per_sched, iters = 2000;
  k<N, MODE><<<sms, threads>>>(o, cyc, 10, 0.5f);
  k<N, MODE><<<sms, threads>>>(o, cyc, iters, 0.5f);
  cudaDeviceSynchronize();
  std::vector<unsigned long long> h(sms * 16);
  cudaMemcpy(h.data(), cyc, sms * 16 * 8, cudaMemcpyDeviceToHost);
  double mean = 0; int n = 0;
  for (int b = 0; b < sms; ++b) for (int w = 0; w < threads / 32; ++w) { mean += h[b * 16 + w]; ++n; }
  mean /= n;
  // exps per clock per scheduler: W warps × 32 lanes × N × iters over the cycles.
  const double rate = (double)warps_per_sched * 32 * N * iters / mean;
  printf("%-28s W=%d  %7.1f clocks a warp's pass of %d values  %.2f exps/clock/scheduler (peak 4)\n", name,
         warps_per_sched, mean / iters, N, rate);
  cudaFree(o); cudaFree(cyc);
}
int main() {
  for (int w = 1; w <= 4; w *= 2) run<96, 0>("ex2 only", w);
  for (int w = 1; w <= 4; w *= 2) run<96, 1>("fma + ex2 + sums", w);
  for (int w = 1; w <= 4; w *= 2) run<96, 2>("fma + ex2 + sums + e4m3 pack", w);
  for (int w = 1; w <= 2; w *= 2) run<64, 2>("same, 64 values", w);
}
