// Resize kernel family front: checks and device dispatch (see include/shardtensor/exec/resize.hpp).
#include "shardtensor/exec/resize.hpp"

#include "exec/front_util.hpp"
#include "exec/resize_kernels.hpp"
#include "exec/strided_rows.hpp"
#include "shardtensor/exec/block.hpp"

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
  if (g.x_strided && !k.takes_strided_input()) {  // one contiguous copy for tables without strides
    SHARD_CHECK(g.channels >= 1 && g.planes % g.channels == 0, "resize_forward", "{} planes are not N x {} channels",
                g.planes, g.channels);
    const index_t shape[5] = {g.planes / g.channels, g.channels, g.in_len[0], g.in_len[1], g.in_len[2]};
    const Block xc = detail::materialize(
        Block::view(dt, dev, const_cast<void*>(x), shape, 5, g.x_strides.data()), ctx);
    ResizeGeometry gc = g;
    gc.x_strided = false;
    k.forward(dt, mode, gc, xc.data, y, ctx);
    return;
  }
  k.forward(dt, mode, g, x, y, ctx);
}

void resize_backward(DType dt, ResizeMode mode, const ResizeGeometry& g, const void* gy, void* gx, Device dev,
                     ExecContext& ctx) {
  const auto& k = detail::front_table<ResizeKernels>("resize_backward", dt, dev, ctx);
  if (dev.is_cuda()) check_resize_geometry("resize_backward", mode, g);
  k.backward(dt, mode, g, gy, gx, ctx);
}

}  // namespace shard::exec
