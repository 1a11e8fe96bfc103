// Schedules of the point-cloud ops (include/shardtensor/nn/functional/neighbors.hpp), on Blocks:
//  - box routing: owners of the local points, one RowExchange (dist/points.hpp) to them;
//  - the neighbour gather plan: the distinct support rows a rank's lists need, requested once
//    each from their owners (alltoall of counts + alltoallv of the global indices), the owners'
//    RowExchange of the requested rows, and the expansion map (q, k) -> received row that the
//    rows family applies (rows_gather forward, rows_scatter_add backward);
// The per-entry maths (offsets, norms, distance weights, aggregation) is the points exec family
// (exec/points.hpp), called from the header.
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

}  // namespace shard::nn::functional::detail
