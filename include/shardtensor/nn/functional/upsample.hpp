#pragma once
/// \file upsample.hpp
/// Domain-parallel resampling with forward and backward on the autograd tape: `upsample` by
/// integer scale factors (nearest, linear (1-D linear, 2-D bilinear, 3-D trilinear), bicubic;
/// align_corners=false) and `interpolate`, PyTorch's F.interpolate (non-integer scale factors,
/// explicit output sizes, align_corners for linear / cubic, bicubic for 2-D; InterpolateOptions
/// in resize_local.hpp; the exact index maps are exec/resize.hpp's).
///
/// Layout: the output has x's placements, and explicit ShardSizes on the sharded spatial dims
/// from the global index map: output o belongs to the part that owns input resize_owner(o)
/// (nearest: the cell o reads; linear / cubic: the cell holding o's source coordinate's centre,
/// clamp(floor(src + 0.5), 0, G - 1)); the owner is non-decreasing in o, so each part computes
/// one contiguous range [B(off), B(off + n)), B found by binary search from the global spec alone
/// (deterministic on every rank; empty input parts own no outputs, and with downsampling a part
/// may own none). Integer factors give exactly the old layout: part [off, off + n) produces
/// [f*off, f*(off + n)). Nearest reads only the rank's own cells (no halo). Linear reads at most
/// one cell beyond the block on each side, cubic at most two; the ghost widths are the maxima
/// over the parts of their actual needs (resize_input_range of each part's outputs, computed from
/// the global map, never assumed), exchanged with Boundary::replicate (the edge clamp; halos
/// wider than a neighbour's shard come from further ranks, halo.hpp).
/// Backward: the local adjoint of the resize onto the (extended) block, then the halo ADJOINT.
/// A Partial input is resolved first.
///
/// Recipe (docs/architecture.md): checks and spec algebra here; the schedule in
/// src/nn/upsample.cpp; the halo through the stencil halo plan (dist/halo_transport.hpp); the
/// resize exec family.
#include <memory>

#include "shardtensor/exec/resize.hpp"
#include "shardtensor/nn/functional/resize_local.hpp"
#include "shardtensor/nn/functional/window.hpp"

namespace shard::nn::functional {

namespace detail {

/// This rank's upsampling: output spec, halo and the resize block over the (extended) block.
template <int S>
struct UpsampleRun {
  DistSpec out;
  HaloSpec halo;
  bool exchange = false;
  ResizeBlock<S> block;  ///< in_lo: global start of the (extended) block; outputs: this rank's
  bool compute = false;
};

/// First output of dim d (geometry dim e) whose owner (resize_owner) is >= g: part boundaries of
/// the output layout (B(0) = 0, B(G) = Gout; binary search, the same on every rank).
inline index_t resize_part_bound(const exec::ResizeGeometry& m, int e, index_t g) {
  const index_t Go = resize_output_extent(m, e);
  if (g <= 0) return 0;
  if (g >= m.global_in[static_cast<std::size_t>(e)]) return Go;
  index_t lo = 0, hi = Go;  // owner(o) >= g for o >= answer
  while (lo < hi) {
    const index_t mid = lo + (hi - lo) / 2;
    if (resize_owner(m, e, mid) >= g) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/// The run of resampling x (spec xs) with `mode` and the global map `map` (a whole-tensor
/// ResizeBlock: integer factors or the general map of interpolate_block). Output layout: output
/// o belongs to the part owning input resize_owner(o) (integer factors: part [off, off + n)
/// produces [f*off, f*(off + n))); halo widths are the parts' actual needs (resize_input_range).
template <int S>
UpsampleRun<S> make_upsample_run(const DistSpec& xs, ResizeMode mode, const ResizeBlock<S>& map) {
  UpsampleRun<S> r;
  const int R = S + 2;
  r.halo.lo.assign(static_cast<std::size_t>(R), 0);
  r.halo.hi.assign(static_cast<std::size_t>(R), 0);
  r.halo.modes.assign(static_cast<std::size_t>(R), Boundary::replicate);
  exec::ResizeGeometry m = shard::detail::resize_geometry<S>(1, map, map.global_in);
  m.mode = mode;
  std::vector<index_t> ext(static_cast<std::size_t>(S));
  std::vector<std::vector<index_t>> sizes(static_cast<std::size_t>(S));
  const auto& coords = xs.mesh().coords();
  bool empty = false;
  r.block = map;
  for (int d = 0; d < S; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const int e = 3 - S + d;
    ext[u] = resize_output_extent(m, e);
    const ShardLayout& L = xs.layout(d + 2);
    index_t lo = 0, hi = 0;
    for (index_t q = 0; q < L.parts(); ++q) {
      const index_t b0 = resize_part_bound(m, e, L.offset(q)), b1 = resize_part_bound(m, e, L.offset(q) + L.size(q));
      sizes[u].push_back(b1 - b0);
      if (b1 == b0) continue;
      const auto [a, b] = resize_input_range(m, e, b0, b1 - b0);
      lo = std::max(lo, L.offset(q) - a);
      hi = std::max(hi, b - L.offset(q) - L.size(q));
    }
    r.halo.lo[u + 2] = lo;
    r.halo.hi[u + 2] = hi;
    r.exchange = r.exchange || lo > 0 || hi > 0;
    const index_t me = xs.part_of(d + 2, coords);
    const index_t b0 = resize_part_bound(m, e, L.offset(me)), b1 = resize_part_bound(m, e, L.offset(me) + L.size(me));
    r.block.in_lo[d] = L.offset(me) - lo;
    r.block.out_lo[d] = b0;
    r.block.out_len[d] = b1 - b0;
    empty = empty || b1 == b0;
  }
  r.out = window_output_spec(xs, xs.global_shape()[1], ext, sizes);
  const Box xb = xs.local_box();
  r.compute = !empty && xb.len[0] * xb.len[1] > 0;
  return r;
}

/// The integer-factor run (upsample): checks the factors, then make_upsample_run.
template <int S>
UpsampleRun<S> make_upsample_run(const char* op, const DistSpec& xs, ResizeMode mode, const Shape<S>& scale) {
  Shape<S> in{};
  for (int d = 0; d < S; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const index_t f = scale[d], G = xs.global_shape()[u + 2];
    index_t ext = 0;
    SHARD_CHECK(f >= 1, op, "scale factors {} must be >= 1", scale);
    SHARD_CHECK(G >= 1, op, "spatial dim {} of input {} is empty", d, xs.global_shape());
    SHARD_CHECK(f <= kMaxWindowParam && !__builtin_mul_overflow(f, G, &ext), op,
                "scale factor {} of spatial dim {} (extent {}) must be at most {} and give an extent that fits int64",
                f, d, G, kMaxWindowParam);
    in[d] = G;
  }
  SHARD_CHECK(mode != ResizeMode::cubic || S == 2, op, "bicubic upsampling needs 2 spatial dims, not {}", S);
  return make_upsample_run<S>(xs, mode, ResizeBlock<S>::whole(in, scale));
}

/// The schedule (src/nn/upsample.cpp). Forward: y from this rank's block x (strided views read
/// in place), extended by the plan's halo through the stencil halo plan when `exchange`; `g` is
/// the resize geometry over the (extended) block. Collective when `exchange`.
void upsample_forward(const exec::ResizeGeometry& g, const DistSpec& xs, const HaloSpec& halo, bool exchange,
                      bool compute, const Block& x, const Block& y, ExecContext& ctx);
/// Backward: this rank's block gradient from gy (contiguous): the resize adjoint onto the
/// (extended) block, then the halo adjoint. Collective when `exchange`.
Block upsample_backward(const exec::ResizeGeometry& g, const DistSpec& xs, const HaloSpec& halo, bool exchange,
                        bool compute, DType dt, const Block& gy, ExecContext& ctx);

/// The typed front of upsample / interpolate on a built run (the tape node).
template <class T, int R>
Var<T, R> upsample_run(const char* op, const Var<T, R>& x, ResizeMode mode,
                       std::shared_ptr<const UpsampleRun<R - 2>> r) {
  constexpr int S = R - 2;
  const Device dev = x.value().device();
  const DistSpec xs = x.value().spec();
  const DistSpec ys = r->out;
  Shape<S> base_len{};
  for (int d = 0; d < S; ++d)
    base_len[d] = x.local().size(2 + d) + r->halo.lo[static_cast<std::size_t>(d + 2)] +
                  r->halo.hi[static_cast<std::size_t>(d + 2)];
  auto geo = shard::detail::resize_geometry<S>(x.local().size(0) * x.local().size(1), r->block, base_len);
  geo.mode = mode;
  auto y = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(ys.local_box().len), dev);
  upsample_forward(geo, xs, r->halo, r->exchange, r->compute, as_block(x.local()), as_block(y), current_context(dev));
  return Var<T, R>::make(DistTensor<T, R>(ys, y), op, {x.ref()}, [x, xs, ys, r, geo, dev](const DistTensor<T, R>& g) {
    const DistTensor<T, R> gn = autograd::gradient_as(ys, g);
    const Tensor<T, R> gy = gn.local().contiguous();
    const Block gx =
        upsample_backward(geo, xs, r->halo, r->exchange, r->compute, dtype_of<T>, as_block(gy), current_context(dev));
    x.accumulate_grad(DistTensor<T, R>(window_input_grad_spec(xs, ys, gn.spec()), tensor_of<T, R>(gx)));
  });
}

}  // namespace detail

/// Domain-parallel upsampling of x[N, C, spatial...] by integer factors `scale` (see the file
/// comment; align_corners=false). Cubic (2-D only) takes the same integer factors.
template <class T, int R>
Var<T, R> upsample(const Var<T, R>& input, ResizeMode mode, const Shape<R - 2>& scale) {
  constexpr int S = R - 2;
  static_assert(S >= 1 && S <= 3 && is_float_type<T>, "upsample: 1-3 spatial dims, float, double, bf16 or f16");
  const char* op = "upsample";
  const auto x = resolve(input);
  auto r = std::make_shared<const detail::UpsampleRun<S>>(
      detail::make_upsample_run<S>(op, x.value().spec(), mode, scale));
  return detail::upsample_run<T, R>(op, x, mode, std::move(r));
}

/// Domain-parallel F.interpolate of x[N, C, spatial...] (PyTorch's semantics: see
/// InterpolateOptions in resize_local.hpp and the file comment): nearest / linear / bilinear /
/// trilinear / bicubic, scale factors (non-integer included) or explicit sizes, align_corners.
template <class T, int R>
Var<T, R> interpolate(const Var<T, R>& input, const InterpolateOptions<R - 2>& o) {
  constexpr int S = R - 2;
  static_assert(S >= 1 && S <= 3 && is_float_type<T>, "interpolate: 1-3 spatial dims, float, double, bf16 or f16");
  const char* op = "interpolate";
  const auto x = resolve(input);
  const DistSpec& xs = x.value().spec();
  Shape<S> in{};
  for (int d = 0; d < S; ++d) in[d] = xs.global_shape()[static_cast<std::size_t>(d + 2)];
  auto r = std::make_shared<const detail::UpsampleRun<S>>(
      detail::make_upsample_run<S>(xs, o.mode, interpolate_block<S>(op, in, o)));
  return detail::upsample_run<T, R>(op, x, o.mode, std::move(r));
}

/// Bicubic interpolation of x[N, C, H, W] by scale factors (see interpolate).
template <class T>
Var<T, 4> upsample_bicubic(const Var<T, 4>& x, const std::array<double, 2>& scale_factor, bool align_corners = false) {
  return interpolate(x, InterpolateOptions<2>{.mode = ResizeMode::cubic, .scale_factor = scale_factor,
                                              .align_corners = align_corners});
}

/// Nearest-neighbour upsampling by integer factors (see upsample).
template <class T, int R>
Var<T, R> upsample_nearest(const Var<T, R>& x, const Shape<R - 2>& scale) {
  return upsample(x, ResizeMode::nearest, scale);
}
/// Linear / bilinear / trilinear upsampling (align_corners=false) by integer factors (see upsample).
template <class T, int R>
Var<T, R> upsample_linear(const Var<T, R>& x, const Shape<R - 2>& scale) {
  return upsample(x, ResizeMode::linear, scale);
}

}  // namespace shard::nn::functional
