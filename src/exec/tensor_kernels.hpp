#pragma once
// TensorDeviceKernels: the device side of Tensor's own entry points (tensor.hpp / ops.hpp:
// strided copy between views, fill, axpby, mul, sum) for non-host devices. The host side is
// inline in the headers; shardtensor::cuda implements this table (src/cuda/tensor_ops_cuda.cpp)
// and the front src/exec/tensor.cpp dispatches to it through the registry.
#include <complex>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct TensorDeviceKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::tensor;
  virtual ~TensorDeviceKernels() = default;

  /// dst[i] = src[i] over a strided box of `rank` (<= 8) dims, both on `dev`.
  virtual void strided_copy(DType dt, int rank, const index_t* shape, const void* src, const index_t* src_strides,
                            void* dst, const index_t* dst_strides, Device dev) const = 0;
  /// dst[0..n) = *value (dtype_size(dt) bytes).
  virtual void fill(DType dt, void* dst, index_t n, const void* value, Device dev) const = 0;
  /// y = alpha x + beta y over n contiguous elements.
  virtual void axpby(DType dt, index_t n, double alpha, const void* x, double beta, void* y, Device dev) const = 0;
  /// out = a * b over n contiguous elements (dt f32, f64; c64 / c128, the complex product, on a
  /// table with complex kernels: CUDA's).
  virtual void mul(DType dt, index_t n, const void* a, const void* b, void* out, Device dev) const = 0;
  /// Sum of n contiguous elements, accumulated in double.
  virtual double sum(DType dt, index_t n, const void* x, Device dev) const = 0;
  /// y = alpha x + beta y over n contiguous complex elements (dt c64 / c128, alpha and beta
  /// complex). The default throws: a table without complex kernels refuses clearly.
  virtual void axpby_complex(DType dt, index_t n, std::complex<double> alpha, const void* x, std::complex<double> beta,
                             void* y, Device dev) const {
    (void)n, (void)alpha, (void)x, (void)beta, (void)y;
    SHARD_FAIL("axpy", "complex on {} not implemented ({}: no complex kernels in its tensor table)", dev, dt);
  }
  /// Sum of n contiguous complex elements (c64 / c128), accumulated in complex<double>.
  virtual std::complex<double> sum_complex(DType dt, index_t n, const void* x, Device dev) const {
    (void)n, (void)x;
    SHARD_FAIL("sum", "complex on {} not implemented ({}: no complex kernels in its tensor table)", dev, dt);
  }
};

}  // namespace shard::exec
