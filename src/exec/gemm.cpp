// GEMM kernel family front: size checks and device dispatch (see include/shardtensor/exec/gemm.hpp).
#include "shardtensor/exec/gemm.hpp"

#include <algorithm>
#include <climits>

#include "exec/front_util.hpp"
#include "exec/gemm_kernels.hpp"

namespace shard::exec {

/// Keeps src/exec/gemm_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
extern const int* const gemm_cpu_keep;
const int* const gemm_cpu_keep = &gemm_cpu_anchor;

namespace {

void check_sizes(const char* op, Trans ta, Trans tb, index_t m, index_t n, index_t k, index_t lda, index_t ldb,
                 index_t ldc) {
  SHARD_CHECK(m >= 0 && n >= 0 && k >= 0, op, "negative size m={} n={} k={}", m, n, k);
  const index_t a_cols = ta == Trans::no ? k : m, b_cols = tb == Trans::no ? n : k;
  SHARD_CHECK(lda >= std::max<index_t>(1, a_cols) && ldb >= std::max<index_t>(1, b_cols) &&
                  ldc >= std::max<index_t>(1, n),
              op, "leading dimensions lda={} ldb={} ldc={} too small for m={} n={} k={}", lda, ldb, ldc, m, n, k);
  SHARD_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX, op,
              "sizes exceed the 32-bit BLAS interface (m={} n={} k={})", m, n, k);
}
}  // namespace

void gemm(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t k, double alpha, const void* a, index_t lda,
          const void* b, index_t ldb, double beta, void* c, index_t ldc, Device dev, ExecContext& ctx) {
  const auto& t = detail::front_table<GemmKernels>("gemm", dt, dev, ctx);
  check_sizes("gemm", ta, tb, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  t.gemm_strided_batched(dt, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1, ctx);
}

void gemm_strided_batched(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t k, double alpha, const void* a,
                          index_t lda, index_t stride_a, const void* b, index_t ldb, index_t stride_b, double beta,
                          void* c, index_t ldc, index_t stride_c, index_t batch, Device dev, ExecContext& ctx) {
  const char* op = "gemm_strided_batched";
  const auto& t = detail::front_table<GemmKernels>(op, dt, dev, ctx);
  check_sizes(op, ta, tb, m, n, k, lda, ldb, ldc);
  SHARD_CHECK(batch >= 0 && stride_a >= 0 && stride_b >= 0 && stride_c >= 0, op,
              "batch {} and strides {}, {}, {} must be >= 0", batch, stride_a, stride_b, stride_c);
  SHARD_CHECK(batch <= 1 || stride_c >= m * ldc, op, "C stride {} overlaps matrices of {} rows with ldc {}", stride_c,
              m, ldc);
  if (m == 0 || n == 0 || batch == 0) return;
  t.gemm_strided_batched(dt, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch,
                         ctx);
}

void add_bias(DType dt, index_t A, index_t cout, index_t S, const void* bias, void* y, Device dev, ExecContext& ctx) {
  const auto& t = detail::front_table<GemmKernels>("add_bias", dt, dev, ctx);
  SHARD_CHECK(A >= 0 && cout >= 0 && S >= 0, "add_bias", "negative extent A={} C={} S={}", A, cout, S);
  if (A * cout * S > 0) t.add_bias(dt, A, cout, S, bias, y, ctx);
}

void bias_grad(DType dt, index_t A, index_t cout, index_t S, const void* g, void* db, Device dev, ExecContext& ctx) {
  const auto& t = detail::front_table<GemmKernels>("bias_grad", dt, dev, ctx);
  SHARD_CHECK(A >= 0 && cout >= 0 && S >= 0, "bias_grad", "negative extent A={} C={} S={}", A, cout, S);
  if (cout > 0) t.bias_grad(dt, A, cout, S, g, db, ctx);
}

}  // namespace shard::exec
