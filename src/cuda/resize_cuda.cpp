// CUDA implementation of the resize kernel family (kernels/resize.cu behind
// src/kernels_api/resize.hpp), registered for DeviceKind::cuda when shardtensor::cuda is linked.
// The front (src/exec/resize.cpp) has checked the block geometry.
#include "cuda/family_util.hpp"
#include "exec/resize_kernels.hpp"
#include "kernels_api/resize.hpp"

namespace shard::exec {
namespace {

namespace k = shard::kernels::resize;
using cuda_glue::check;

k::Geom geom(const ResizeGeometry& g) {
  k::Geom r{};
  r.planes = g.planes;
  for (int d = 0; d < 3; ++d) {
    const auto u = static_cast<std::size_t>(d);
    r.scale[d] = g.scale[u];
    r.global_in[d] = g.global_in[u];
    r.in_lo[d] = g.in_lo[u];
    r.in_len[d] = g.in_len[u];
    r.out_lo[d] = g.out_lo[u];
    r.out_len[d] = g.out_len[u];
    r.global_out[d] = g.global_out[u];
    r.ratio[d] = g.ratio[u];
  }
  r.align_corners = g.align_corners ? 1 : 0;
  return r;
}
int mode_code(ResizeMode m) { return m == ResizeMode::cubic ? 2 : m == ResizeMode::linear ? 1 : 0; }

struct CudaResize final : ResizeKernels {
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void forward(DType dt, ResizeMode mode, const ResizeGeometry& g, const void* x, void* y,
               ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "resize_forward (cuda)");
    check(k::forward(cuda_glue::storage_code(dt), mode_code(mode), geom(g), x, y, s), "resize_forward (cuda)");
  }
  void backward(DType dt, ResizeMode mode, const ResizeGeometry& g, const void* gy, void* gx,
                ExecContext& ctx) const override {
    const auto s = cuda_glue::enter(ctx, "resize_backward (cuda)");
    check(k::backward(cuda_glue::storage_code(dt), mode_code(mode), geom(g), gy, gx, s), "resize_backward (cuda)");
  }
};

const CudaResize g_cuda_resize;

}  // namespace

/// Referenced by the shardtensor::cuda registration anchor so that the linker keeps this file.
extern const int resize_cuda_anchor;
const int resize_cuda_anchor = (register_family(DeviceKind::cuda, KernelFamily::resize, &g_cuda_resize), 1);

}  // namespace shard::exec
