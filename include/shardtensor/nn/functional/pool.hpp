#pragma once
/// \file pool.hpp
/// Domain-parallel average and max pooling (1-3 spatial dims) with forward and backward on the
/// autograd tape. Input N, C, spatial... with any dims sharded (spatial dims over any mesh dims,
/// uneven and empty shards included); parameters as pool_local.hpp's PoolParams (kernel,
/// stride (0 = kernel), padding per side < kernel, count_include_pad for avg; floor or ceil
/// mode). ceil_mode is the floor-mode plan with the high padding widened to
/// (out - 1) * stride + kernel - G - pad_lo (the extra zeros are clipped to the domain like any
/// padding, so the layout, ghost widths and boxes follow from the same anchor rule), and the
/// avg divisor with count_include_pad clipped to the true padded end G + pad_hi
/// (PoolGeometry::pad_end, relative to each rank's box).
///
/// Layout: the anchor rule of window.hpp with dilation 1 (so windows that straddle ranks, with
/// uneven shards, are computed by exactly one rank): the output has x's placements and explicit
/// ShardSizes derived locally (a k = s = 2 pool maps part boundaries g to ceil(g / 2)). Ghost
/// widths are the actual needs of the parts (none for a 2x2 pool on even boundaries, one cell
/// above otherwise); the ghosts come from the halo exchange (Boundary::zero), or from the ghost
/// layers a simulation declared valid (dist/ghosts.hpp: read in place, no exchange), and the global
/// padding is handled by the local kernels (padding cells are never selected by max, and are
/// counted by avg only with count_include_pad), by clipping each rank's input box to the domain.
/// Backward: the local pooling gradient of the box, then the halo ADJOINT returns the ghost
/// cells' gradients to their owners. A Partial input is resolved first. No communication
/// overlap here (pooling is memory-bound and cheap next to the exchange).
///
/// Recipe (docs/architecture.md): checks and spec algebra here; the schedule in src/nn/pool.cpp;
/// the halo through the stencil halo plan (dist/halo_transport.hpp); the pool exec family.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "shardtensor/exec/pool.hpp"
#include "shardtensor/nn/functional/pool_local.hpp"
#include "shardtensor/nn/functional/window.hpp"

namespace shard::nn::functional {

namespace detail {

/// One rank's pooling: the window plan, the global input box the rank reads (its outputs'
/// windows clipped to the domain) and the local kernel geometry on that box.
struct PoolRun {
  WindowPlan plan;
  std::vector<Range> box;
  exec::PoolGeometry geom;
  bool compute = false;
};

/// Builds the PoolRun and the output spec of pooling x (spec `xs`, local batch `batch`) with `p`.
template <int S>
std::pair<PoolRun, DistSpec> make_pool_run(const char* op, const DistSpec& xs, const PoolParams<S>& p) {
  const auto st = p.effective_stride();
  std::vector<WindowDim> dims;
  for (int d = 0; d < S; ++d) {
    SHARD_CHECK(p.kernel[d] >= 1 && st[d] >= 1, op, "kernel {} and stride {} must be >= 1", p.kernel, p.stride);
    SHARD_CHECK(p.pad_lo[d] >= 0 && p.pad_hi[d] >= 0 && p.pad_lo[d] < p.kernel[d] && p.pad_hi[d] < p.kernel[d], op,
                "padding lo {} hi {} must be >= 0 and smaller than the kernel {}", p.pad_lo, p.pad_hi, p.kernel);
    index_t pad_hi = p.pad_hi[d];
    if (p.ceil_mode) {
      const index_t G = xs.global_shape()[static_cast<std::size_t>(d + 2)];
      SHARD_CHECK(2 * p.pad_lo[d] <= p.kernel[d] && 2 * p.pad_hi[d] <= p.kernel[d], op,
                  "ceil_mode: padding lo {} hi {} must be at most half the kernel {} (PyTorch's rule)", p.pad_lo,
                  p.pad_hi, p.kernel);
      SHARD_CHECK(G >= 1 && G + p.pad_lo[d] + p.pad_hi[d] >= p.kernel[d] && p.kernel[d] <= kMaxWindowParam &&
                      st[d] <= kMaxWindowParam,
                  op, "spatial dim {} of input {} with padding lo {} hi {} is smaller than the kernel {}", d,
                  xs.global_shape(), p.pad_lo, p.pad_hi, p.kernel);
      // The floor-mode plan of the ceil-mode output count: the high padding that many windows read.
      const index_t out = pool_output_extent(G, p.kernel[d], st[d], p.pad_lo[d], p.pad_hi[d], true);
      pad_hi = std::max(pad_hi, (out - 1) * st[d] + p.kernel[d] - G - p.pad_lo[d]);
    }
    dims.push_back({p.kernel[d], st[d], 1, p.pad_lo[d], pad_hi, Boundary::zero});
  }
  const DistSpec ys = anchor_output_spec(op, xs, xs.global_shape()[1], dims);
  PoolRun r;
  r.plan = make_window_plan(op, xs, ys, dims);
  const Box xb = xs.local_box();
  r.compute = !r.plan.empty_output() && xb.len[0] * xb.len[1] > 0;
  r.geom.planes = xb.len[0] * xb.len[1];
  r.geom.count_include_pad = p.count_include_pad;
  for (int d = 0; d < S; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const Range ob = r.plan.out_block[u];
    r.box.push_back(r.plan.read_range(d, ob.lo, ob.hi()));
    const int e = 3 - S + d;
    r.geom.in[static_cast<std::size_t>(e)] = r.box[u].len;
    r.geom.out[static_cast<std::size_t>(e)] = ob.len;
    r.geom.kernel[static_cast<std::size_t>(e)] = p.kernel[d];
    r.geom.stride[static_cast<std::size_t>(e)] = st[d];
    r.geom.pad_lo[static_cast<std::size_t>(e)] = r.box[u].lo - (ob.lo * st[d] - p.pad_lo[d]);
    if (p.ceil_mode)  // the true padded end G + pad_hi, relative to the box (avg's divisor)
      r.geom.pad_end[static_cast<std::size_t>(e)] = r.plan.in_global[u] + p.pad_hi[d] - r.box[u].lo;
  }
  return {std::move(r), ys};
}

/// Pooling kinds of the schedule.
enum class PoolKind : unsigned char { avg, max };

/// The schedule (src/nn/pool.cpp). Forward: this rank's input box (its block `x`, with the
/// ghost cells of the plan's halo from the stencil halo plan, or read in place from the user's
/// declared ghosts `user_ext` when that is a non-empty Block) pooled into y (and idx for max).
/// Collective over the dims' communicators when the plan exchanges.
void pool_forward(PoolKind kind, const PoolRun& r, const DistSpec& xs, const Block& x, const Block& user_ext,
                  const Block& y, const Block* idx, ExecContext& ctx);
/// Backward: the input gradient of this rank's block from the output gradient gy (contiguous):
/// the local pooling adjoint on the box, then the halo adjoint. Collective when the plan exchanges.
Block pool_backward(PoolKind kind, const PoolRun& r, const DistSpec& xs, DType dt, const Block& gy, const Block* idx,
                    ExecContext& ctx);

/// The typed front of avg_pool / max_pool (checks and spec algebra here, the schedule in src/).
template <class T, int R>
Var<T, R> pool(const Var<T, R>& input, const PoolParams<R - 2>& p, PoolKind kind) {
  constexpr int S = R - 2;
  static_assert(S >= 1 && S <= 3 && is_float_type<T>, "pooling: 1-3 spatial dims, float, double, bf16 or f16");
  const bool mx = kind == PoolKind::max;
  const char* op = S == 1 ? (mx ? "max_pool1d" : "avg_pool1d")
                   : S == 2 ? (mx ? "max_pool2d" : "avg_pool2d")
                            : (mx ? "max_pool3d" : "avg_pool3d");
  const auto x = resolve(input);
  const Device dev = x.value().device();
  const DistSpec xs = x.value().spec();
  auto [run, ys] = make_pool_run<S>(op, xs, p);
  auto r = std::make_shared<const PoolRun>(std::move(run));
  const Shape<R> yshape = DistTensor<T, R>::from_vec(ys.local_box().len);
  auto y = Tensor<T, R>::empty(yshape, dev);
  Tensor<std::int64_t, R> idx;
  if (mx) idx = Tensor<std::int64_t, R>::empty(yshape, dev);
  // Ghost reuse (dist/ghosts.hpp): declared ghost cells covering the halo are read in place (the
  // decision is the same on every rank; pooling never reads beyond the domain edge).
  const Block user_ext = r->plan.exchange ? declared_ghost_block(x.value(), r->plan.halo, true) : Block{};
  const Block ib = mx ? as_block(idx) : Block{};
  pool_forward(kind, *r, xs, as_block(x.local()), user_ext, as_block(y), mx ? &ib : nullptr, current_context(dev));
  return Var<T, R>::make(DistTensor<T, R>(ys, y), op, {x.ref()}, [x, xs, ys, r, idx, kind, dev](const DistTensor<T, R>& g) {
    const DistTensor<T, R> gn = autograd::gradient_as(ys, g);
    const Tensor<T, R> gy = gn.local().contiguous();
    const Block ib = kind == PoolKind::max ? as_block(idx) : Block{};
    const Block gx = pool_backward(kind, *r, xs, dtype_of<T>, as_block(gy), kind == PoolKind::max ? &ib : nullptr,
                                   current_context(dev));
    x.accumulate_grad(DistTensor<T, R>(window_input_grad_spec(xs, ys, gn.spec()), tensor_of<T, R>(gx)));
  });
}

}  // namespace detail

/// Domain-parallel average pooling of x[N, C, spatial...] (see the file comment).
template <class T, int R>
Var<T, R> avg_pool(const Var<T, R>& input, const PoolParams<R - 2>& p) {
  return detail::pool(input, p, detail::PoolKind::avg);
}

/// Domain-parallel max pooling of x[N, C, spatial...] (see the file comment). Ties pick the
/// first maximum in window order, as the local kernel.
template <class T, int R>
Var<T, R> max_pool(const Var<T, R>& input, const PoolParams<R - 2>& p) {
  return detail::pool(input, p, detail::PoolKind::max);
}

/// 2-d average pooling (see avg_pool).
template <class T>
Var<T, 4> avg_pool2d(const Var<T, 4>& x, const PoolParams<2>& p) {
  return avg_pool(x, p);
}
/// 2-d max pooling (see max_pool).
template <class T>
Var<T, 4> max_pool2d(const Var<T, 4>& x, const PoolParams<2>& p) {
  return max_pool(x, p);
}
/// 3-d average pooling (see avg_pool).
template <class T>
Var<T, 5> avg_pool3d(const Var<T, 5>& x, const PoolParams<3>& p) {
  return avg_pool(x, p);
}
/// 3-d max pooling (see max_pool).
template <class T>
Var<T, 5> max_pool3d(const Var<T, 5>& x, const PoolParams<3>& p) {
  return max_pool(x, p);
}

}  // namespace shard::nn::functional
