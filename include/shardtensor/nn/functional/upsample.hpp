#pragma once
/// \file upsample.hpp
/// Domain-parallel upsampling by integer scale factors with forward and backward on the
/// autograd tape: nearest and linear (1-D linear, 2-D bilinear, 3-D trilinear) with PyTorch's
/// align_corners=false semantics (resize_local.hpp gives the exact index maps).
///
/// Layout: the output has x's placements and layout times the scale, per sharded spatial dim
/// (part p of x holding [off, off + n) produces outputs [f*off, f*(off + n))), computed locally.
/// Nearest reads only the rank's own cells (no halo). Linear reads at most one cell beyond the
/// block on each side (resize.hpp's resize_input_range); those come from a halo exchange with
/// Boundary::replicate (the edge clamp), with widths equal to the parts' actual needs (<= 1).
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

template <int S>
UpsampleRun<S> make_upsample_run(const char* op, const DistSpec& xs, ResizeMode mode, const Shape<S>& scale) {
  UpsampleRun<S> r;
  const int R = S + 2;
  r.halo.lo.assign(static_cast<std::size_t>(R), 0);
  r.halo.hi.assign(static_cast<std::size_t>(R), 0);
  r.halo.modes.assign(static_cast<std::size_t>(R), Boundary::replicate);
  std::vector<index_t> ext(static_cast<std::size_t>(S));
  std::vector<std::vector<index_t>> sizes(static_cast<std::size_t>(S));
  const auto& coords = xs.mesh().coords();
  bool empty = false;
  for (int d = 0; d < S; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const index_t f = scale[d], G = xs.global_shape()[u + 2];
    SHARD_CHECK(f >= 1, op, "scale factors {} must be >= 1", scale);
    SHARD_CHECK(G >= 1, op, "spatial dim {} of input {} is empty", d, xs.global_shape());
    SHARD_CHECK(f <= kMaxWindowParam && !__builtin_mul_overflow(f, G, &ext[u]), op,
                "scale factor {} of spatial dim {} (extent {}) must be at most {} and give an extent that fits int64",
                f, d, G, kMaxWindowParam);
    const ShardLayout& L = xs.layout(d + 2);
    index_t lo = 0, hi = 0;
    for (index_t q = 0; q < L.parts(); ++q) {
      sizes[u].push_back(f * L.size(q));
      if (L.size(q) == 0) continue;
      const auto [a, b] = resize_input_range(mode, f, G, f * L.offset(q), f * L.size(q));
      lo = std::max(lo, L.offset(q) - a);
      hi = std::max(hi, b - L.offset(q) - L.size(q));
    }
    r.halo.lo[u + 2] = lo;
    r.halo.hi[u + 2] = hi;
    r.exchange = r.exchange || lo > 0 || hi > 0;
    const index_t me = xs.part_of(d + 2, coords);
    r.block.scale[d] = f;
    r.block.global_in[d] = G;
    r.block.in_lo[d] = L.offset(me) - lo;
    r.block.out_lo[d] = f * L.offset(me);
    r.block.out_len[d] = f * L.size(me);
    empty = empty || L.size(me) == 0;
  }
  r.out = window_output_spec(xs, xs.global_shape()[1], ext, sizes);
  const Box xb = xs.local_box();
  r.compute = !empty && xb.len[0] * xb.len[1] > 0;
  return r;
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

}  // namespace detail

/// Domain-parallel upsampling of x[N, C, spatial...] by integer factors `scale` (see the file comment).
template <class T, int R>
Var<T, R> upsample(const Var<T, R>& input, ResizeMode mode, const Shape<R - 2>& scale) {
  constexpr int S = R - 2;
  static_assert(S >= 1 && S <= 3 && is_float_type<T>, "upsample: 1-3 spatial dims, float, double, bf16 or f16");
  const char* op = "upsample";
  const auto x = resolve(input);
  const Device dev = x.value().device();
  const DistSpec xs = x.value().spec();
  auto r = std::make_shared<const detail::UpsampleRun<S>>(detail::make_upsample_run<S>(op, xs, mode, scale));
  const DistSpec ys = r->out;
  Shape<S> base_len{};
  for (int d = 0; d < S; ++d)
    base_len[d] = x.local().size(2 + d) + r->halo.lo[static_cast<std::size_t>(d + 2)] +
                  r->halo.hi[static_cast<std::size_t>(d + 2)];
  auto geo = shard::detail::resize_geometry<S>(x.local().size(0) * x.local().size(1), r->block, base_len);
  geo.mode = mode;
  auto y = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(ys.local_box().len), dev);
  detail::upsample_forward(geo, xs, r->halo, r->exchange, r->compute, as_block(x.local()), as_block(y),
                           current_context(dev));
  return Var<T, R>::make(DistTensor<T, R>(ys, y), op, {x.ref()}, [x, xs, ys, r, geo, dev](const DistTensor<T, R>& g) {
    const DistTensor<T, R> gn = autograd::gradient_as(ys, g);
    const Tensor<T, R> gy = gn.local().contiguous();
    const Block gx = detail::upsample_backward(geo, xs, r->halo, r->exchange, r->compute, dtype_of<T>, as_block(gy),
                                               current_context(dev));
    x.accumulate_grad(DistTensor<T, R>(detail::window_input_grad_spec(xs, ys, gn.spec()), tensor_of<T, R>(gx)));
  });
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
