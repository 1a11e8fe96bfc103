// CUDA implementation of the pool kernel family (kernels/pool.cu behind src/kernels_api/pool.hpp),
// registered for DeviceKind::cuda when shardtensor::cuda is linked.
#include "cuda/family_util.hpp"
#include "exec/pool_kernels.hpp"
#include "kernels_api/pool.hpp"

namespace shard::exec {
namespace {

namespace k = shard::kernels::pool;
using cuda_glue::check;

k::Geom geom(const PoolGeometry& g) {
  k::Geom r{};
  r.planes = g.planes;
  for (int d = 0; d < 3; ++d) {
    const auto u = static_cast<std::size_t>(d);
    r.in[d] = g.in[u];
    r.out[d] = g.out[u];
    r.kernel[d] = g.kernel[u];
    r.stride[d] = g.stride[u];
    r.pad_lo[d] = g.pad_lo[u];
    r.pad_end[d] = g.pad_end[u];
    if (g.pad_end[u] < kPoolNoClip) r.clip_divisor = 1;
  }
  r.count_include_pad = g.count_include_pad ? 1 : 0;
  return r;
}

struct CudaPool final : PoolKernels {
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void avg_forward(DType dt, const PoolGeometry& g, const void* x, void* y, ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "avg_pool_forward (cuda)");
    check(k::avg_forward(cuda_glue::storage_code(dt), geom(g), x, y, s), "avg_pool_forward (cuda)");
  }
  void avg_backward(DType dt, const PoolGeometry& g, const void* gy, void* gx, ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "avg_pool_backward (cuda)");
    check(k::avg_backward(cuda_glue::storage_code(dt), geom(g), gy, gx, s), "avg_pool_backward (cuda)");
  }
  void max_forward(DType dt, const PoolGeometry& g, const void* x, void* y, std::int64_t* idx,
                   ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "max_pool_forward (cuda)");
    check(k::max_forward(cuda_glue::storage_code(dt), geom(g), x, y, idx, s), "max_pool_forward (cuda)");
  }
  void max_backward(DType dt, const PoolGeometry& g, const void* gy, const std::int64_t* idx, void* gx,
                    ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "max_pool_backward (cuda)");
    check(k::max_backward(cuda_glue::storage_code(dt), geom(g), gy, idx, gx, s), "max_pool_backward (cuda)");
  }
};

const CudaPool g_cuda_pool;

}  // namespace

/// Referenced by the shardtensor::cuda registration anchor so that the linker keeps this file.
extern const int pool_cuda_anchor;
const int pool_cuda_anchor = (register_family(DeviceKind::cuda, KernelFamily::pool, &g_cuda_pool), 1);

}  // namespace shard::exec
