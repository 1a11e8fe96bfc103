// Tensor's device entry points. With CUDA they call the launchers in kernels/ (through the
// firewall header src/kernels_api.hpp); without CUDA they refuse with a clear shard::Error.
#include "shardtensor/config.hpp"
#include "shardtensor/tensor/ops.hpp"
#if SHARDTENSOR_HAS_CUDA
#include <cuda_runtime.h>

#include "kernels_api.hpp"
#endif

namespace shard::detail {
namespace {
#if SHARDTENSOR_HAS_CUDA
void run(const char* op, Device dev, int rc_set, int rc) {
  SHARD_CHECK(rc_set == 0, op, "cudaSetDevice({}) failed: {}", dev.index, kernels::error_string(rc_set));
  SHARD_CHECK(rc == 0, op, "CUDA kernel failed on {}: {}", dev, kernels::error_string(rc));
}
int set(Device dev) { return static_cast<int>(cudaSetDevice(dev.index)); }
int is_f64(DType dt, const char* op) {
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64, op, "dtype {} is not supported on CUDA (f32, f64 only)", dt);
  return dt == DType::f64 ? 1 : 0;
}
#else
[[noreturn]] void no_cuda(const char* op, Device dev) {
  SHARD_FAIL(op, "tensor on {} but shardtensor was built without CUDA (SHARDTENSOR_ENABLE_CUDA=OFF)", dev);
}
#endif
}  // namespace

#if SHARDTENSOR_HAS_CUDA
void device_strided_copy(DType dt, int rank, const index_t* shape, const void* src, const index_t* src_strides,
                         void* dst, const index_t* dst_strides, Device dev) {
  const int s = set(dev);
  run("copy", dev, s,
      s ? 0 : kernels::strided_copy(static_cast<int>(dtype_size(dt)), rank, shape, src, src_strides, dst, dst_strides,
                                    nullptr));
}
void device_fill(DType dt, void* dst, index_t n, const void* value, Device dev) {
  const int s = set(dev);
  run("fill", dev, s, s ? 0 : kernels::fill(static_cast<int>(dtype_size(dt)), dst, n, value, nullptr));
}
void device_axpby(DType dt, index_t n, double alpha, const void* x, double beta, void* y, Device dev) {
  const int f = is_f64(dt, "axpby");
  const int s = set(dev);
  run("axpby", dev, s, s ? 0 : kernels::axpby(f, n, alpha, x, beta, y, nullptr));
}
void device_mul(DType dt, index_t n, const void* a, const void* b, void* out, Device dev) {
  const int f = is_f64(dt, "mul");
  const int s = set(dev);
  run("mul", dev, s, s ? 0 : kernels::mul(f, n, a, b, out, nullptr));
}
double device_sum(DType dt, index_t n, const void* x, Device dev) {
  const int f = is_f64(dt, "sum");
  const int s = set(dev);
  double out = 0;
  run("sum", dev, s, s ? 0 : kernels::sum(f, n, x, &out, nullptr));
  return out;
}
#else
void device_strided_copy(DType, int, const index_t*, const void*, const index_t*, void*, const index_t*, Device dev) {
  no_cuda("copy", dev);
}
void device_fill(DType, void*, index_t, const void*, Device dev) { no_cuda("fill", dev); }
void device_axpby(DType, index_t, double, const void*, double, void*, Device dev) { no_cuda("axpby", dev); }
void device_mul(DType, index_t, const void*, const void*, void*, Device dev) { no_cuda("mul", dev); }
double device_sum(DType, index_t, const void*, Device dev) { no_cuda("sum", dev); }
#endif

}  // namespace shard::detail
