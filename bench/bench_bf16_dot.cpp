// The probe behind cpu_bf16()'s automatic choice (core/cpu_isa.hpp): register-resident throughput of
// AVX-512 BF16 VDPBF16PS (one instruction = 16 lanes x a pair of bf16 products = 64 flops) against
// the f32 FMA VFMADD231PS (16 lanes = 32 flops), 12 independent accumulators each, interleaved
// rounds, medians. A ratio near 2 means vdpbf16ps issues at the FMA rate (AMD Zen 4: the bf16 conv
// kernels on it run about 1.9x f32 per pass); near 1, at half the rate (Intel: the widened f32
// kernels are as fast). Prints "no AVX-512 BF16" and exits 0 on a CPU without it.
//   build/bench/bench_bf16_dot [--rounds 7] [--iters 20000000]
#include <immintrin.h>

#include <cstdio>
#include <vector>

#include <shardtensor/core/cpu_isa.hpp>

#include "bench_util.hpp"

namespace {

__attribute__((target("avx512f,avx512bf16,avx512vl"))) float run_dot(long n) {
  __m512 a[12];
  for (int k = 0; k < 12; ++k) a[k] = _mm512_set1_ps(static_cast<float>(k));  // distinct: no CSE
  __m512i xi = _mm512_set1_epi32(0x3f803f80), yi = _mm512_set1_epi32(0x3c003c00);
  for (long i = 0; i < n; ++i) {
    __asm__ volatile("" : "+v"(xi));  // an operand the compiler cannot hoist
    const __m512bh x = reinterpret_cast<__m512bh&>(xi), y = reinterpret_cast<__m512bh&>(yi);
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) a[k] = _mm512_dpbf16_ps(a[k], x, y);
  }
  __m512 s = a[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, a[k]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,fma"))) float run_fma(long n) {
  __m512 a[12];
  for (int k = 0; k < 12; ++k) a[k] = _mm512_set1_ps(static_cast<float>(k));
  __m512 x = _mm512_set1_ps(1.0f);
  const __m512 y = _mm512_set1_ps(1e-3f);
  for (long i = 0; i < n; ++i) {
    __asm__ volatile("" : "+v"(x));
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) a[k] = _mm512_fmadd_ps(x, y, a[k]);
  }
  __m512 s = a[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, a[k]);
  return _mm512_reduce_add_ps(s);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shard;
  const int rounds = static_cast<int>(bench::arg_int(argc, argv, "--rounds", 7));
  const long iters = static_cast<long>(bench::arg_int(argc, argv, "--iters", 20000000));
  std::printf("bench_bf16_dot: CPU %s, bf16 unit supported %s, in use %s, load %.2f\n", cpu_model_name().c_str(),
              to_string(cpu_bf16_supported()), to_string(cpu_bf16()), bench::load_average());
  if (cpu_bf16_supported() == CpuBf16::widened) {
    std::printf("no AVX-512 BF16 at the avx512 level on this CPU: nothing to measure\n");
    return 0;
  }
  std::vector<double> tf, td;
  volatile float sink = 0;
  for (int r = 0; r < rounds; ++r) {
    double t0 = bench::now_ms();
    sink = sink + run_fma(iters);
    tf.push_back(bench::now_ms() - t0);
    t0 = bench::now_ms();
    sink = sink + run_dot(iters);
    td.push_back(bench::now_ms() - t0);
  }
  const double mf = bench::median(tf), md = bench::median(td);
  const double gf = 12.0 * 32 * static_cast<double>(iters) / (mf * 1e6), gd = 12.0 * 64 * static_cast<double>(iters) / (md * 1e6);
  std::printf("vfmadd231ps zmm: %.1f GFLOP/s   vdpbf16ps zmm: %.1f GFLOP/s   bf16 / f32 flop rate %.2f\n", gf, gd,
              gd / gf);
  std::printf("RESULT bf16_dot fma_gflops %.2f dpbf16_gflops %.2f ratio %.3f\n", gf, gd, gd / gf);
  return 0;
}
