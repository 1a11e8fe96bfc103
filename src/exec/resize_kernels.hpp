#pragma once
// Resize kernel family (private interface; see include/shardtensor/exec/resize.hpp), and the
// per-dim source taps shared by the CPU implementation and the front's checks.
#include <algorithm>
#include <cmath>

#include "shardtensor/exec/resize.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct ResizeKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::resize;
  virtual ~ResizeKernels() = default;
  /// True when forward reads a strided x (ResizeGeometry::x_strided) in place; else the front
  /// passes a contiguous copy.
  virtual bool takes_strided_input() const { return false; }
  // native_storage (KernelTable): the table reads and writes bf16 / f16 in place (forward and
  // backward_data), bit for bit the f32 working-copy route (exec/precision.hpp). CPU and CUDA: yes.
  virtual void forward(DType dt, ResizeMode mode, const ResizeGeometry& g, const void* x, void* y,
                       ExecContext& ctx) const = 0;
  virtual void backward(DType dt, ResizeMode mode, const ResizeGeometry& g, const void* gy, void* gx,
                        ExecContext& ctx) const = 0;
};

/// Source taps of global output o in one dim: x[i0] * w0 + x[i1] * w1 (nearest: w1 = 0).
struct ResizeTap {
  index_t i0, i1;
  double w0, w1;
};
/// Cubic taps: sum_k x[i[k]] * w[k] over the four cells floor(source) - 1 .. + 2 (clamped).
struct ResizeCubicTap {
  index_t i[4];
  double w[4];
};

/// Global output extent of dim d (kernels/resize.cu has the same formulas, as for all below).
inline index_t resize_axis_out(const ResizeGeometry& g, int d) {
  return g.scale[d] > 0 ? g.scale[d] * g.global_in[d] : g.global_out[d];
}

/// PyTorch's area_pixel_compute_source_index of output o in dim d, before linear's clamp at 0.
inline double resize_source_coord(const ResizeGeometry& g, int d, index_t o) {
  const index_t G = g.global_in[d], Go = resize_axis_out(g, d);
  if (g.align_corners)
    return Go > 1 ? static_cast<double>(G - 1) / static_cast<double>(Go - 1) * static_cast<double>(o) : 0.0;
  if (g.scale[d] > 0) return (static_cast<double>(o) + 0.5) / static_cast<double>(g.scale[d]) - 0.5;
  return g.ratio[d] * (static_cast<double>(o) + 0.5) - 0.5;
}

/// Nearest / linear taps of global output o in dim d.
inline ResizeTap resize_source_tap(ResizeMode mode, const ResizeGeometry& g, int d, index_t o) {
  const index_t G = g.global_in[d];
  if (mode == ResizeMode::nearest) {
    if (g.scale[d] > 0) return {o / g.scale[d], o / g.scale[d], 1.0, 0.0};
    // PyTorch: min(floorf(o * (float) scale), G - 1), in float.
    const float v = static_cast<float>(o) * static_cast<float>(g.ratio[d]);
    const index_t i = std::min<index_t>(static_cast<index_t>(std::floor(v)), G - 1);
    return {i, i, 1.0, 0.0};
  }
  const double src = std::max(0.0, resize_source_coord(g, d, o));
  const index_t i0 = std::min<index_t>(static_cast<index_t>(src), G - 1);
  const index_t i1 = std::min<index_t>(i0 + 1, G - 1);
  const double l1 = std::min(src - static_cast<double>(i0), 1.0);
  return {i0, i1, 1.0 - l1, l1};
}

/// PyTorch's cubic_convolution1 / cubic_convolution2 with A = -0.75.
inline double resize_cubic_conv1(double x) {
  constexpr double A = -0.75;
  return ((A + 2) * x - (A + 3)) * x * x + 1;
}
inline double resize_cubic_conv2(double x) {
  constexpr double A = -0.75;
  return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
}

/// Cubic taps of global output o in dim d (PyTorch's guard_index_and_lambda and
/// get_cubic_upsample_coefficients; indices clamped to [0, G - 1]).
inline ResizeCubicTap resize_cubic_tap(const ResizeGeometry& g, int d, index_t o) {
  const index_t G = g.global_in[d];
  const double src = resize_source_coord(g, d, o);
  const index_t i = std::min<index_t>(static_cast<index_t>(std::floor(src)), G - 1);
  const double t = std::min(std::max(src - static_cast<double>(i), 0.0), 1.0);
  ResizeCubicTap c;
  c.w[0] = resize_cubic_conv2(t + 1.0);
  c.w[1] = resize_cubic_conv1(t);
  const double t2 = 1.0 - t;
  c.w[2] = resize_cubic_conv1(t2);
  c.w[3] = resize_cubic_conv2(t2 + 1.0);
  for (int k = 0; k < 4; ++k) c.i[k] = std::clamp<index_t>(i - 1 + k, 0, G - 1);
  return c;
}

/// Throws unless the block geometry is valid and holds every input its outputs read.
void check_resize_geometry(const char* op, ResizeMode mode, const ResizeGeometry& g);


}  // namespace shard::exec
