// exec::TensorDeviceKernels on CUDA: Tensor's device entry points (strided copy, fill, axpby,
// mul, sum) call the launchers in kernels/elementwise.cu (through the firewall header
// src/kernels_api.hpp) on the calling thread's current stream for the device. The launchers
// synchronise that stream before returning.
#include "exec/tensor_kernels.hpp"
#include "kernels_api.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/device_runtime.hpp"

#include <cuda_runtime.h>

namespace shard::exec {
namespace {

/// Checks the device, makes it current, and returns the stream of its current context.
void* prepare(Device dev, const char* op) {
  kernels_for<DeviceRuntime>(dev, op).check_device(dev.index, op);
  const cudaError_t e = cudaSetDevice(dev.index);
  SHARD_CHECK(e == cudaSuccess, op, "cudaSetDevice({}) failed: {}", dev.index, cudaGetErrorString(e));
  return current_context(dev).stream().handle;
}
void check(int rc, Device dev, const char* op) {
  SHARD_CHECK(rc == 0, op, "CUDA kernel failed on {}: {}", dev, kernels::error_string(rc));
}
int is_f64(DType dt, const char* op) {
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64, op, "dtype {} is not supported on CUDA (f32, f64 only)", dt);
  return dt == DType::f64 ? 1 : 0;
}

class CudaTensorKernels final : public TensorDeviceKernels {
 public:
  void strided_copy(DType dt, int rank, const index_t* shape, const void* src, const index_t* src_strides, void* dst,
                    const index_t* dst_strides, Device dev) const override {
    SHARD_CHECK(rank <= kernels::kMaxRank, "copy", "rank {} exceeds the CUDA strided-copy limit {}", rank,
                kernels::kMaxRank);
    void* s = prepare(dev, "copy");
    check(kernels::strided_copy(static_cast<int>(dtype_size(dt)), rank, shape, src, src_strides, dst, dst_strides, s),
          dev, "copy");
  }
  void fill(DType dt, void* dst, index_t n, const void* value, Device dev) const override {
    void* s = prepare(dev, "fill");
    check(kernels::fill(static_cast<int>(dtype_size(dt)), dst, n, value, s), dev, "fill");
  }
  void axpby(DType dt, index_t n, double alpha, const void* x, double beta, void* y, Device dev) const override {
    const int f = is_f64(dt, "axpby");
    void* s = prepare(dev, "axpby");
    check(kernels::axpby(f, n, alpha, x, beta, y, s), dev, "axpby");
  }
  void mul(DType dt, index_t n, const void* a, const void* b, void* out, Device dev) const override {
    const int f = is_f64(dt, "mul");
    void* s = prepare(dev, "mul");
    check(kernels::mul(f, n, a, b, out, s), dev, "mul");
  }
  double sum(DType dt, index_t n, const void* x, Device dev) const override {
    const int f = is_f64(dt, "sum");
    void* s = prepare(dev, "sum");
    double out = 0;
    check(kernels::sum(f, n, x, &out, s), dev, "sum");
    return out;
  }
};

const CudaTensorKernels& table() {
  static const CudaTensorKernels* t = new CudaTensorKernels;  // never destroyed (see runtime_cuda.cpp)
  return *t;
}
[[maybe_unused]] const bool registered = (register_family(DeviceKind::cuda, KernelFamily::tensor, &table()), true);

}  // namespace
}  // namespace shard::exec
