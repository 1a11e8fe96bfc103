// CUDA implementation of the `box` kernel family: host glue over the launchers in kernels/box.cu
// (firewall header src/kernels_api/box.hpp), registered for DeviceKind::cuda when this library
// (shardtensor::cuda) is linked. Work is queued on the context's stream, asynchronously.
#include <cuda_runtime.h>

#include "exec/box_kernels.hpp"
#include "kernels_api/box.hpp"

namespace shard::exec {
namespace {

static_assert(sizeof(index_t) == sizeof(std::int64_t), "index_t is the launchers' 64-bit index");

void check(int rc, const char* op, const Block& dst) {
  SHARD_CHECK(rc == 0, op, "CUDA launch failed for a {} box of shape {} on {}: {}", dst.dtype, dst.shape_vec(),
              dst.device, kernels::box_error_string(rc));
}

/// Makes dst's device current for the launch.
void set_device(const Block& dst, const char* op) {
  const cudaError_t rc = cudaSetDevice(dst.device.index);
  SHARD_CHECK(rc == cudaSuccess, op, "cudaSetDevice({}) failed: {}", dst.device.index, cudaGetErrorString(rc));
}

kernels::BoxAddType add_type(DType dt) {
  switch (dt) {
    case DType::f32: return kernels::box_f32;
    case DType::f64: return kernels::box_f64;
    case DType::i32: return kernels::box_i32;
    case DType::i64: return kernels::box_i64;
    case DType::c64: return kernels::box_c64;
    case DType::c128: return kernels::box_c128;
    case DType::bf16: return kernels::box_bf16;
    case DType::f16: return kernels::box_f16;
    default: SHARD_FAIL("box_add", "dtype {} cannot be accumulated (f32, f64, bf16, f16, c64, c128, i32, i64)", dt);
  }
}

struct CudaBoxKernels final : BoxKernels {
  // bf16 / f16 boxes are copied, filled and accumulated (one rounding per element) in place.
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void copy(const Block& dst, const Block& src, ExecContext& ctx) const override {
    set_device(dst, "box_copy");
    check(kernels::box_copy_launch(static_cast<int>(dst.element_bytes()), dst.rank, dst.shape.data(), dst.data,
                                   dst.strides.data(), src.data, src.strides.data(), ctx.stream().handle),
          "box_copy", dst);
  }
  void add(const Block& dst, const Block& src, ExecContext& ctx) const override {
    set_device(dst, "box_add");
    check(kernels::box_add_launch(add_type(dst.dtype), dst.rank, dst.shape.data(), dst.data, dst.strides.data(),
                                  src.data, src.strides.data(), ctx.stream().handle),
          "box_add", dst);
  }
  void fill(const Block& dst, const void* value, ExecContext& ctx) const override {
    set_device(dst, "box_fill");
    check(kernels::box_fill_launch(static_cast<int>(dst.element_bytes()), dst.rank, dst.shape.data(), dst.data,
                                   dst.strides.data(), value, ctx.stream().handle),
          "box_fill", dst);
  }
};

const CudaBoxKernels g_cuda_box;

}  // namespace

/// Registers the CUDA box kernels (also called by the static registrar below; idempotent).
void register_box_cuda() noexcept { register_family(DeviceKind::cuda, KernelFamily::box, &g_cuda_box); }

namespace {
struct Registrar {
  Registrar() { register_box_cuda(); }
} const g_registrar;
}  // namespace

}  // namespace shard::exec
