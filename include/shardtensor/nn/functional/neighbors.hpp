#pragma once
/// \file neighbors.hpp
/// Differentiable point-cloud operations on sharded point sets (issue 17): routing points to the
/// ranks of a box partition, gathering the features of neighbours, neighbour offsets and
/// distances, distance weights and aggregation over neighbour lists.
///
/// Point sets and neighbour lists are those of dist/points.hpp: a set is [N, D] (features
/// [N, C]) with its rows sharded over every mesh dim, ragged and empty shards allowed; a
/// `Neighbors<T>` holds, per query row (rows laid out like the query set), the global indices
/// of its neighbours in the support set, padded with -1, and the count of valid entries.
/// Every op here works on any such lists, however they were made (shard::knn,
/// shard::radius_neighbors, or lists built by hand).
///
///  - `F::partition_by_box(points, part)`: moves every point to the rank whose box holds it.
///    Rows arrive ordered by source rank, then source row: a stable sort of the global order by
///    owner. Returns the routed points and the routing (`PointRouting::apply` moves any other
///    per-point tensor, features or labels, the same way). Backward: the exchange's adjoint.
///  - `F::gather_neighbors(features [Ns, C], nb)` -> [Nq, K, C] (features f32 / f64, whatever the
///    coordinates' type; aggregate likewise): row (q, k) is the features of
///    support point nb.indices[q, k] (zeros for padding). One alltoallv of the rows this rank
///    needs, each requested once from its owner (the plan is built on the first gather and
///    cached on `nb`); backward scatter-adds the gradients into the received rows and returns
///    them to their owners (RowExchange::adjoint_add).
///  - `F::neighbor_offsets(query, support, nb)` -> [Nq, K, D] = support[idx] - query,
///    `F::neighbor_distance(query, support, nb)` -> [Nq, K] = |support[idx] - query| (padding 0;
///    the distance's gradient is 0 where the distance is 0). Differentiable in both point sets.
///  - `F::distance_weights(distance, nb, WeightFn)` -> [Nq, K] = f(distance) on valid entries,
///    0 on padding: inverse distance 1 / (d + eps), Gaussian exp(-d^2 / (2 sigma^2)), linear
///    max(0, 1 - d / radius).
///  - `F::aggregate(values [Nq, K, C], nb, {sum | mean | max}, weights [Nq, K])` -> [Nq, C] over
///    the first nb.counts[q] entries of each row: sum_k w v, its mean over the count (0 for an
///    empty row), or max_k (w v) (gradient to the first maximum; 0 for an empty row).
///
/// Recipe: checks, spec algebra and the tape nodes here; the schedules on Blocks in
/// src/nn/neighbors.cpp (routing and gather plans over dist/'s RowExchange, the rows family for
/// the data movement). The per-entry maths (offsets, norms, weights, aggregation) has no
/// communication: the templates below call the points exec family (exec/points.hpp) directly,
/// on the device of the values.
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "shardtensor/dist/points.hpp"
#include "shardtensor/exec/points.hpp"
#include "shardtensor/nn/functional/common.hpp"

namespace shard {
namespace nn::functional {

// ------------------------------------------------------------------------------ options

/// The reduction of F::aggregate over the valid entries of each neighbour row (the points
/// family's enum: sum, mean, max).
using AggregateReduce = exec::PointAggregate;

struct AggregateOptions {
  AggregateReduce reduce = AggregateReduce::sum;
};

/// The weight of a neighbour as a function of its distance d (F::distance_weights; the points
/// family's type): WeightFn::inverse_distance(eps) = 1 / (d + eps), WeightFn::gaussian(sigma) =
/// exp(-d^2 / (2 sigma^2)), WeightFn::linear(radius) = max(0, 1 - d / radius).
using WeightFn = exec::PointWeightFn;

// ------------------------------------------------------------------------------ routing

/// How partition_by_box moved the rows of a point set; `apply` moves any tensor with the same
/// rows (features, labels) the same way.
struct PointRouting {
  std::shared_ptr<const shard::detail::RowExchange> exchange;
  DistSpec source;  ///< [N, D] layout of the points before routing
  DistSpec target;  ///< [N, D] layout after (point_spec with the routed counts)

  /// x [N, C] laid out like the routed points' source -> [N, C] laid out like the target. Any
  /// dtype. Collective.
  template <class U>
  DistTensor<U, 2> apply(const DistTensor<U, 2>& x) const;
  /// The same on the tape (f32 / f64): backward returns the gradients to the source rows.
  template <class U>
  Var<U, 2> apply(const Var<U, 2>& x) const;
};

/// The result of partition_by_box: the routed points (a Var or a DistTensor) and the routing.
template <class P>
struct Routed {
  P points;
  PointRouting routing;
};

namespace detail {

/// Throws (the same on every rank: reads specs only) unless `s` (rank >= 1) has its rows laid out
/// like the point set `rows` (same mesh, N and per-rank counts; dim 0 sharded over every mesh dim
/// of size > 1, the other dims unsharded, no Partial). `hint` ends the mismatch message.
void check_point_rows(const DistSpec& s, const DistSpec& rows, const char* op, const char* what,
                      const char* rows_what, const char* hint = "");
/// Checks of a Neighbors result's own specs (indices / counts laid out like its query set).
void check_neighbor_lists(const DistSpec& query, const DistSpec& support, const DistSpec& indices,
                          const DistSpec& counts, const char* op);

/// Schedule of partition_by_box (src/nn/neighbors.cpp): the routing plan of dist/points.hpp
/// (`detail::box_routing_plan`: checks, errors on every rank for mesh, D, points outside the
/// domain or NaN; the owners, the row exchange and the routed layout) as a PointRouting.
/// `points`: this rank's rows, a contiguous [n, D] f32 / f64 block on any device (the owners are
/// computed there; only per-rank counts reach the host). Collective.
PointRouting box_routing(const DistSpec& points_spec, const Block& points, const BoxPartition& part, const char* op);
/// Routed rows: a new contiguous [n_recv, C] block of src's dtype. Collective.
Block route_rows(const PointRouting& r, const Block& src, ExecContext& ctx);
/// Adjoint of route_rows: a new [n_src, C] block, the gradients summed back onto their rows.
Block route_rows_adjoint(const PointRouting& r, const Block& g, ExecContext& ctx);

/// dst [n_query, K, C] (contiguous) = the gathered features; features [ns, C] contiguous. Collective.
void neighbor_gather_forward(const shard::detail::NeighborGatherPlan& p, const Block& features, const Block& dst,
                             ExecContext& ctx);
/// A new [ns, C] block: the adjoint of the gather applied to g [n_query, K, C]. Collective.
Block neighbor_gather_backward(const shard::detail::NeighborGatherPlan& p, const Block& g, index_t n_support_local,
                               ExecContext& ctx);

/// The host, contiguous form of a local block (a view when it already is one).
template <class U, int R>
Tensor<U, R> host_contig(const Tensor<U, R>& t) {
  return t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu());
}

/// The contiguous form of a local block on `dev` (a view when it already is one).
template <class U, int R>
Tensor<U, R> on_device(const Tensor<U, R>& t, Device dev) {
  return t.device() == dev ? t.contiguous() : t.to(dev);
}

/// The gather plan of `nb`, built (collectively) on first use and cached on it.
template <class T>
std::shared_ptr<const shard::detail::NeighborGatherPlan> gather_plan_of(const Neighbors<T>& nb, const char* op) {
  const auto& p = nb.gather_plan;
  if (p && p->support == nb.support && p->width == nb.width() && p->n_query == nb.indices.local().shape()[0] &&
      !p->indices.owner_before(nb.indices.local().storage()) && !nb.indices.local().storage().owner_before(p->indices))
    return p;
  const auto idx = host_contig(nb.indices.local());
  auto plan = shard::detail::neighbor_gather_plan(nb.support, as_block(idx), op);
  std::const_pointer_cast<shard::detail::NeighborGatherPlan>(plan)->indices = nb.indices.local().storage();
  nb.gather_plan = plan;
  return plan;
}

template <class T>
void check_lists(const Neighbors<T>& nb, const char* op) {
  check_neighbor_lists(nb.query, nb.support, nb.indices.spec(), nb.counts.spec(), op);
}

}  // namespace detail

// ------------------------------------------------------------------------------ partition_by_box

/// Routes a point set to the ranks of `part` (see the file comment), off the tape. Collective.
/// Errors on every rank: D != part.dim(), a mesh other than the partition's, points outside the
/// domain or NaN (naming each rank and its count).
template <class T>
Routed<DistTensor<T, 2>> partition_by_box(const DistTensor<T, 2>& points, const BoxPartition& part) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "F::partition_by_box: float or double points");
  const auto pl = points.local().contiguous();
  PointRouting r = detail::box_routing(points.spec(), as_block(pl), part, "partition_by_box");
  return {r.apply(points), std::move(r)};
}

/// Routes a point set to the ranks of `part`, on the tape (gradients return to the source rows).
template <class T>
Routed<Var<T, 2>> partition_by_box(const Var<T, 2>& points, const BoxPartition& part) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "F::partition_by_box: float or double points");
  const auto pl = points.local().contiguous();
  PointRouting r = detail::box_routing(points.value().spec(), as_block(pl), part, "partition_by_box");
  return {r.apply(points), std::move(r)};
}

template <class U>
DistTensor<U, 2> PointRouting::apply(const DistTensor<U, 2>& x) const {
  const char* op = "PointRouting::apply";
  SHARD_CHECK(exchange != nullptr, op, "empty routing (not made by partition_by_box)");
  detail::check_point_rows(x.spec(), source, op, "x", "the routed points' source");
  const index_t C = x.spec().global_shape()[1];
  const auto xl = x.local().contiguous();
  Block out = detail::route_rows(*this, as_block(xl), current_context(x.device()));
  return DistTensor<U, 2>(point_rows_spec(target, {C}), tensor_of<U, 2>(out));
}

template <class U>
Var<U, 2> PointRouting::apply(const Var<U, 2>& x) const {
  static_assert(std::is_same_v<U, float> || std::is_same_v<U, double>, "PointRouting::apply on the tape: f32 / f64");
  DistTensor<U, 2> y = apply(x.value());
  const DistSpec xs = x.value().spec(), ys = y.spec();
  const Device dev = x.value().device();
  PointRouting self = *this;
  return Var<U, 2>::make(std::move(y), "partition_by_box", {x.ref()}, [x, xs, ys, dev, self](const DistTensor<U, 2>& g) {
    const auto gl = autograd::gradient_as(ys, g, autograd::PartialGrad::resolve).local().contiguous();
    Block gx = detail::route_rows_adjoint(self, as_block(gl), current_context(dev));
    x.accumulate_grad(DistTensor<U, 2>(xs, tensor_of<U, 2>(gx)));
  });
}

// ------------------------------------------------------------------------------ gather

/// features [Ns, C] (laid out like nb.support) -> [Nq, K, C] laid out like nb.query: row (q, k) is
/// the features of neighbour k of query q, zeros for padding. Collective; differentiable.
/// Errors on every rank when the features' rows are not nb.support's ("indices from a different
/// point set") or an index is outside [-1, Ns).
template <class U, class T>
Var<U, 3> gather_neighbors(const Var<U, 2>& features, const Neighbors<T>& nb) {
  static_assert(std::is_same_v<U, float> || std::is_same_v<U, double>, "F::gather_neighbors: float or double features");
  const char* op = "gather_neighbors";
  detail::check_lists(nb, op);
  const DistSpec fs = features.value().spec();
  detail::check_point_rows(fs, nb.support, op, "features", "the neighbour lists' support set",
                           ": indices from a different point set");
  const index_t C = fs.global_shape()[1], K = nb.width();
  const Device dev = features.value().device();
  auto plan = detail::gather_plan_of(nb, op);
  const DistSpec ys = point_rows_spec(nb.query, {K, C});
  auto y = Tensor<U, 3>::empty(DistTensor<U, 3>::from_vec(ys.local_box().len), dev);
  const auto fl = features.local().contiguous();
  detail::neighbor_gather_forward(*plan, as_block(fl), as_block(y), current_context(dev));
  const index_t ns = fs.local_box().len[0];
  return Var<U, 3>::make(DistTensor<U, 3>(ys, y), op, {features.ref()},
                         [features, fs, ys, plan, ns, dev](const DistTensor<U, 3>& g) {
                           const auto gl = autograd::gradient_as(ys, g, autograd::PartialGrad::resolve).local().contiguous();
                           Block gf = detail::neighbor_gather_backward(*plan, as_block(gl), ns, current_context(dev));
                           features.accumulate_grad(DistTensor<U, 2>(fs, tensor_of<U, 2>(gf)));
                         });
}

// ------------------------------------------------------------------------------ offsets, distance

/// [Nq, K, D] = support[nb.indices] - query (0 for padding); differentiable in query and support.
template <class T>
Var<T, 3> neighbor_offsets(const Var<T, 2>& query, const Var<T, 2>& support, const Neighbors<T>& nb) {
  const char* op = "neighbor_offsets";
  detail::check_lists(nb, op);
  const DistSpec qs = query.value().spec();
  detail::check_point_rows(qs, nb.query, op, "query", "the neighbour lists' query set",
                           ": lists made for a different query set");
  detail::check_point_rows(support.value().spec(), nb.support, op, "support", "the neighbour lists' support set",
                           ": indices from a different point set");
  const index_t D = qs.global_shape()[1];
  SHARD_CHECK(support.value().spec().global_shape()[1] == D, op, "query has {} coordinates but support has {}", D,
              support.value().spec().global_shape()[1]);
  const Device dev = query.value().device();
  auto G = gather_neighbors(support, nb);
  const DistSpec ys = G.value().spec();
  const auto idx = detail::on_device(nb.indices.local(), dev);
  const auto ql = query.local().contiguous();
  const exec::PointListGeometry geo{ql.shape()[0], nb.width(), D};
  auto y = Tensor<T, 3>::empty(G.local().shape(), dev);
  exec::points_offsets_forward(geo, as_block(G.local()), as_block(ql), as_block(idx), as_block(y),
                               current_context(dev));
  return Var<T, 3>::make(DistTensor<T, 3>(ys, y), op, {G.ref(), query.ref()},
                         [G, query, qs, ys, idx, geo, dev](const DistTensor<T, 3>& g) {
                           const auto gl = autograd::gradient_as(ys, g, autograd::PartialGrad::resolve).local().contiguous();
                           std::optional<Tensor<T, 3>> gG;
                           std::optional<Tensor<T, 2>> gq;
                           Block bG, bq;
                           if (G.requires_grad()) bG = as_block(gG.emplace(Tensor<T, 3>::empty(gl.shape(), dev)));
                           if (query.requires_grad())
                             bq = as_block(gq.emplace(
                                 Tensor<T, 2>::empty(DistTensor<T, 2>::from_vec(qs.local_box().len), dev)));
                           exec::points_offsets_backward(geo, as_block(gl), as_block(idx), gG ? &bG : nullptr,
                                                         gq ? &bq : nullptr, current_context(dev));
                           if (gG) G.accumulate_grad(DistTensor<T, 3>(ys, *gG));
                           if (gq) query.accumulate_grad(DistTensor<T, 2>(qs, *gq));
                         });
}

/// [Nq, K] = |support[nb.indices] - query| (0 for padding; gradient 0 where the distance is 0).
template <class T>
Var<T, 2> neighbor_distance(const Var<T, 2>& query, const Var<T, 2>& support, const Neighbors<T>& nb) {
  const char* op = "neighbor_distance";
  auto off = neighbor_offsets(query, support, nb);
  const DistSpec os = off.value().spec();
  const DistSpec ys = point_rows_spec(nb.query, {nb.width()});
  const auto& ol = off.local();
  const Device dev = ol.device();
  const exec::PointListGeometry geo{ol.shape()[0], ol.shape()[1], ol.shape()[2]};
  auto y = Tensor<T, 2>::empty({ol.shape()[0], ol.shape()[1]}, dev);
  exec::points_norm_forward(geo, as_block(ol), as_block(y), current_context(dev));
  return Var<T, 2>::make(DistTensor<T, 2>(ys, y), op, {off.ref()}, [off, os, ys, y, geo, dev](const DistTensor<T, 2>& g) {
    const auto gl = autograd::gradient_as(ys, g, autograd::PartialGrad::resolve).local().contiguous();
    auto go = Tensor<T, 3>::empty(off.local().shape(), dev);
    exec::points_norm_backward(geo, as_block(off.local()), as_block(y), as_block(gl), as_block(go),
                               current_context(dev));
    off.accumulate_grad(DistTensor<T, 3>(os, go));
  });
}

// ------------------------------------------------------------------------------ weights, aggregate

/// [Nq, K] = f(distance) on the valid entries (k < nb.counts[q]), 0 on padding; differentiable.
template <class T>
Var<T, 2> distance_weights(const Var<T, 2>& distance, const Neighbors<T>& nb, const WeightFn& f) {
  const char* op = "distance_weights";
  detail::check_lists(nb, op);
  SHARD_CHECK(f.param > 0 && std::isfinite(f.param), op, "the weight function's parameter must be finite and > 0, got {}",
              f.param);
  const DistSpec ds = distance.value().spec();
  detail::check_point_rows(ds, nb.query, op, "distance", "the neighbour lists' query set");
  SHARD_CHECK(ds.global_shape()[1] == nb.width(), op, "distance has {} entries per row but the lists have {}",
              ds.global_shape()[1], nb.width());
  const Device dev = distance.value().device();
  const auto dl = distance.local().contiguous();
  const auto cnt = detail::on_device(nb.counts.local(), dev);
  const exec::PointListGeometry geo{dl.shape()[0], dl.shape()[1], 1};
  auto y = Tensor<T, 2>::empty(dl.shape(), dev);
  exec::points_weights_forward(geo, f, as_block(dl), as_block(cnt), as_block(y), current_context(dev));
  return Var<T, 2>::make(DistTensor<T, 2>(ds, y), op, {distance.ref()},
                         [distance, ds, dl, cnt, f, geo, dev](const DistTensor<T, 2>& g) {
                           const auto gl = autograd::gradient_as(ds, g, autograd::PartialGrad::resolve).local().contiguous();
                           auto gd = Tensor<T, 2>::empty(dl.shape(), dev);
                           exec::points_weights_backward(geo, f, as_block(dl), as_block(cnt), as_block(gl), as_block(gd),
                                                         current_context(dev));
                           distance.accumulate_grad(DistTensor<T, 2>(ds, gd));
                         });
}

namespace detail {

template <class U, class T>
Var<U, 2> aggregate_impl(const Var<U, 3>& values, const Neighbors<T>& nb, AggregateOptions opts,
                         const std::optional<Var<U, 2>>& weights) {
  const char* op = "aggregate";
  detail::check_lists(nb, op);
  const DistSpec vs = values.value().spec();
  detail::check_point_rows(vs, nb.query, op, "values", "the neighbour lists' query set");
  const index_t K = nb.width(), C = vs.global_shape()[2];
  SHARD_CHECK(vs.global_shape()[1] == K, op, "values have {} entries per row but the lists have {}",
              vs.global_shape()[1], K);
  DistSpec ws;
  if (weights) {
    ws = weights->value().spec();
    detail::check_point_rows(ws, nb.query, op, "weights", "the neighbour lists' query set");
    SHARD_CHECK(ws.global_shape()[1] == K, op, "weights have {} entries per row but the lists have {}",
                ws.global_shape()[1], K);
  }
  const Device dev = values.value().device();
  const auto vl = values.local().contiguous();
  std::optional<Tensor<U, 2>> wl;
  Block bw;
  if (weights) bw = as_block(wl.emplace(weights->local().contiguous()));
  const auto cnt = detail::on_device(nb.counts.local(), dev);
  const DistSpec ys = point_rows_spec(nb.query, {C});
  const index_t n = vl.shape()[0];
  const exec::PointListGeometry geo{n, K, C};
  auto y = Tensor<U, 2>::empty({n, C}, dev);
  auto am = Tensor<std::int64_t, 2>::empty({opts.reduce == AggregateReduce::max ? n : 0, C}, dev);
  exec::points_aggregate_forward(geo, opts.reduce, as_block(vl), wl ? &bw : nullptr, as_block(cnt), as_block(y),
                                 as_block(am), current_context(dev));
  autograd::VarRef wref = weights ? weights->ref() : autograd::VarRef{};
  std::optional<Var<U, 2>> wv = weights;
  return Var<U, 2>::make(
      DistTensor<U, 2>(ys, y), op, {values.ref(), wref},
      [values, wv, vs, ws, ys, vl, wl, cnt, am, geo, dev, reduce = opts.reduce](const DistTensor<U, 2>& g) {
        const auto gl = autograd::gradient_as(ys, g, autograd::PartialGrad::resolve).local().contiguous();
        std::optional<Tensor<U, 3>> gv;
        std::optional<Tensor<U, 2>> gw;
        Block bgv, bgw, bw2;
        if (values.requires_grad()) bgv = as_block(gv.emplace(Tensor<U, 3>::empty(vl.shape(), dev)));
        if (wv && wv->requires_grad()) bgw = as_block(gw.emplace(Tensor<U, 2>::empty(wl->shape(), dev)));
        if (wl) bw2 = as_block(*wl);
        exec::points_aggregate_backward(geo, reduce, as_block(vl), wl ? &bw2 : nullptr, as_block(cnt), as_block(am),
                                        as_block(gl), gv ? &bgv : nullptr, gw ? &bgw : nullptr, current_context(dev));
        if (gv) values.accumulate_grad(DistTensor<U, 3>(vs, *gv));
        if (gw) wv->accumulate_grad(DistTensor<U, 2>(ws, *gw));
      });
}

}  // namespace detail

/// values [Nq, K, C] (rows like nb.query) -> [Nq, C]: the reduction over the valid entries of
/// each row (k < nb.counts[q]) of values[q, k, :]. Local; differentiable.
template <class U, class T>
Var<U, 2> aggregate(const Var<U, 3>& values, const Neighbors<T>& nb, AggregateOptions opts = {}) {
  return detail::aggregate_impl(values, nb, opts, std::optional<Var<U, 2>>());
}

/// The same of w[q, k] * values[q, k, :] with weights w [Nq, K] (rows like nb.query);
/// differentiable in values and weights.
template <class U, class T>
Var<U, 2> aggregate(const Var<U, 3>& values, const Neighbors<T>& nb, AggregateOptions opts, const Var<U, 2>& weights) {
  return detail::aggregate_impl(values, nb, opts, std::optional<Var<U, 2>>(weights));
}

}  // namespace nn::functional
}  // namespace shard
