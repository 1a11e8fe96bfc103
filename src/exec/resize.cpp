// Resize kernel family front: checks and device dispatch (see include/shardtensor/exec/resize.hpp).
#include "shardtensor/exec/resize.hpp"

#include "exec/front_util.hpp"
#include "exec/resize_kernels.hpp"

namespace shard::exec {

/// Keeps src/exec/resize_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
extern const int* const resize_cpu_keep;
const int* const resize_cpu_keep = &resize_cpu_anchor;

namespace {
}  // namespace

void resize_forward(DType dt, ResizeMode mode, const ResizeGeometry& g, const void* x, void* y, Device dev,
                    ExecContext& ctx) {
  const auto& k = detail::front_table<ResizeKernels>("resize_forward", dt, dev, ctx);
  if (dev.is_cuda()) check_resize_geometry("resize_forward", mode, g);  // the CPU kernel checks as it builds its taps
  k.forward(dt, mode, g, x, y, ctx);
}

void resize_backward(DType dt, ResizeMode mode, const ResizeGeometry& g, const void* gy, void* gx, Device dev,
                     ExecContext& ctx) {
  const auto& k = detail::front_table<ResizeKernels>("resize_backward", dt, dev, ctx);
  if (dev.is_cuda()) check_resize_geometry("resize_backward", mode, g);
  k.backward(dt, mode, g, gy, gx, ctx);
}

}  // namespace shard::exec
