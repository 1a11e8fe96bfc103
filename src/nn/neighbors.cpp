// Schedules of the point-cloud ops (include/shardtensor/nn/functional/neighbors.hpp), on Blocks,
// over the point plans of dist/points.hpp (no communication is chosen or issued here):
//  - box routing: detail::box_routing_plan (the owners and one RowExchange to them) as a
//    PointRouting; apply = the exchange, backward = its adjoint_add;
//  - the neighbour gather: detail::NeighborGatherPlan::forward / adjoint (requests, the owners'
//    RowExchange and the rows-family expansion).
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

namespace {

std::string counts_str(const std::vector<index_t>& c) { return fmt::format("[{}]", fmt::join(c, ", ")); }

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
  auto plan = shard::detail::box_routing_plan(spec, pts, part, op);
  return PointRouting{std::move(plan.exchange), spec, std::move(plan.target)};
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

void neighbor_gather_forward(const NeighborGatherPlan& p, const Block& features, const Block& dst, ExecContext& ctx) {
  p.forward(features, dst, ctx);
}

Block neighbor_gather_backward(const NeighborGatherPlan& p, const Block& g, index_t n_support_local, ExecContext& ctx) {
  SHARD_CHECK(n_support_local == p.exchange->n_src(), "gather_neighbors",
              "{} local support rows, but the plan was built for {}", n_support_local, p.exchange->n_src());
  return p.adjoint(g, ctx);
}

}  // namespace shard::nn::functional::detail
