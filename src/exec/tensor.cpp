// The front of the `tensor` kernel family: Tensor's device entry points (declared in
// tensor/ops.hpp; tensor.hpp / ops.hpp call them for non-host tensors). They look up the device's
// TensorDeviceKernels table (exec/tensor_kernels.hpp) in the registry: shardtensor::cuda registers
// the CUDA one; without it (or in a build without CUDA) the lookup throws a shard::Error naming the
// op and the device. Here in exec/, not in tensor/, because the bf16/f16 route takes the f32
// working copies of exec/precision.hpp, which convert through the pointwise family.
#include "exec/front_util.hpp"
#include "exec/tensor_kernels.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/tensor/ops.hpp"

namespace shard::detail {
namespace {
const exec::TensorDeviceKernels& table(Device dev, const char* op) {
  return exec::kernels_for<exec::TensorDeviceKernels>(dev, op);
}
}  // namespace

void device_strided_copy(DType dt, int rank, const index_t* shape, const void* src, const index_t* src_strides,
                         void* dst, const index_t* dst_strides, Device dev) {
  table(dev, "copy").strided_copy(dt, rank, shape, src, src_strides, dst, dst_strides, dev);
}
void device_fill(DType dt, void* dst, index_t n, const void* value, Device dev) {
  table(dev, "fill").fill(dt, dst, n, value, dev);
}
namespace {
/// bf16 / f16 device buffers the table does not compute itself (exec::detail::native_storage; the
/// CUDA table computes in f32 and f64 only): the f32 kernels on f32 working copies
/// (exec/precision.hpp), made and converted back on the context `dev`'s current context orders.
bool widens(DType dt, Device dev, const char* op) {
  return !exec::detail::native_storage(table(dev, op), dt, exec::KernelPass::forward, current_context(dev));
}
Block flat(DType dt, Device dev, const void* p, index_t n) { return Block::view(dt, dev, const_cast<void*>(p), &n, 1); }
}  // namespace

void device_axpby(DType dt, index_t n, double alpha, const void* x, double beta, void* y, Device dev) {
  if (widens(dt, dev, "axpby")) {
    exec::detail::F32Work f(current_context(dev));
    const Block xf = f.in(flat(dt, dev, x, n)), yf = f.out(flat(dt, dev, y, n), true);
    table(dev, "axpby").axpby(DType::f32, n, alpha, xf.data, beta, yf.data, dev);
    return f.finish();
  }
  table(dev, "axpby").axpby(dt, n, alpha, x, beta, y, dev);
}
void device_mul(DType dt, index_t n, const void* a, const void* b, void* out, Device dev) {
  if (widens(dt, dev, "mul")) {
    exec::detail::F32Work f(current_context(dev));
    const Block af = f.in(flat(dt, dev, a, n)), bf = f.in(flat(dt, dev, b, n)), of = f.out(flat(dt, dev, out, n));
    table(dev, "mul").mul(DType::f32, n, af.data, bf.data, of.data, dev);
    return f.finish();
  }
  table(dev, "mul").mul(dt, n, a, b, out, dev);
}
double device_sum(DType dt, index_t n, const void* x, Device dev) {
  if (widens(dt, dev, "sum")) {
    exec::detail::F32Work f(current_context(dev));
    const Block xf = f.in(flat(dt, dev, x, n));
    return table(dev, "sum").sum(DType::f32, n, xf.data, dev);
  }
  return table(dev, "sum").sum(dt, n, x, dev);
}
void device_axpby_complex(DType dt, index_t n, std::complex<double> alpha, const void* x, std::complex<double> beta,
                          void* y, Device dev) {
  table(dev, "axpy").axpby_complex(dt, n, alpha, x, beta, y, dev);
}
std::complex<double> device_sum_complex(DType dt, index_t n, const void* x, Device dev) {
  return table(dev, "sum").sum_complex(dt, n, x, dev);
}

}  // namespace shard::detail
