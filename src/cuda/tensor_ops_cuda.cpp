// exec::TensorDeviceKernels on CUDA: Tensor's device entry points (strided copy, fill, axpby,
// mul, sum; complex axpby, mul, sum) call the launchers in kernels/elementwise.cu (through the firewall header
// src/kernels_api.hpp) on the calling thread's current stream for the device, stream-ordered
// like every op (a host reader synchronises: Tensor::to(cpu) does). Only sum waits for the stream
// (its value goes to the host).
#include "exec/tensor_kernels.hpp"
#include "shardtensor/exec/pointwise.hpp"
#include "kernels_api.hpp"
#include "kernels_api/complex.hpp"
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

int is_c128(DType dt, const char* op) {
  SHARD_CHECK(dt == DType::c64 || dt == DType::c128, op, "dtype {} is not complex (c64, c128)", dt);
  return dt == DType::c128 ? 1 : 0;
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
    if (dt == DType::c64 || dt == DType::c128) {  // the complex product (kernels/complex.cu)
      void* s = prepare(dev, "mul");
      const int rc = kernels::cx_map(dt == DType::c128 ? 1 : 0, static_cast<int>(ComplexOp::mul), 1.0, 0.0, n, a, b, out,
                                     s);
      check(rc, dev, "mul");
      return;
    }
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
  void axpby_complex(DType dt, index_t n, std::complex<double> alpha, const void* x, std::complex<double> beta, void* y,
                     Device dev) const override {
    const int f = is_c128(dt, "axpy");
    void* s = prepare(dev, "axpy");
    check(kernels::cx_axpby(f, n, alpha.real(), alpha.imag(), x, beta.real(), beta.imag(), y, s), dev, "axpy");
  }
  std::complex<double> sum_complex(DType dt, index_t n, const void* x, Device dev) const override {
    const int f = is_c128(dt, "sum");
    void* s = prepare(dev, "sum");
    double out[2] = {0, 0};
    check(kernels::cx_sum(f, n, x, out, s), dev, "sum");
    return {out[0], out[1]};
  }
};

const CudaTensorKernels& table() {
  static const CudaTensorKernels* t = new CudaTensorKernels;  // never destroyed (see runtime_cuda.cpp)
  return *t;
}
[[maybe_unused]] const bool registered = (register_family(DeviceKind::cuda, KernelFamily::tensor, &table()), true);

}  // namespace
}  // namespace shard::exec
