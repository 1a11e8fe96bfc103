// Row-major GEMM over OpenBLAS (cblas) and the BLAS thread-pool controls.
#include "shardtensor/tensor/gemm.hpp"

#include <cblas.h>

#include <climits>

extern "C" {
// Declared here as well so the wrapper does not depend on which cblas.h the alternatives pick.
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char* openblas_get_corename(void);
}

namespace shard {
namespace detail {

void gemm_core(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t k, double alpha, const void* a,
               index_t lda, const void* b, index_t ldb, double beta, void* c, index_t ldc) {
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64, "gemm", "dtype {} not supported (f32, f64 only)", dt);
  SHARD_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm", "negative size m={} n={} k={}", m, n, k);
  const index_t a_cols = ta == Trans::no ? k : m, b_cols = tb == Trans::no ? n : k;
  SHARD_CHECK(lda >= std::max<index_t>(1, a_cols) && ldb >= std::max<index_t>(1, b_cols) &&
                  ldc >= std::max<index_t>(1, n),
              "gemm", "leading dimensions lda={} ldb={} ldc={} too small for m={} n={} k={}", lda, ldb, ldc, m, n, k);
  SHARD_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
              "gemm", "sizes exceed the 32-bit BLAS interface (m={} n={} k={})", m, n, k);
  if (m == 0 || n == 0) return;
  const auto cta = ta == Trans::no ? CblasNoTrans : CblasTrans;
  const auto ctb = tb == Trans::no ? CblasNoTrans : CblasTrans;
  if (dt == DType::f32) {
    cblas_sgemm(CblasRowMajor, cta, ctb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                static_cast<float>(alpha), static_cast<const float*>(a), static_cast<int>(lda),
                static_cast<const float*>(b), static_cast<int>(ldb), static_cast<float>(beta), static_cast<float*>(c),
                static_cast<int>(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, cta, ctb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha,
                static_cast<const double*>(a), static_cast<int>(lda), static_cast<const double*>(b),
                static_cast<int>(ldb), beta, static_cast<double*>(c), static_cast<int>(ldc));
  }
}

}  // namespace detail

int blas_num_threads() noexcept { return openblas_get_num_threads(); }

void set_blas_num_threads(int n) {
  SHARD_CHECK(n >= 1, "set_blas_num_threads", "thread count {} < 1", n);
  openblas_set_num_threads(n);
}

const char* blas_core_name() noexcept { return openblas_get_corename(); }

}  // namespace shard
