// CPU implementation of the GEMM kernel family: today's OpenBLAS path (shard::detail::gemm_core in
// src/exec/gemm_cpu_blas.cpp, with its OpenBLAS core-type fix) per batch entry, and the bias epilogues
// moved from nn/functional/linear.hpp (same loops, same summation order).
#include <vector>

#include "exec/gemm_kernels.hpp"
#include "shardtensor/exec/blas.hpp"

namespace shard::exec {
namespace {

template <class T>
void add_bias_impl(index_t A, index_t cout, index_t S, const T* b, T* y) {
  if (S == 1) {
    for (index_t a = 0; a < A; ++a)
      for (index_t o = 0; o < cout; ++o) y[a * cout + o] += b[o];
    return;
  }
  for (index_t a = 0; a < A; ++a) {
    T* ya = y + a * cout * S;
    for (index_t o = 0; o < cout; ++o)
      for (index_t s = 0; s < S; ++s) ya[o * S + s] += b[o];
  }
}

template <class T>
void bias_grad_impl(index_t A, index_t cout, index_t S, const T* g, T* out) {
  std::vector<double> db(static_cast<std::size_t>(cout), 0.0);
  if (S == 1) {
    for (index_t a = 0; a < A; ++a)
      for (index_t o = 0; o < cout; ++o) db[static_cast<std::size_t>(o)] += g[a * cout + o];
  } else {
    for (index_t a = 0; a < A; ++a) {
      const T* ga = g + a * cout * S;
      for (index_t o = 0; o < cout; ++o) {
        double acc = 0;
        for (index_t s = 0; s < S; ++s) acc += ga[o * S + s];
        db[static_cast<std::size_t>(o)] += acc;
      }
    }
  }
  for (index_t o = 0; o < cout; ++o) out[o] = static_cast<T>(db[static_cast<std::size_t>(o)]);
}

struct CpuGemm final : GemmKernels {
  void gemm_strided_batched(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t k, double alpha,
                            const void* a, index_t lda, index_t stride_a, const void* b, index_t ldb, index_t stride_b,
                            double beta, void* c, index_t ldc, index_t stride_c, index_t batch,
                            ExecContext&) const override {
    const auto es = static_cast<index_t>(dtype_size(dt));
    for (index_t i = 0; i < batch; ++i)
      shard::detail::gemm_core(dt, ta, tb, m, n, k, alpha, static_cast<const char*>(a) + i * stride_a * es, lda,
                               static_cast<const char*>(b) + i * stride_b * es, ldb, beta,
                               static_cast<char*>(c) + i * stride_c * es, ldc);
  }
  void add_bias(DType dt, index_t A, index_t cout, index_t S, const void* bias, void* y, ExecContext&) const override {
    if (dt == DType::f32)
      add_bias_impl<float>(A, cout, S, static_cast<const float*>(bias), static_cast<float*>(y));
    else
      add_bias_impl<double>(A, cout, S, static_cast<const double*>(bias), static_cast<double*>(y));
  }
  void bias_grad(DType dt, index_t A, index_t cout, index_t S, const void* g, void* db, ExecContext&) const override {
    if (dt == DType::f32)
      bias_grad_impl<float>(A, cout, S, static_cast<const float*>(g), static_cast<float*>(db));
    else
      bias_grad_impl<double>(A, cout, S, static_cast<const double*>(g), static_cast<double*>(db));
  }
};

const CpuGemm g_cpu_gemm;

}  // namespace

SHARD_CPU_TABLE(gemm, g_cpu_gemm);

}  // namespace shard::exec
