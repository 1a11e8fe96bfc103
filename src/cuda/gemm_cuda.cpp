// CUDA implementation of the GEMM kernel family: cuBLAS (s/d gemm, strided-batched; bf16 / f16
// through cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F: f32 accumulation, one rounding) on
// the context's stream, one handle per device and thread, CUBLAS_DEFAULT_MATH unless the context's
// ExecSettings::allow_tf32 is set; the bias epilogues are kernels/gemm.cu. Registered for
// DeviceKind::cuda when shardtensor::cuda is linked.
//
// cuBLAS is loaded on first use (dlopen), not linked: loading libcublas + libcublasLt costs a
// process ~150 MiB of resident memory (measured: dlopen of libcublasLt.so.13 alone, 1 -> 150 MiB
// RSS), which every CPU run of a program linked with shardtensor::cuda would otherwise pay.
#include <dlfcn.h>

#include <cublas_v2.h>  // types and enums; the six functions below are resolved at first use

#include <mutex>
#include <string>
#include <vector>

#include <array>

#include "cuda/family_util.hpp"
#include "exec/gemm_kernels.hpp"
#include "kernels_api/gemm.hpp"

namespace shard::exec {
namespace {

using cuda_glue::storage_code;

namespace k = shard::kernels::gemm;
using cuda_glue::check;

#ifndef SHARDTENSOR_CUBLAS_SONAME
#define SHARDTENSOR_CUBLAS_SONAME "libcublas.so"
#endif
#ifndef SHARDTENSOR_CUBLAS_PATH
#define SHARDTENSOR_CUBLAS_PATH ""
#endif

/// The cuBLAS entry points this file uses, resolved from the library on first use.
struct Cublas {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  decltype(&::cublasDgemmStridedBatched) dgemm_strided_batched = nullptr;
  /// cublasGemmStridedBatchedEx (named by its signature: the header overloads it for C++ with a
  /// legacy cudaDataType compute type).
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                      const void*, const void*, cudaDataType, int, long long, const void*,
                                      cudaDataType, int, long long, const void*, void*, cudaDataType, int, long long,
                                      int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmExFn gemm_ex_strided_batched = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  std::string error;  ///< why loading failed (empty: loaded)
};

template <class F>
bool resolve(void* lib, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f && error.empty()) error = std::string("symbol ") + name + " not found";
  return f != nullptr;
}

/// Loads cuBLAS once per process: the toolkit's soname (found through the library's RUNPATH or
/// LD_LIBRARY_PATH), else the path CMake linked against at configure time. Never unloaded.
const Cublas& cublas() {
  static const Cublas c = [] {
    Cublas r;
    void* lib = dlopen(SHARDTENSOR_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    std::string first = lib ? "" : dlerror();
    if (!lib && SHARDTENSOR_CUBLAS_PATH[0] != '\0') lib = dlopen(SHARDTENSOR_CUBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      r.error = "cannot load " SHARDTENSOR_CUBLAS_SONAME ": " + first;
      return r;
    }
    resolve(lib, "cublasCreate_v2", r.create, r.error);
    resolve(lib, "cublasSetStream_v2", r.set_stream, r.error);
    resolve(lib, "cublasSetMathMode", r.set_math_mode, r.error);
    resolve(lib, "cublasSgemmStridedBatched", r.sgemm_strided_batched, r.error);
    resolve(lib, "cublasDgemmStridedBatched", r.dgemm_strided_batched, r.error);
    resolve(lib, "cublasGemmStridedBatchedEx", r.gemm_ex_strided_batched, r.error);
    resolve(lib, "cublasGetStatusString", r.status_string, r.error);
    resolve(lib, "cublasSetWorkspace_v2", r.set_workspace, r.error);
    return r;
  }();
  return c;
}

/// cuBLAS, or shard::Error naming `op` when it cannot be loaded.
const Cublas& cublas_for(const char* op) {
  const Cublas& c = cublas();
  SHARD_CHECK(c.error.empty(), op, "cuBLAS is needed for GEMM on CUDA: {}", c.error);
  return c;
}

void check_blas(cublasStatus_t st, const char* op) {
  if (st != CUBLAS_STATUS_SUCCESS)
    SHARD_FAIL(op, "cuBLAS error {} ({})", static_cast<int>(st), cublas().status_string(st));
}

/// A cuBLAS workspace per (device, stream) of the calling thread. One handle serves every stream
/// of a thread; without a workspace of each stream's own, cuBLAS would use the handle's default
/// workspace for all of them, and GEMMs queued on two streams could run at once in one buffer.
/// Size: NVIDIA's recommendation (32 MiB on Hopper and later, 4 MiB before). The buffers are
/// kept; past 32 streams the device is synchronised and they are all released, unless a CUDA
/// graph lives (cuda_glue::live_graphs): its GEMM nodes hold their workspace's address for every
/// replay, so then the cache only grows. A workspace first needed inside a capture is allocated
/// in relaxed capture mode (not part of the graph; CapturedStep's eager warm-up normally made it).
void* stream_workspace(int dev, cudaStream_t stream, std::size_t& bytes, const char* op) {
  struct Entry {
    int dev;
    cudaStream_t stream;
    void* p;
    std::size_t bytes;
  };
  thread_local std::vector<Entry> cache;
  for (const auto& e : cache)
    if (e.dev == dev && e.stream == stream) {
      bytes = e.bytes;
      return e.p;
    }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess) {
    cudaGetLastError();
    capturing = cudaStreamCaptureStatusNone;
  }
  if (cache.size() >= 32 && cuda_glue::live_graphs() == 0 && capturing == cudaStreamCaptureStatusNone) {
    cudaDeviceSynchronize();
    for (const auto& e : cache) {
      cudaSetDevice(e.dev);
      cudaFree(e.p);
    }
    cudaSetDevice(dev);
    cache.clear();
  }
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) cudaGetLastError();
  bytes = major >= 9 ? (std::size_t{32} << 20) : (std::size_t{4} << 20);
  void* p = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (capturing != cudaStreamCaptureStatusNone) cudaThreadExchangeStreamCaptureMode(&mode);
  const cudaError_t rc = cudaMalloc(&p, bytes);
  if (capturing != cudaStreamCaptureStatusNone) cudaThreadExchangeStreamCaptureMode(&mode);
  SHARD_CHECK(rc == cudaSuccess, op, "cannot allocate a {}-byte cuBLAS workspace on cuda:{}: {}", bytes, dev,
              cudaGetErrorString(rc));
  cache.push_back({dev, stream, p, bytes});
  return p;
}

/// The calling thread's cuBLAS handle for `device`, bound to `stream` (with that stream's own
/// workspace) and the context's math mode.
/// Handles live until the thread ends (released with the CUDA context at process exit, as is usual
/// for cuBLAS handles: destroying them during static destruction may outlive the driver).
cublasHandle_t handle_for(const ExecContext& ctx, cudaStream_t stream, const char* op) {
  constexpr int kMaxDevices = 16;
  thread_local std::array<cublasHandle_t, kMaxDevices> handles{};
  const int dev = ctx.device().index;
  SHARD_CHECK(dev >= 0 && dev < kMaxDevices, op, "device index {} out of range 0..{}", dev, kMaxDevices - 1);
  auto& h = handles[static_cast<std::size_t>(dev)];
  const Cublas& blas = cublas_for(op);
  if (!h) check_blas(blas.create(&h), op);
  check_blas(blas.set_stream(h, stream), op);  // (resets the workspace to the default one)
  std::size_t ws_bytes = 0;
  void* ws = stream_workspace(dev, stream, ws_bytes, op);
  check_blas(blas.set_workspace(h, ws, ws_bytes), op);
  check_blas(blas.set_math_mode(h, ctx.settings().allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH), op);
  return h;
}

cublasOperation_t op_of(Trans t) { return t == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

struct CudaGemm final : GemmKernels {
  // bf16 / f16: cuBLAS reads and writes the storage type (tensor cores, f32 accumulation); the
  // epilogues are templated on it (kernels/gemm.cu).
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands and m, n.
  void gemm_strided_batched(DType dt, Trans ta, Trans tb, index_t m, index_t n, index_t kk, double alpha,
                            const void* a, index_t lda, index_t stride_a, const void* b, index_t ldb, index_t stride_b,
                            double beta, void* c, index_t ldc, index_t stride_c, index_t batch,
                            ExecContext& ctx) const override {
    const char* op = "gemm (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    cublasHandle_t h = handle_for(ctx, s, op);
    // cuBLAS's 32-bit interface: a larger extent or leading dimension would be truncated silently.
    constexpr index_t kIntMax = 2147483647;
    SHARD_CHECK(m <= kIntMax && n <= kIntMax && kk <= kIntMax && lda <= kIntMax && ldb <= kIntMax && ldc <= kIntMax,
                op, "m={} n={} k={} lda={} ldb={} ldc={}: an extent exceeds the 32-bit cuBLAS interface", m, n, kk,
                lda, ldb, ldc);
    const auto M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(kk);
    SHARD_CHECK(batch <= kIntMax, op, "batch {} exceeds the cuBLAS interface", batch);
    if (dt == DType::bf16 || dt == DType::f16) {
      const float fa = static_cast<float>(alpha), fb = static_cast<float>(beta);
      const cudaDataType_t t = dt == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
      check_blas(cublas().gemm_ex_strided_batched(h, op_of(tb), op_of(ta), N, M, K, &fa, b, t, static_cast<int>(ldb),
                                                  stride_b, a, t, static_cast<int>(lda), stride_a, &fb, c, t,
                                                  static_cast<int>(ldc), stride_c, static_cast<int>(batch),
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 op);
    } else if (dt == DType::f64) {
      check_blas(cublas().dgemm_strided_batched(h, op_of(tb), op_of(ta), N, M, K, &alpha, static_cast<const double*>(b),
                                           static_cast<int>(ldb), stride_b, static_cast<const double*>(a),
                                           static_cast<int>(lda), stride_a, &beta, static_cast<double*>(c),
                                           static_cast<int>(ldc), stride_c, static_cast<int>(batch)),
                 op);
    } else {
      const float fa = static_cast<float>(alpha), fb = static_cast<float>(beta);
      check_blas(cublas().sgemm_strided_batched(h, op_of(tb), op_of(ta), N, M, K, &fa, static_cast<const float*>(b),
                                           static_cast<int>(ldb), stride_b, static_cast<const float*>(a),
                                           static_cast<int>(lda), stride_a, &fb, static_cast<float*>(c),
                                           static_cast<int>(ldc), stride_c, static_cast<int>(batch)),
                 op);
    }
  }
  void add_bias(DType dt, index_t A, index_t cout, index_t S, const void* bias, void* y,
                ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "add_bias (cuda)");
    check(k::add_bias(storage_code(dt), A, cout, S, bias, y, s), "add_bias (cuda)");
  }
  void bias_grad(DType dt, index_t A, index_t cout, index_t S, const void* g, void* db,
                 ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "bias_grad (cuda)");
    check(k::bias_grad(storage_code(dt), A, cout, S, g, db, s), "bias_grad (cuda)");
  }
};

const CudaGemm g_cuda_gemm;

}  // namespace

/// Referenced by the shardtensor::cuda registration anchor so that the linker keeps this file.
extern const int gemm_cuda_anchor;
const int gemm_cuda_anchor = (register_family(DeviceKind::cuda, KernelFamily::gemm, &g_cuda_gemm), 1);

}  // namespace shard::exec
