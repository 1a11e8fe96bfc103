#pragma once
// Resize kernel family (private interface; see include/shardtensor/exec/resize.hpp), and the
// per-dim source taps shared by the CPU implementation and the front's checks.
#include <algorithm>

#include "exec/registry.hpp"
#include "shardtensor/exec/resize.hpp"

namespace shard::exec {

struct ResizeKernels {
  static constexpr KernelFamily id = KernelFamily::resize;
  virtual ~ResizeKernels() = default;
  /// True when forward reads a strided x (ResizeGeometry::x_strided) in place; else the front
  /// passes a contiguous copy.
  virtual bool takes_strided_input() const { return false; }
  /// True when the table reads and writes bf16 / f16 dtype `dt` in place, bit for bit the f32
  /// working-copy route (exec/precision.hpp), which the front takes otherwise.
  virtual bool takes_storage(DType /*dt*/) const { return false; }
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

/// The taps of output o (scale f, global input extent G); kernels/resize.cu has the same formula.
inline ResizeTap resize_source_tap(ResizeMode mode, index_t f, index_t G, index_t o) {
  if (mode == ResizeMode::nearest) return {o / f, o / f, 1.0, 0.0};
  const double src = std::max(0.0, (static_cast<double>(o) + 0.5) / static_cast<double>(f) - 0.5);
  const index_t i0 = std::min<index_t>(static_cast<index_t>(src), G - 1);
  const index_t i1 = std::min<index_t>(i0 + 1, G - 1);
  const double l1 = src - static_cast<double>(i0);
  return {i0, i1, 1.0 - l1, l1};
}

/// Throws unless the block geometry is valid and holds every input its outputs read.
void check_resize_geometry(const char* op, ResizeMode mode, const ResizeGeometry& g);


}  // namespace shard::exec
