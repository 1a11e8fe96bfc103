#pragma once
/// \file pool.hpp
/// Domain-parallel average and max pooling (1-3 spatial dims) with forward and backward on the
/// autograd tape. Input N, C, spatial... with any dims sharded (spatial dims over any mesh dims,
/// uneven and empty shards included); parameters as tensor/pool.hpp's PoolParams (kernel,
/// stride (0 = kernel), padding per side < kernel, count_include_pad for avg; floor mode).
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
#include <cstdint>
#include <memory>

#include "shardtensor/nn/functional/window.hpp"
#include "shardtensor/tensor/pool.hpp"

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
    dims.push_back({p.kernel[d], st[d], 1, p.pad_lo[d], p.pad_hi[d], Boundary::zero});
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
  }
  return {std::move(r), ys};
}

/// The spatial ranges of the block that `pool_input` returns: the extended block or the block.
inline std::vector<Range> pool_base(const PoolRun& r) {
  std::vector<Range> b;
  for (int d = 0; d < r.plan.spatial(); ++d) b.push_back(r.plan.exchange ? r.plan.ext_range(d) : r.plan.in_block[static_cast<std::size_t>(d)]);
  return b;
}

/// The contiguous input box of this rank (halo exchange included; collective when needed).
template <class T, int R>
Tensor<T, R> pool_input(const PoolRun& r, const DistTensor<T, R>& x) {
  // Ghost reuse (dist/ghosts.hpp): declared ghost cells covering the halo are read in place (the
  // decision is the same on every rank; pooling never reads beyond the domain edge).
  const Tensor<T, R> base = !r.plan.exchange ? x.local()
                            : shard::use_declared_ghosts(x, r.plan.halo, true)
                                ? x.ghosted_local(r.plan.halo.lo, r.plan.halo.hi)
                                : halo_exchange(x, r.plan.halo);
  if (!r.compute) return Tensor<T, R>();
  const auto br = pool_base(r);
  Shape<R> lo{}, len = base.shape();
  bool whole = true;
  for (int d = 0; d < R - 2; ++d) {
    const auto u = static_cast<std::size_t>(d);
    lo[2 + d] = r.box[u].lo - br[u].lo;
    len[2 + d] = r.box[u].len;
    whole = whole && r.box[u] == br[u];
  }
  return whole ? base.contiguous() : base.slice(lo, len).contiguous();
}

/// The input gradient from the gradient of this rank's box (halo adjoint; collective when needed).
template <class T, int R>
Tensor<T, R> pool_input_grad(const PoolRun& r, const DistSpec& xs, const Tensor<T, R>& gbox, Device dev) {
  const auto br = pool_base(r);
  Shape<R> full = DistTensor<T, R>::from_vec(xs.local_box().len), lo{};
  bool whole = r.compute;
  for (int d = 0; d < R - 2; ++d) {
    const auto u = static_cast<std::size_t>(d);
    full[2 + d] = br[u].len;
    lo[2 + d] = r.box[u].lo - br[u].lo;
    whole = whole && r.box[u] == br[u];
  }
  Tensor<T, R> g = whole ? gbox : Tensor<T, R>::zeros(full, dev);
  if (r.compute && !whole) g.slice(lo, gbox.shape()).copy_from(gbox);
  return r.plan.exchange ? halo_exchange_adjoint(xs, g, r.plan.halo, true) : g;
}

}  // namespace detail

/// Domain-parallel average pooling of x[N, C, spatial...] (see the file comment).
template <class T, int R>
Var<T, R> avg_pool(const Var<T, R>& input, const PoolParams<R - 2>& p) {
  constexpr int S = R - 2;
  static_assert(S >= 1 && S <= 3 && is_compute_type<T>, "avg_pool: 1-3 spatial dims, float or double");
  const char* op = S == 1 ? "avg_pool1d" : S == 2 ? "avg_pool2d" : "avg_pool3d";
  const auto x = resolve(input);
  const Device dev = x.value().device();
  const DistSpec xs = x.value().spec();
  auto [run, ys] = detail::make_pool_run<S>(op, xs, p);
  auto r = std::make_shared<const detail::PoolRun>(std::move(run));
  auto y = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(ys.local_box().len), dev);
  const Tensor<T, R> in = detail::pool_input(*r, x.value());
  if (r->compute) exec::avg_pool_forward(r->geom, as_block(in), as_block(y), current_context(dev));
  return Var<T, R>::make(DistTensor<T, R>(ys, y), op, {x.ref()}, [x, xs, ys, r, dev](const DistTensor<T, R>& g) {
    const DistTensor<T, R> gn = autograd::gradient_as(ys, g);
    const Tensor<T, R> gy = gn.local().contiguous();
    Tensor<T, R> gbox;
    if (r->compute) {
      Shape<R> bs = gy.shape();
      for (int d = 0; d < R - 2; ++d) bs[2 + d] = r->box[static_cast<std::size_t>(d)].len;
      gbox = Tensor<T, R>::empty(bs, dev);
      exec::avg_pool_backward(r->geom, as_block(gy), as_block(gbox), current_context(dev));
    }
    x.accumulate_grad(DistTensor<T, R>(detail::window_input_grad_spec(xs, ys, gn.spec()),
                                       detail::pool_input_grad(*r, xs, gbox, dev)));
  });
}

/// Domain-parallel max pooling of x[N, C, spatial...] (see the file comment). Ties pick the
/// first maximum in window order, as the local kernel.
template <class T, int R>
Var<T, R> max_pool(const Var<T, R>& input, const PoolParams<R - 2>& p) {
  constexpr int S = R - 2;
  static_assert(S >= 1 && S <= 3 && is_compute_type<T>, "max_pool: 1-3 spatial dims, float or double");
  const char* op = S == 1 ? "max_pool1d" : S == 2 ? "max_pool2d" : "max_pool3d";
  const auto x = resolve(input);
  const Device dev = x.value().device();
  const DistSpec xs = x.value().spec();
  auto [run, ys] = detail::make_pool_run<S>(op, xs, p);
  auto r = std::make_shared<const detail::PoolRun>(std::move(run));
  const Shape<R> yshape = DistTensor<T, R>::from_vec(ys.local_box().len);
  auto y = Tensor<T, R>::empty(yshape, dev);
  auto idx = Tensor<std::int64_t, R>::empty(yshape, dev);
  const Tensor<T, R> in = detail::pool_input(*r, x.value());
  if (r->compute)
    exec::max_pool_forward(r->geom, as_block(in), as_block(y), as_block(idx), current_context(dev));
  return Var<T, R>::make(DistTensor<T, R>(ys, y), op, {x.ref()}, [x, xs, ys, r, idx, dev](const DistTensor<T, R>& g) {
    const DistTensor<T, R> gn = autograd::gradient_as(ys, g);
    const Tensor<T, R> gy = gn.local().contiguous();
    Tensor<T, R> gbox;
    if (r->compute) {
      Shape<R> bs = gy.shape();
      for (int d = 0; d < R - 2; ++d) bs[2 + d] = r->box[static_cast<std::size_t>(d)].len;
      gbox = Tensor<T, R>::empty(bs, dev);
      exec::max_pool_backward(r->geom, as_block(gy), as_block(idx), as_block(gbox), current_context(dev));
    }
    x.accumulate_grad(DistTensor<T, R>(detail::window_input_grad_spec(xs, ys, gn.spec()),
                                       detail::pool_input_grad(*r, xs, gbox, dev)));
  });
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
