#pragma once
/// \file resize_local.hpp
/// Local resampling (on the tensor's device, through the resize kernel family of exec/resize.hpp):
/// nearest, linear (1-D linear, 2-D bilinear, 3-D trilinear) and bicubic, forward and adjoint,
/// for Tensor<T, S + 2> in N, C, spatial layout (T = float, double, bf16, f16), by integer scale
/// factors (ResizeBlock::whole, the maps below) or with PyTorch's F.interpolate parameters
/// (InterpolateOptions: non-integer scale factors, explicit sizes, align_corners, bicubic; maps in
/// exec/resize.hpp and at InterpolateOptions).
///
/// Integer-factor index maps, per spatial dim, for a global input extent G and integer scale f
/// (global output extent f * G; align_corners=false):
///  - nearest: output o reads input floor(o / f).
///  - linear:  src = max(0, (o + 0.5) / f - 0.5), i0 = floor(src), i1 = min(i0 + 1, G - 1),
///             y = (1 - (src - i0)) * x[i0] + (src - i0) * x[i1]   (clamped at the global edges).
///
/// Block form for the domain-parallel layer: resize_forward produces the global output range
/// [out_lo, out_lo + out_len) per dim from a block that holds global input indices
/// [in_lo, in_lo + in_len). The inputs that range needs are resize_input_range(...): for nearest
/// [floor(out_lo / f), floor((out_lo + out_len - 1) / f)]; for linear
/// [i0(out_lo), i1(out_lo + out_len - 1)], i.e. at most ONE cell beyond the owned input range on
/// each side (clamped at 0 and G - 1). So if a rank owns input [a, b) and produces the outputs
/// whose nearest-source lies in [a, b), nearest needs no halo and linear a halo of 1 each side.
/// resize_backward is the exact adjoint: it scatters the output-block gradient onto the block's
/// input cells (halo cells included; the distributed layer returns those to their owners).
#include <array>
#include <cmath>
#include <utility>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/exec/resize.hpp"
#include "shardtensor/tensor/tensor.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard {

/// Which part of a global resampling a block computes (all indices global, per spatial dim).
template <int S>
struct ResizeBlock {
  Shape<S> scale{};      ///< integer scale factor per dim (>= 1), or 0: the general map below
  Shape<S> global_in{};  ///< global input extent per dim (edge clamping)
  Shape<S> in_lo{};      ///< global index of the block's first input cell
  Shape<S> out_lo{};     ///< global index of the first output cell to produce
  Shape<S> out_len{};    ///< number of output cells to produce
  bool align_corners = false;      ///< PyTorch's align_corners (linear / cubic)
  Shape<S> global_out{};           ///< general map (scale 0): global output extent per dim
  std::array<double, S> ratio{};   ///< general map: PyTorch's source-index scale (exec/resize.hpp)

  /// The block covering a whole (non-distributed) tensor of spatial extent `in`.
  static ResizeBlock whole(const Shape<S>& in, const Shape<S>& scale) {
    ResizeBlock b;
    b.scale = scale;
    b.global_in = in;
    for (int d = 0; d < S; ++d) b.out_len[d] = in[d] * scale[d];
    return b;
  }
};

namespace detail {
/// Resize as seen by the type-erased kernels (see exec/resize.hpp).
using ResizeGeometry = exec::ResizeGeometry;

template <int S>
ResizeGeometry resize_geometry(index_t planes, const ResizeBlock<S>& b, const Shape<S>& in_len) {
  ResizeGeometry g;
  g.planes = planes;
  for (int d = 0; d < S; ++d) {
    const int e = 3 - S + d;
    g.scale[e] = b.scale[d];
    g.global_in[e] = b.global_in[d];
    g.in_lo[e] = b.in_lo[d];
    g.in_len[e] = in_len[d];
    g.out_lo[e] = b.out_lo[d];
    g.out_len[e] = b.out_len[d];
    g.global_out[e] = b.global_out[d];
    g.ratio[e] = b.ratio[d];
  }
  g.align_corners = b.align_corners;
  return g;
}
}  // namespace detail

/// PyTorch's F.interpolate parameters for S spatial dims: exactly one of scale_factor (all > 0,
/// output extent floor(in * scale_factor), source-index scale 1 / scale_factor, as PyTorch with
/// recompute_scale_factor unset) and size (all >= 1, source-index scale in / size) is given (the
/// other left all zero). align_corners (linear / cubic only; PyTorch refuses it for nearest):
/// source = o * (in - 1) / (out - 1) (0 when out == 1). Cubic needs S == 2 (bicubic).
template <int S>
struct InterpolateOptions {
  ResizeMode mode = ResizeMode::nearest;
  std::array<double, S> scale_factor{};  ///< per dim (> 0), or all 0 when `size` is given
  Shape<S> size{};                       ///< explicit output extents (>= 1), or all 0
  bool align_corners = false;            ///< linear / cubic only
};

/// The whole-tensor ResizeBlock (general map) of interpolating spatial extents `in` with `o`;
/// throws shard::Error naming `op` on bad options (the verdict depends only on `in` and `o`).
template <int S>
ResizeBlock<S> interpolate_block(const char* op, const Shape<S>& in, const InterpolateOptions<S>& o) {
  SHARD_CHECK(o.mode != ResizeMode::cubic || S == 2, op, "bicubic interpolation needs 2 spatial dims, not {}", S);
  SHARD_CHECK(!(o.align_corners && o.mode == ResizeMode::nearest), op,
              "align_corners applies to linear and cubic modes only (PyTorch refuses it for nearest)");
  bool has_size = false, has_scale = false;
  for (int d = 0; d < S; ++d) {
    has_size = has_size || o.size[d] != 0;
    has_scale = has_scale || o.scale_factor[d] != 0.0;
  }
  SHARD_CHECK(has_size != has_scale, op, "give exactly one of size {} and scale_factor {}", o.size, o.scale_factor);
  ResizeBlock<S> b;
  b.align_corners = o.align_corners;
  constexpr index_t kMaxOut = index_t(1) << 50;
  for (int d = 0; d < S; ++d) {
    const index_t G = in[d];
    SHARD_CHECK(G >= 1, op, "spatial dim {} of input {} is empty", d, in);
    index_t out;
    double r;
    if (has_size) {
      out = o.size[d];
      SHARD_CHECK(out >= 1 && out <= kMaxOut, op, "output size {} must be positive (and at most 2^50)", o.size);
      r = o.mode == ResizeMode::nearest
              ? static_cast<double>(static_cast<float>(G) / static_cast<float>(out))
              : static_cast<double>(G) / static_cast<double>(out);
    } else {
      const double sf = o.scale_factor[d];
      SHARD_CHECK(std::isfinite(sf) && sf > 0, op, "scale factors {} must be positive and finite", o.scale_factor);
      const double ext = std::floor(static_cast<double>(G) * sf);
      SHARD_CHECK(ext >= 1 && ext <= static_cast<double>(kMaxOut), op,
                  "scale factor {} of spatial dim {} (extent {}) gives output extent {} (must be >= 1 and at most "
                  "2^50)",
                  sf, d, G, ext);
      out = static_cast<index_t>(ext);
      r = o.mode == ResizeMode::nearest ? static_cast<double>(static_cast<float>(1.0 / sf)) : 1.0 / sf;
    }
    b.scale[d] = 0;
    b.global_in[d] = G;
    b.global_out[d] = out;
    b.ratio[d] = r;
    b.out_len[d] = out;
  }
  return b;
}

/// Output block [out_lo, out_lo + out_len) of the global upsampling, from the input block
/// x[N, C, in_len...] holding global input cells [in_lo, in_lo + in_len).
template <class T, int R>
Tensor<T, R> resize_forward(const Tensor<T, R>& x, ResizeMode mode, const ResizeBlock<R - 2>& b) {
  static_assert(is_float_type<T> && R >= 3 && R <= 5, "resize: float/double/bf16/f16, rank 3-5");
  Shape<R - 2> in_len{};
  Shape<R> ys = x.shape();
  for (int d = 0; d < R - 2; ++d) {
    in_len[d] = x.size(2 + d);
    ys[2 + d] = b.out_len[d];
  }
  auto y = Tensor<T, R>::empty(ys, x.device());
  auto g = detail::resize_geometry<R - 2>(x.size(0) * x.size(1), b, in_len);
  g.mode = mode;
  // A strided view (user memory) is read in place where the table can.
  exec::resize_forward(g, as_block(x), as_block(y), current_context(x.device()));
  return y;
}

/// Adjoint of resize_forward: gradient for the input block [in_lo, in_lo + in_len) (global
/// cells) from the output-block gradient gy[N, C, out_len...].
template <class T, int R>
Tensor<T, R> resize_backward(const Tensor<T, R>& gy, ResizeMode mode, const ResizeBlock<R - 2>& b,
                             const Shape<R - 2>& in_len) {
  static_assert(is_float_type<T> && R >= 3 && R <= 5, "resize: float/double/bf16/f16, rank 3-5");
  Shape<R> xs = gy.shape();
  for (int d = 0; d < R - 2; ++d) {
    SHARD_CHECK(gy.size(2 + d) == b.out_len[d], "resize_backward", "output gradient {} != output block {}",
                gy.shape(), b.out_len);
    xs[2 + d] = in_len[d];
  }
  auto gx = Tensor<T, R>::empty(xs, gy.device());
  const auto gc = gy.contiguous();
  auto g = detail::resize_geometry<R - 2>(gy.size(0) * gy.size(1), b, in_len);
  g.mode = mode;
  exec::resize_backward(g, as_block(gc), as_block(gx), current_context(gy.device()));
  return gx;
}

/// Whole-tensor interpolation of x[N, C, in...] (PyTorch's F.interpolate; see InterpolateOptions).
template <class T, int R>
Tensor<T, R> interpolate(const Tensor<T, R>& x, const InterpolateOptions<R - 2>& o) {
  Shape<R - 2> in{};
  for (int d = 0; d < R - 2; ++d) in[d] = x.size(2 + d);
  return resize_forward(x, o.mode, interpolate_block<R - 2>("interpolate", in, o));
}

/// Adjoint of interpolate for an input of spatial extent `in`.
template <class T, int R>
Tensor<T, R> interpolate_backward(const Tensor<T, R>& gy, const InterpolateOptions<R - 2>& o,
                                  const Shape<R - 2>& in) {
  return resize_backward(gy, o.mode, interpolate_block<R - 2>("interpolate_backward", in, o), in);
}

/// Whole-tensor upsampling of x[N, C, in...] by integer factors.
template <class T, int R>
Tensor<T, R> upsample(const Tensor<T, R>& x, ResizeMode mode, const Shape<R - 2>& scale) {
  Shape<R - 2> in{};
  for (int d = 0; d < R - 2; ++d) in[d] = x.size(2 + d);
  return resize_forward(x, mode, ResizeBlock<R - 2>::whole(in, scale));
}

/// Adjoint of upsample for an input of spatial extent `in`.
template <class T, int R>
Tensor<T, R> upsample_backward(const Tensor<T, R>& gy, ResizeMode mode, const Shape<R - 2>& scale,
                               const Shape<R - 2>& in) {
  return resize_backward(gy, mode, ResizeBlock<R - 2>::whole(in, scale), in);
}

}  // namespace shard
