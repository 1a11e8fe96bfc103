// Schedules of the point-cloud ops (include/shardtensor/nn/functional/neighbors.hpp), on Blocks:
//  - box routing: owners of the local points, one RowExchange (dist/points.hpp) to them;
//  - the neighbour gather plan: the distinct support rows a rank's lists need, requested once
//    each from their owners (alltoall of counts + alltoallv of the global indices), the owners'
//    RowExchange of the requested rows, and the expansion map (q, k) -> received row that the
//    rows family applies (rows_gather forward, rows_scatter_add backward);
//  - the per-entry maths of offsets, norms, distance weights and aggregation: host loops on
//    contiguous f32 / f64 blocks (no exec family yet; the headers refuse device tensors).
#include "shardtensor/nn/functional/neighbors.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "shardtensor/exec/box.hpp"
#include "shardtensor/exec/rows.hpp"
#include "shardtensor/runtime/memory.hpp"

namespace shard::nn::functional::detail {

using shard::detail::NeighborGatherPlan;
using shard::detail::RowExchange;

namespace {

std::string counts_str(const std::vector<index_t>& c) { return fmt::format("[{}]", fmt::join(c, ", ")); }

/// A host i64 vector as a Block on ctx's device (a view on the host).
Block index_block(const std::vector<index_t>& v, ExecContext& ctx) {
  const index_t n = static_cast<index_t>(v.size());
  Block host = Block::view(DType::i64, Device::cpu(), const_cast<index_t*>(v.data()), &n, 1);
  if (ctx.device().is_cpu()) return host;
  Block dev = Block::allocate(DType::i64, ctx.device(), &n, 1);
  exec::box_copy(dev, host, ctx);
  return dev;
}

index_t trailing(const Block& b) {
  index_t x = 1;
  for (int d = 1; d < b.rank; ++d) x *= b.shape[static_cast<std::size_t>(d)];
  return x;
}

/// b (contiguous, b.shape[0] == rows) as a [rows, width] matrix view.
Block as_matrix(const Block& b, index_t rows) {
  SHARD_CHECK(b.is_contiguous() && b.rank >= 1 && b.shape[0] == rows, "point rows",
              "expected a contiguous block of {} rows, got {}", rows, b.shape_vec());
  const index_t shape[2] = {rows, trailing(b)};
  return Block::view(b.dtype, b.device, b.data, shape, 2, nullptr, b.owner);
}

void check_real(const Block& b, const char* op, const char* what) {
  SHARD_CHECK(b.dtype == DType::f32 || b.dtype == DType::f64, op, "{} must be f32 or f64, got {}", what, b.dtype);
  SHARD_CHECK(b.device.is_cpu() && b.is_contiguous(), op, "{} must be a contiguous host block", what);
}

template <class F>
void dispatch(DType dt, F&& f) {
  if (dt == DType::f64) f(double{});
  else f(float{});
}

}  // namespace

// ------------------------------------------------------------------------------ spec checks

void check_point_rows(const DistSpec& s, const DistSpec& rows, const char* op, const char* what, const char* rows_what,
                      const char* hint) {
  SHARD_CHECK(s.ndim() >= 1, op, "{} must have a point dim 0 ({})", what, s);
  SHARD_CHECK(!s.has_partial(), op, "{} must not be Partial ({}); resolve it first", what, s);
  for (int d = 1; d < s.ndim(); ++d)
    SHARD_CHECK(s.sharding_mesh_dims(d).empty(), op, "{}: only the point dim 0 may be sharded, got {}", what, s);
  SHARD_CHECK(s.mesh() == rows.mesh(), op, "{} and {} live on different meshes{}: {}", what, rows_what, hint,
              mesh_mismatch(s.mesh(), rows.mesh()));
  shard::detail::check_rows_sharded_over_mesh(s, op, what);
  const auto& m = s.mesh();
  std::vector<index_t> cs(static_cast<std::size_t>(m.size())), cr(cs.size());
  for (int r = 0; r < m.size(); ++r) {
    cs[static_cast<std::size_t>(r)] = s.box_of(r).len[0];
    cr[static_cast<std::size_t>(r)] = rows.box_of(r).len[0];
  }
  SHARD_CHECK(s.global_shape()[0] == rows.global_shape()[0] && cs == cr, op,
              "{} has {} points laid out {} over the ranks but {} has {} laid out {}{}", what, s.global_shape()[0],
              counts_str(cs), rows_what, rows.global_shape()[0], counts_str(cr), hint);
}

void check_neighbor_lists(const DistSpec& query, const DistSpec& support, const DistSpec& indices,
                          const DistSpec& counts, const char* op) {
  check_point_set(query, op, "the lists' query set");
  check_point_set(support, op, "the lists' support set");
  SHARD_CHECK(query.mesh() == support.mesh(), op, "the lists' query and support sets live on different meshes: {}",
              mesh_mismatch(query.mesh(), support.mesh()));
  SHARD_CHECK(indices.ndim() == 2, op, "neighbour indices must be [Nq, K], got {}", indices);
  check_point_rows(indices, query, op, "the neighbour indices", "their query set");
  check_point_rows(counts, query, op, "the neighbour counts", "their query set");
}

// ------------------------------------------------------------------------------ routing

PointRouting box_routing(const DistSpec& spec, const Block& pts, const BoxPartition& part, const char* op) {
  check_point_set(spec, op, "points");
  SHARD_CHECK(spec.mesh() == part.mesh(), op, "the points and the box partition live on different meshes: {}",
              mesh_mismatch(spec.mesh(), part.mesh()));
  const index_t D = spec.global_shape()[1];
  SHARD_CHECK(D == part.dim(), op, "points have {} coordinates but the partition has {} dims", D, part.dim());
  check_real(pts, op, "points");
  const index_t n = spec.local_box().len[0];
  SHARD_CHECK(pts.numel() == n * D, op, "points block {} does not match {}", pts.shape_vec(), spec);
  const auto& comm = spec.mesh().comm();
  const int P = comm->size();
  std::vector<int> owner(static_cast<std::size_t>(n));
  std::vector<double> p(static_cast<std::size_t>(D));
  std::int64_t outside = 0;
  dispatch(pts.dtype, [&](auto t) {
    using T = decltype(t);
    const T* x = static_cast<const T*>(pts.data);
    for (index_t i = 0; i < n; ++i) {
      for (index_t d = 0; d < D; ++d) p[static_cast<std::size_t>(d)] = static_cast<double>(x[i * D + d]);
      const int o = part.owner(p.data());
      owner[static_cast<std::size_t>(i)] = o;
      if (o < 0) ++outside;
    }
  });
  const auto all = comm->allgather_value(outside);
  std::string bad;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] > 0) bad += fmt::format("{}rank {}: {} point(s)", bad.empty() ? "" : "; ", r, all[r]);
  SHARD_CHECK(bad.empty(), op, "points outside the partition's domain (or NaN): {}", bad);
  std::vector<index_t> offsets(static_cast<std::size_t>(P) + 1, 0), rows(static_cast<std::size_t>(n));
  for (int o : owner) ++offsets[static_cast<std::size_t>(o) + 1];
  for (int r = 0; r < P; ++r) offsets[static_cast<std::size_t>(r) + 1] += offsets[static_cast<std::size_t>(r)];
  std::vector<index_t> fill(offsets.begin(), offsets.end() - 1);
  for (index_t i = 0; i < n; ++i) rows[static_cast<std::size_t>(fill[static_cast<std::size_t>(owner[static_cast<std::size_t>(i)])]++)] = i;
  auto ex = std::make_shared<const RowExchange>(comm, n, std::move(offsets), std::move(rows));
  const auto counts = comm->allgather_value(ex->n_recv());
  return PointRouting{ex, spec, point_spec(spec.mesh(), counts, D)};
}

Block route_rows(const PointRouting& r, const Block& src, ExecContext& ctx) {
  return r.exchange->forward(as_matrix(src, r.exchange->n_src()), ctx);
}

Block route_rows_adjoint(const PointRouting& r, const Block& g, ExecContext& ctx) {
  const index_t w = trailing(g), ns = r.exchange->n_src();
  const index_t shape[2] = {ns, w};
  Block out = Block::allocate(g.dtype, ctx.device(), shape, 2);
  exec::box_zero(out, ctx);
  r.exchange->adjoint_add(as_matrix(g, r.exchange->n_recv()), out, ctx);
  return out;
}

// ------------------------------------------------------------------------------ gather

std::shared_ptr<const NeighborGatherPlan> neighbor_gather_plan(const DistSpec& support, const Block& indices,
                                                               const char* op) {
  SHARD_CHECK(indices.dtype == DType::i64 && indices.rank == 2 && indices.is_contiguous() && indices.device.is_cpu(),
              op, "neighbour indices must be a contiguous host [n, K] i64 block");
  const auto& comm = support.mesh().comm();
  const int P = comm->size(), me = comm->rank();
  const index_t Ns = support.global_shape()[0], nq = indices.shape[0], K = indices.shape[1];
  std::vector<index_t> off(static_cast<std::size_t>(P) + 1);
  for (int r = 0; r <= P; ++r) off[static_cast<std::size_t>(r)] = point_offset(support, r);
  const auto* idx = static_cast<const index_t*>(indices.data);
  std::vector<index_t> uniq;
  uniq.reserve(static_cast<std::size_t>(nq * K));
  std::int64_t bad = 0;
  for (index_t i = 0; i < nq * K; ++i) {
    const index_t e = idx[i];
    if (e == -1) continue;
    if (e < 0 || e >= Ns) ++bad;
    else uniq.push_back(e);
  }
  const auto all = comm->allgather_value(bad);
  std::string msg;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] > 0) msg += fmt::format("{}rank {}: {} index(es)", msg.empty() ? "" : "; ", r, all[r]);
  SHARD_CHECK(msg.empty(), op, "neighbour indices outside [-1, {}) (the support set's size): {}", Ns, msg);
  std::sort(uniq.begin(), uniq.end());
  uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
  // requests per owner (uniq is ascending, so grouped by owner in rank order)
  std::vector<index_t> req(static_cast<std::size_t>(P), 0), req_off(static_cast<std::size_t>(P), 0);
  for (index_t g : uniq) {
    const auto o = static_cast<std::size_t>(std::upper_bound(off.begin(), off.end(), g) - off.begin() - 1);
    ++req[o];
  }
  for (int r = 1; r < P; ++r)
    req_off[static_cast<std::size_t>(r)] = req_off[static_cast<std::size_t>(r) - 1] + req[static_cast<std::size_t>(r) - 1];
  std::vector<index_t> inc(static_cast<std::size_t>(P), 0);
  comm->alltoall(req.data(), inc.data(), 1, DType::i64);
  std::vector<index_t> inc_off(static_cast<std::size_t>(P) + 1, 0);
  for (int r = 0; r < P; ++r)
    inc_off[static_cast<std::size_t>(r) + 1] = inc_off[static_cast<std::size_t>(r)] + inc[static_cast<std::size_t>(r)];
  std::vector<index_t> asked(static_cast<std::size_t>(inc_off.back()));
  comm->alltoallv(uniq.data(), req, req_off, asked.data(), inc,
                  std::span<const index_t>(inc_off).first(static_cast<std::size_t>(P)), DType::i64);
  const index_t lo = off[static_cast<std::size_t>(me)];
  for (auto& a : asked) a -= lo;  // global -> local row of this owner
  auto plan = std::make_shared<NeighborGatherPlan>();
  plan->support = support;
  plan->n_query = nq;
  plan->width = K;
  const index_t n_local = off[static_cast<std::size_t>(me) + 1] - lo;
  plan->exchange = std::make_shared<const RowExchange>(comm, n_local, std::move(inc_off), std::move(asked));
  plan->expand.resize(static_cast<std::size_t>(nq * K));
  for (index_t i = 0; i < nq * K; ++i) {
    const index_t e = idx[i];
    plan->expand[static_cast<std::size_t>(i)] =
        e < 0 ? -1 : static_cast<index_t>(std::lower_bound(uniq.begin(), uniq.end(), e) - uniq.begin());
  }
  return plan;
}

void neighbor_gather_forward(const NeighborGatherPlan& p, const Block& features, const Block& dst, ExecContext& ctx) {
  const char* op = "gather_neighbors";
  const index_t C = trailing(features);
  SHARD_CHECK(features.is_contiguous() && dst.is_contiguous() && dst.numel() == p.n_query * p.width * C, op,
              "features {} / output {} do not match the plan ({} x {} entries)", features.shape_vec(), dst.shape_vec(),
              p.n_query, p.width);
  Block recv = p.exchange->forward(as_matrix(features, p.exchange->n_src()), ctx);  // [U, C]
  const Block map = index_block(p.expand, ctx);
  const index_t shape[2] = {p.n_query * p.width, C};
  exec::rows_gather(exec::RowsGeometry{p.n_unique(), p.n_query * p.width, C}, recv, map,
                    Block::view(dst.dtype, dst.device, dst.data, shape, 2, nullptr, dst.owner), ctx);
  shard::detail::bump_version(dst.owner);
}

Block neighbor_gather_backward(const NeighborGatherPlan& p, const Block& g, index_t n_support_local, ExecContext& ctx) {
  SHARD_CHECK(g.rank == 3 && g.shape[0] == p.n_query && g.shape[1] == p.width, "gather_neighbors",
              "gradient {} does not match the plan ({} x {} entries)", g.shape_vec(), p.n_query, p.width);
  const index_t C = g.shape[2];
  const index_t U = p.n_unique();
  const index_t rshape[2] = {U, C}, fshape[2] = {n_support_local, C};
  Block grecv = Block::allocate(g.dtype, ctx.device(), rshape, 2);
  exec::box_zero(grecv, ctx);
  const Block map = index_block(p.expand, ctx);
  const index_t gshape[2] = {p.n_query * p.width, C};
  exec::rows_scatter_add(exec::RowsGeometry{U, p.n_query * p.width, C},
                         Block::view(g.dtype, g.device, g.data, gshape, 2, nullptr, g.owner), map, grecv, ctx);
  Block gf = Block::allocate(g.dtype, ctx.device(), fshape, 2);
  exec::box_zero(gf, ctx);
  p.exchange->adjoint_add(grecv, gf, ctx);
  return gf;
}

// ------------------------------------------------------------------------------ per-entry maths

void neighbor_offsets_forward(const Block& gathered, const Block& query, const Block& idx, const Block& out) {
  const char* op = "neighbor_offsets";
  check_real(gathered, op, "gathered support points");
  check_real(query, op, "query points");
  const index_t n = query.shape[0], D = query.shape[1], K = idx.shape[1];
  dispatch(query.dtype, [&](auto t) {
    using T = decltype(t);
    const T* G = static_cast<const T*>(gathered.data);
    const T* q = static_cast<const T*>(query.data);
    const auto* ix = static_cast<const index_t*>(idx.data);
    T* y = static_cast<T*>(out.data);
    for (index_t i = 0; i < n; ++i)
      for (index_t k = 0; k < K; ++k)
        for (index_t d = 0; d < D; ++d) {
          const index_t e = (i * K + k) * D + d;
          y[e] = ix[i * K + k] >= 0 ? G[e] - q[i * D + d] : T(0);
        }
  });
}

void neighbor_offsets_backward(const Block& g, const Block& idx, const Block* g_gathered, const Block* g_query) {
  const index_t n = g.shape[0], K = g.shape[1], D = g.shape[2];
  dispatch(g.dtype, [&](auto t) {
    using T = decltype(t);
    const T* gy = static_cast<const T*>(g.data);
    const auto* ix = static_cast<const index_t*>(idx.data);
    T* gG = g_gathered ? static_cast<T*>(g_gathered->data) : nullptr;
    T* gq = g_query ? static_cast<T*>(g_query->data) : nullptr;
    for (index_t i = 0; i < n; ++i)
      for (index_t d = 0; d < D; ++d) {
        double s = 0;
        for (index_t k = 0; k < K; ++k) {
          const index_t e = (i * K + k) * D + d;
          const bool valid = ix[i * K + k] >= 0;
          if (gG) gG[e] = valid ? gy[e] : T(0);
          if (valid) s += static_cast<double>(gy[e]);
        }
        if (gq) gq[i * D + d] = static_cast<T>(-s);
      }
  });
}

void neighbor_norm_forward(const Block& offsets, const Block& out) {
  const index_t nk = offsets.shape[0] * offsets.shape[1], D = offsets.shape[2];
  dispatch(offsets.dtype, [&](auto t) {
    using T = decltype(t);
    const T* o = static_cast<const T*>(offsets.data);
    T* y = static_cast<T*>(out.data);
    for (index_t e = 0; e < nk; ++e) {
      double s = 0;
      for (index_t d = 0; d < D; ++d) s += static_cast<double>(o[e * D + d]) * static_cast<double>(o[e * D + d]);
      y[e] = static_cast<T>(std::sqrt(s));
    }
  });
}

void neighbor_norm_backward(const Block& offsets, const Block& dist, const Block& g, const Block& g_offsets) {
  const index_t nk = offsets.shape[0] * offsets.shape[1], D = offsets.shape[2];
  dispatch(offsets.dtype, [&](auto t) {
    using T = decltype(t);
    const T* o = static_cast<const T*>(offsets.data);
    const T* dd = static_cast<const T*>(dist.data);
    const T* gy = static_cast<const T*>(g.data);
    T* go = static_cast<T*>(g_offsets.data);
    for (index_t e = 0; e < nk; ++e) {
      const double s = dd[e] > T(0) ? static_cast<double>(gy[e]) / static_cast<double>(dd[e]) : 0.0;
      for (index_t d = 0; d < D; ++d) go[e * D + d] = static_cast<T>(s * static_cast<double>(o[e * D + d]));
    }
  });
}

namespace {

/// f(d) and f'(d).
inline void weight_of(const WeightFn& f, double d, double& w, double& dw) {
  switch (f.kind) {
    case WeightFn::Kind::inverse_distance: {
      const double a = 1.0 / (d + f.param);
      w = a;
      dw = -a * a;
      return;
    }
    case WeightFn::Kind::gaussian: {
      const double s2 = f.param * f.param;
      w = std::exp(-d * d / (2 * s2));
      dw = -d / s2 * w;
      return;
    }
    case WeightFn::Kind::linear:
      w = d < f.param ? 1.0 - d / f.param : 0.0;
      dw = d < f.param ? -1.0 / f.param : 0.0;
      return;
  }
  w = dw = 0;
}

}  // namespace

void distance_weights_forward(const WeightFn& f, const Block& dist, const Block& counts, const Block& out) {
  const index_t n = dist.shape[0], K = dist.shape[1];
  const auto* cnt = static_cast<const index_t*>(counts.data);
  dispatch(dist.dtype, [&](auto t) {
    using T = decltype(t);
    const T* d = static_cast<const T*>(dist.data);
    T* y = static_cast<T*>(out.data);
    for (index_t i = 0; i < n; ++i)
      for (index_t k = 0; k < K; ++k) {
        double w = 0, dw = 0;
        if (k < cnt[i]) weight_of(f, static_cast<double>(d[i * K + k]), w, dw);
        y[i * K + k] = static_cast<T>(w);
      }
  });
}

void distance_weights_backward(const WeightFn& f, const Block& dist, const Block& counts, const Block& g,
                               const Block& g_dist) {
  const index_t n = dist.shape[0], K = dist.shape[1];
  const auto* cnt = static_cast<const index_t*>(counts.data);
  dispatch(dist.dtype, [&](auto t) {
    using T = decltype(t);
    const T* d = static_cast<const T*>(dist.data);
    const T* gy = static_cast<const T*>(g.data);
    T* gd = static_cast<T*>(g_dist.data);
    for (index_t i = 0; i < n; ++i)
      for (index_t k = 0; k < K; ++k) {
        double w = 0, dw = 0;
        if (k < cnt[i]) weight_of(f, static_cast<double>(d[i * K + k]), w, dw);
        gd[i * K + k] = static_cast<T>(dw * static_cast<double>(gy[i * K + k]));
      }
  });
}

namespace {

index_t valid_count(const index_t* cnt, index_t i, index_t K, const char* op) {
  const index_t c = cnt[i];
  SHARD_CHECK(c >= 0 && c <= K, op, "neighbour count {} of row {} outside [0, {}]", c, i, K);
  return c;
}

}  // namespace

void aggregate_forward(AggregateReduce reduce, const Block& values, const Block* weights, const Block& counts,
                       const Block& out, const Block& argmax) {
  const char* op = "aggregate";
  check_real(values, op, "values");
  const index_t n = values.shape[0], K = values.shape[1], C = values.shape[2];
  const auto* cnt = static_cast<const index_t*>(counts.data);
  dispatch(values.dtype, [&](auto t) {
    using T = decltype(t);
    const T* v = static_cast<const T*>(values.data);
    const T* w = weights ? static_cast<const T*>(weights->data) : nullptr;
    T* y = static_cast<T*>(out.data);
    auto* am = static_cast<index_t*>(argmax.data);
    for (index_t i = 0; i < n; ++i) {
      const index_t m = valid_count(cnt, i, K, op);
      for (index_t c = 0; c < C; ++c) {
        if (reduce == AggregateReduce::max) {
          index_t best = -1;
          T bv = T(0);
          for (index_t k = 0; k < m; ++k) {
            const T x = w ? w[i * K + k] * v[(i * K + k) * C + c] : v[(i * K + k) * C + c];
            if (best < 0 || x > bv) {
              best = k;
              bv = x;
            }
          }
          y[i * C + c] = bv;
          am[i * C + c] = best;
          continue;
        }
        double s = 0;
        for (index_t k = 0; k < m; ++k) {
          const double x = static_cast<double>(v[(i * K + k) * C + c]);
          s += w ? static_cast<double>(w[i * K + k]) * x : x;
        }
        if (reduce == AggregateReduce::mean) s = m > 0 ? s / static_cast<double>(m) : 0.0;
        y[i * C + c] = static_cast<T>(s);
      }
    }
  });
}

void aggregate_backward(AggregateReduce reduce, const Block& values, const Block* weights, const Block& counts,
                        const Block& argmax, const Block& g, const Block* g_values, const Block* g_weights) {
  const char* op = "aggregate";
  const index_t n = values.shape[0], K = values.shape[1], C = values.shape[2];
  const auto* cnt = static_cast<const index_t*>(counts.data);
  dispatch(values.dtype, [&](auto t) {
    using T = decltype(t);
    const T* v = static_cast<const T*>(values.data);
    const T* w = weights ? static_cast<const T*>(weights->data) : nullptr;
    const T* gy = static_cast<const T*>(g.data);
    const auto* am = static_cast<const index_t*>(argmax.data);
    T* gv = g_values ? static_cast<T*>(g_values->data) : nullptr;
    T* gw = g_weights ? static_cast<T*>(g_weights->data) : nullptr;
    if (gv) std::fill(gv, gv + n * K * C, T(0));
    if (gw) std::fill(gw, gw + n * K, T(0));
    for (index_t i = 0; i < n; ++i) {
      const index_t m = valid_count(cnt, i, K, op);
      if (reduce == AggregateReduce::max) {
        for (index_t c = 0; c < C; ++c) {
          const index_t k = am[i * C + c];
          if (k < 0) continue;
          const T gc = gy[i * C + c];
          if (gv) gv[(i * K + k) * C + c] += w ? w[i * K + k] * gc : gc;
          if (gw) gw[i * K + k] += gc * v[(i * K + k) * C + c];
        }
        continue;
      }
      const double scale = reduce == AggregateReduce::mean ? (m > 0 ? 1.0 / static_cast<double>(m) : 0.0) : 1.0;
      for (index_t k = 0; k < m; ++k) {
        const double wk = w ? static_cast<double>(w[i * K + k]) : 1.0;
        double sw = 0;
        for (index_t c = 0; c < C; ++c) {
          const double gc = static_cast<double>(gy[i * C + c]) * scale;
          if (gv) gv[(i * K + k) * C + c] = static_cast<T>(wk * gc);
          sw += gc * static_cast<double>(v[(i * K + k) * C + c]);
        }
        if (gw) gw[i * K + k] = static_cast<T>(sw);
      }
    }
  });
}

}  // namespace shard::nn::functional::detail
