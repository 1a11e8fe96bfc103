// GEMM kernel family front: operand checks and device dispatch (see include/shardtensor/exec/gemm.hpp).
#include "shardtensor/exec/gemm.hpp"

#include <algorithm>
#include <climits>

#include "exec/front_util.hpp"
#include "shardtensor/exec/precision.hpp"
#include "exec/gemm_kernels.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

/// Keeps src/exec/gemm_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
SHARD_KEEP_CPU_TABLE(gemm);

namespace {

/// A stored matrix operand: batch, rows, cols, leading dimension and batch stride.
struct Matrix {
  index_t batch = 1, rows = 0, cols = 0, ld = 1, stride = 0;
};

Matrix matrix(const char* op, const char* what, const Block& b) {
  SHARD_CHECK(b.rank == 2 || b.rank == 3, op, "{} must be a rank-2 matrix or a rank-3 batch of matrices, got shape {}",
              what, b.shape_vec());
  const auto r = static_cast<std::size_t>(b.rank);
  Matrix m;
  m.rows = b.shape[r - 2];
  m.cols = b.shape[r - 1];
  SHARD_CHECK(m.cols <= 1 || b.strides[r - 1] == 1, op, "{} (shape {}, strides {}) needs a unit column stride", what,
              b.shape_vec(), b.strides_vec());
  const index_t min_ld = std::max<index_t>(1, m.cols);
  m.ld = m.rows <= 1 ? std::max(b.strides[r - 2], min_ld) : b.strides[r - 2];
  SHARD_CHECK(m.ld >= min_ld, op, "{} row stride {} is smaller than its {} columns", what, m.ld, m.cols);
  if (b.rank == 3) {
    m.batch = b.shape[0];
    m.stride = m.batch <= 1 ? 0 : b.strides[0];
    SHARD_CHECK(m.stride >= 0, op, "{} has a negative batch stride {}", what, m.stride);
  }
  return m;
}

/// True when the table of ctx's device computes `pass` on the dtype dt itself (detail::native_storage).
bool storage_native(DType dt, KernelPass pass, const ExecContext& ctx) {
  return detail::native_storage(kernels_for<GemmKernels>(ctx.device(), "gemm"), dt, pass, ctx);
}
/// The table for ctx's device after checking dt: f32, f64, or bf16 / f16 where the table computes them.
const GemmKernels& gemm_table(const char* op, DType dt, KernelPass pass, const ExecContext& ctx) {
  if (!detail::is_low_precision(dt)) return detail::front_table<GemmKernels>(op, dt, ctx.device(), ctx);
  return detail::storage_table<GemmKernels>(op, dt, pass, ctx.device(), ctx);
}

}  // namespace

void gemm(const GemmGeometry& g, const Block& a, const Block& b, const Block& c, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "gemm", "", &ctx);
  if (detail::F32Work::needed(a.dtype, b.dtype, c.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("gemm", {a.dtype, b.dtype, c.dtype});
    if (!storage_native(c.dtype, KernelPass::forward, ctx)) {
      detail::F32Work f(ctx);
      gemm(g, f.in(a), f.in(b), f.out(c, g.beta != 0.0), ctx);
      return f.finish();
    }
  }
  const char* op = "gemm";
  const DType dt = c.dtype;
  detail::check_block(op, "A", a, dt, -1, ctx);
  detail::check_block(op, "B", b, dt, -1, ctx);
  detail::check_block(op, "C", c, dt, -1, ctx);
  const auto& t = gemm_table(op, dt, KernelPass::forward, ctx);
  const Matrix A = matrix(op, "A", a), B = matrix(op, "B", b), C = matrix(op, "C", c);
  const index_t m = C.rows, n = C.cols, k = g.ta == Trans::no ? A.cols : A.rows;
  const index_t am = g.ta == Trans::no ? A.rows : A.cols;
  const index_t bk = g.tb == Trans::no ? B.rows : B.cols, bn = g.tb == Trans::no ? B.cols : B.rows;
  SHARD_CHECK(am == m && bk == k && bn == n, op,
              "shapes do not multiply: op(A) of {} [{} x {}], op(B) of {} [{} x {}], C {}", a.shape_vec(), am, k,
              b.shape_vec(), bk, bn, c.shape_vec());
  SHARD_CHECK((A.batch == C.batch || A.batch == 1) && (B.batch == C.batch || B.batch == 1), op,
              "batch sizes A {} and B {} do not match C's {}", A.batch, B.batch, C.batch);
  SHARD_CHECK(C.batch <= 1 || C.stride >= m * C.ld, op, "C stride {} overlaps matrices of {} rows with ldc {}",
              C.stride, m, C.ld);
  SHARD_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && A.ld <= INT_MAX && B.ld <= INT_MAX && C.ld <= INT_MAX,
              op, "sizes exceed the 32-bit BLAS interface (m={} n={} k={})", m, n, k);
  if (m == 0 || n == 0 || C.batch == 0) return;
  t.gemm_strided_batched(dt, g.ta, g.tb, m, n, k, g.alpha, a.data, A.ld, A.batch == 1 ? 0 : A.stride, b.data, B.ld,
                         B.batch == 1 ? 0 : B.stride, g.beta, c.data, C.ld, C.stride, C.batch, ctx);
}

void add_bias(const BiasGeometry& g, const Block& bias, const Block& y, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "gemm", "add_bias", &ctx);
  if (detail::F32Work::needed(bias.dtype, y.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("add_bias", {bias.dtype, y.dtype});
    if (!storage_native(y.dtype, KernelPass::forward, ctx)) {
      detail::F32Work f(ctx);
      add_bias(g, f.in(bias), f.out(y, true), ctx);
      return f.finish();
    }
  }
  const char* op = "add_bias";
  SHARD_CHECK(g.A >= 0 && g.channels >= 0 && g.S >= 0, op, "negative extent A={} C={} S={}", g.A, g.channels, g.S);
  detail::check_block(op, "bias", bias, y.dtype, g.channels, ctx);
  detail::check_block(op, "output", y, y.dtype, g.A * g.channels * g.S, ctx);
  const auto& t = gemm_table(op, y.dtype, KernelPass::forward, ctx);
  if (g.A * g.channels * g.S > 0) t.add_bias(y.dtype, g.A, g.channels, g.S, bias.data, y.data, ctx);
}

void bias_grad(const BiasGeometry& g, const Block& gy, const Block& db, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "gemm", "bias_grad", &ctx);
  if (detail::F32Work::needed(gy.dtype, db.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("bias_grad", {gy.dtype, db.dtype});
    if (!storage_native(db.dtype, KernelPass::backward_bias, ctx)) {
      detail::F32Work f(ctx);
      bias_grad(g, f.in(gy), f.out(db), ctx);
      return f.finish();
    }
  }
  const char* op = "bias_grad";
  SHARD_CHECK(g.A >= 0 && g.channels >= 0 && g.S >= 0, op, "negative extent A={} C={} S={}", g.A, g.channels, g.S);
  detail::check_block(op, "gradient", gy, db.dtype, g.A * g.channels * g.S, ctx);
  detail::check_block(op, "bias gradient", db, db.dtype, g.channels, ctx);
  const auto& t = gemm_table(op, db.dtype, KernelPass::backward_bias, ctx);
  if (g.channels > 0) t.bias_grad(db.dtype, g.A, g.channels, g.S, gy.data, db.data, ctx);
}

}  // namespace shard::exec
