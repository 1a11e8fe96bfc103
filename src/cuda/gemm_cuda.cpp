// CUDA implementation of the GEMM kernel family: cuBLAS (s/d gemm, strided-batched) on the
// context's stream, one handle per device and thread, CUBLAS_DEFAULT_MATH unless the context's
// ExecSettings::allow_tf32 is set; the bias epilogues are kernels/gemm.cu. Registered for
// DeviceKind::cuda when shardtensor::cuda is linked.
#include <cublas_v2.h>

#include <array>

#include "cuda/family_util.hpp"
#include "exec/gemm_kernels.hpp"
#include "kernels_api/gemm.hpp"

namespace shard::exec {
namespace {

namespace k = shard::kernels::gemm;
using cuda_glue::check;

void check_blas(cublasStatus_t st, const char* op) {
  if (st != CUBLAS_STATUS_SUCCESS) SHARD_FAIL(op, "cuBLAS error {} ({})", static_cast<int>(st), cublasGetStatusString(st));
}

/// The calling thread's cuBLAS handle for `device`, bound to `stream` and the context's math mode.
/// Handles live until the thread ends (released with the CUDA context at process exit, as is usual
/// for cuBLAS handles: destroying them during static destruction may outlive the driver).
cublasHandle_t handle_for(const ExecContext& ctx, cudaStream_t stream, const char* op) {
  constexpr int kMaxDevices = 16;
  thread_local std::array<cublasHandle_t, kMaxDevices> handles{};
  const int dev = ctx.device().index;
  SHARD_CHECK(dev >= 0 && dev < kMaxDevices, op, "device index {} out of range 0..{}", dev, kMaxDevices - 1);
  auto& h = handles[static_cast<std::size_t>(dev)];
  if (!h) check_blas(cublasCreate(&h), op);
  check_blas(cublasSetStream(h, stream), op);
  check_blas(cublasSetMathMode(h, ctx.settings().allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), op);
  return h;
}

cublasOperation_t op_of(Trans t) { return t == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }
int f64(DType dt) { return dt == DType::f64 ? 1 : 0; }

struct CudaGemm final : GemmKernels {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and m, n.
  void gemm_strided_batched(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t kk, double alpha,
                            const void* a, index_t lda, index_t stride_a, const void* b, index_t ldb, index_t stride_b,
                            double beta, void* c, index_t ldc, index_t stride_c, index_t batch,
                            ExecContext& ctx) const override {
    const char* op = "gemm (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    cublasHandle_t h = handle_for(ctx, s, op);
    const auto M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(kk);
    SHARD_CHECK(batch <= 2147483647, op, "batch {} exceeds the cuBLAS interface", batch);
    if (dt == DType::f64) {
      check_blas(cublasDgemmStridedBatched(h, op_of(tb), op_of(ta), N, M, K, &alpha, static_cast<const double*>(b),
                                           static_cast<int>(ldb), stride_b, static_cast<const double*>(a),
                                           static_cast<int>(lda), stride_a, &beta, static_cast<double*>(c),
                                           static_cast<int>(ldc), stride_c, static_cast<int>(batch)),
                 op);
    } else {
      const float fa = static_cast<float>(alpha), fb = static_cast<float>(beta);
      check_blas(cublasSgemmStridedBatched(h, op_of(tb), op_of(ta), N, M, K, &fa, static_cast<const float*>(b),
                                           static_cast<int>(ldb), stride_b, static_cast<const float*>(a),
                                           static_cast<int>(lda), stride_a, &fb, static_cast<float*>(c),
                                           static_cast<int>(ldc), stride_c, static_cast<int>(batch)),
                 op);
    }
  }
  void add_bias(DType dt, index_t A, index_t cout, index_t S, const void* bias, void* y,
                ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "add_bias (cuda)");
    check(k::add_bias(f64(dt), A, cout, S, bias, y, s), "add_bias (cuda)");
  }
  void bias_grad(DType dt, index_t A, index_t cout, index_t S, const void* g, void* db,
                 ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "bias_grad (cuda)");
    check(k::bias_grad(f64(dt), A, cout, S, g, db, s), "bias_grad (cuda)");
  }
};

const CudaGemm g_cuda_gemm;

}  // namespace

/// Referenced by the shardtensor::cuda registration anchor so that the linker keeps this file.
extern const int gemm_cuda_anchor;
const int gemm_cuda_anchor = (register_family(DeviceKind::cuda, KernelFamily::gemm, &g_cuda_gemm), 1);

}  // namespace shard::exec
