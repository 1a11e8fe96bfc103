#pragma once
/// \file resize.hpp
/// Resize kernel family front: nearest, (bi/tri)linear and cubic resampling on blocks of a global
/// grid, forward and adjoint, on the device of the data (CPU: src/exec/resize_cpu.cpp; CUDA:
/// kernels/resize.cu). Index maps and block semantics as nn/functional/resize_local.hpp. The adjoint
/// accumulates in double (CPU: scatter per plane; CUDA: gather per input cell; both fixed-order).
///
/// Per dim the global index map is either an integer factor f (ResizeGeometry::scale[d] >= 1:
/// output extent f * G, the integer formulas of resize_local.hpp) or PyTorch's general map
/// (scale[d] == 0: output extent global_out[d], source-index scale `ratio[d]`, i.e. 1/scale_factor
/// when a scale factor was given, G / global_out with an explicit size), in both cases with
/// align_corners (source = o * (G - 1) / (Gout - 1), 0 when Gout == 1) or without
/// (source = (o + 0.5) * ratio - 0.5, clamped at 0 for linear; nearest: min(floor(o * ratio), G - 1)
/// in float arithmetic, as PyTorch). Cubic: PyTorch's cubic convolution (A = -0.75) over the four
/// cells floor(source) - 1 .. + 2, each index clamped to [0, G - 1].
#include <array>
#include <utility>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard {

/// Interpolation of the resampling: nearest, linear (1-D linear, 2-D bilinear, 3-D trilinear),
/// cubic (bicubic; the nn front takes it for 2-D only, as PyTorch).
enum class ResizeMode { nearest, linear, cubic };

/// Global input range [first, last + 1) that outputs [out_lo, out_lo + out_len) read in one dim
/// (nn/functional/resize_local.hpp gives the maps); throws if the output range is outside [0, scale * global_in).
std::pair<index_t, index_t> resize_input_range(ResizeMode mode, index_t scale, index_t global_in, index_t out_lo,
                                               index_t out_len);

namespace exec {

/// Resize as seen by the type-erased kernels: `planes` = N * C, 3 spatial dims (leading 1s); all
/// indices global per dim: the block holds inputs [in_lo, in_lo + in_len) and produces outputs
/// [out_lo, out_lo + out_len) of the upsampling of a global extent global_in by scale.
struct ResizeGeometry {
  ResizeMode mode = ResizeMode::nearest;
  index_t planes = 1;
  /// scale: the integer factor per dim (>= 1), or 0 for the general map (global_out, ratio).
  std::array<index_t, 3> scale{1, 1, 1}, global_in{1, 1, 1}, in_lo{0, 0, 0}, in_len{1, 1, 1}, out_lo{0, 0, 0},
      out_len{1, 1, 1};
  bool align_corners = false;  ///< PyTorch's align_corners (linear / cubic)
  /// General map (scale[d] == 0): global output extent and PyTorch's source-index scale
  /// (used without align_corners; nearest reads it as float, as PyTorch does).
  std::array<index_t, 3> global_out{0, 0, 0};
  std::array<double, 3> ratio{0, 0, 0};
  /// Set by the front from a strided forward input x[N, C, spatial...] (e.g. the interior of a
  /// user's halo-padded array): x_strides are its element strides over N, C and the 3 spatial
  /// dims, with planes = N * channels. The CPU table reads it in place; other tables get a
  /// contiguous copy from the front. Unused when false.
  bool x_strided = false;
  index_t channels = 1;
  std::array<index_t, 5> x_strides{0, 0, 0, 0, 0};
};

/// y[planes, out_len] (contiguous) from x[planes, in_len]: x contiguous, or a strided
/// [N, C, in_len...] view (1-3 spatial dims) read in place where the table can; both of one dtype
/// (f32, f64, or bf16 / f16: read and written in place, bit for bit the f32 op on the widened
/// values rounded once more) on the context's device. Throws shard::Error unless the block holds every input
/// the outputs read.
void resize_forward(const ResizeGeometry& g, const Block& x, const Block& y, ExecContext& ctx);
/// gx[planes, in_len] = adjoint of resize_forward applied to gy[planes, out_len] (both contiguous;
/// overwrites gx).
void resize_backward(const ResizeGeometry& g, const Block& gy, const Block& gx, ExecContext& ctx);

}  // namespace exec

/// Global output extent of dim d of `g` (scale * global_in, or global_out for the general map).
index_t resize_output_extent(const exec::ResizeGeometry& g, int d);
/// Global input range [first, last + 1) that outputs [out_lo, out_lo + out_len) of dim d of `g`
/// read (g.mode, the dim's map; the block fields of `g` are not used); throws if the output range
/// is outside [0, resize_output_extent(g, d)).
std::pair<index_t, index_t> resize_input_range(const exec::ResizeGeometry& g, int d, index_t out_lo, index_t out_len);
/// The input cell that owns output o of dim d of `g` in the domain-parallel layout: nearest: the
/// cell it reads; linear / cubic: the cell holding its source coordinate's centre,
/// clamp(floor(source + 0.5), 0, G - 1) (integer factors: o / f). Non-decreasing in o.
index_t resize_owner(const exec::ResizeGeometry& g, int d, index_t o);
}  // namespace shard
