// The communication plans of the point-cloud ops (include/shardtensor/dist/points.hpp): the box
// routing plan of partition_by_box and the neighbour gather plan of gather_neighbors, with their
// adjoints. Every collective of those ops is here; src/nn/neighbors.cpp only schedules them.
#include <algorithm>
#include <array>

#include "dist/point_util.hpp"
#include "shardtensor/dist/points.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/exec/points.hpp"
#include "shardtensor/exec/rows.hpp"
#include "shardtensor/runtime/memory.hpp"

namespace shard::detail {

// ------------------------------------------------------------------------------ box routing

BoxRoutingPlan box_routing_plan(const DistSpec& spec, const Block& pts, const BoxPartition& part, const char* op) {
  check_points_against(spec, pts, part, op);
  const index_t n = spec.local_box().len[0], D = spec.global_shape()[1];
  const auto& comm = spec.mesh().comm();
  const int P = comm->size();
  // owners and per-rank counts on the points' device; only the counts reach the host
  ExecContext& ctx = current_context(pts.device);
  Block owner = Block::allocate(DType::i64, ctx.device(), &n, 1);
  const auto counts_out = point_owners(part, pts, &owner, ctx);
  agree_none_bad(comm, counts_out[static_cast<std::size_t>(P)], op, "points outside the partition's domain (or NaN)",
                 "point(s)");
  std::vector<index_t> offsets(static_cast<std::size_t>(P) + 1, 0);
  for (int r = 0; r < P; ++r)
    offsets[static_cast<std::size_t>(r) + 1] = offsets[static_cast<std::size_t>(r)] + counts_out[static_cast<std::size_t>(r)];
  Block rows = Block::allocate(DType::i64, ctx.device(), &n, 1);
  exec::points_bucket_rows(P, owner, index_block(offsets, ctx), rows, ctx);
  auto ex = std::make_shared<const RowExchange>(RowExchange::with_rows_block(comm, n, std::move(offsets), std::move(rows)));
  const auto counts = comm->allgather_value(ex->n_recv());
  return BoxRoutingPlan{ex, point_spec(spec.mesh(), counts, D)};
}

// ------------------------------------------------------------------------------ neighbour gather

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
  agree_none_bad(comm, bad, op,
                 fmt::format("neighbour indices outside [-1, {}) (the support set's size)", Ns).c_str(), "index(es)");
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

namespace {

index_t trailing(const Block& b) {
  index_t x = 1;
  for (int d = 1; d < b.rank; ++d) x *= b.shape[static_cast<std::size_t>(d)];
  return x;
}

Block as_matrix(const Block& b, index_t rows, const char* op) {
  SHARD_CHECK(b.is_contiguous() && b.rank >= 1 && b.shape[0] == rows, op,
              "expected a contiguous block of {} rows, got {}", rows, b.shape_vec());
  const index_t shape[2] = {rows, trailing(b)};
  return Block::view(b.dtype, b.device, b.data, shape, 2, nullptr, b.owner);
}

}  // namespace

void NeighborGatherPlan::forward(const Block& features, const Block& dst, ExecContext& ctx) const {
  const char* op = "gather_neighbors";
  const index_t C = trailing(features);
  SHARD_CHECK(features.is_contiguous() && dst.is_contiguous() && dst.numel() == n_query * width * C, op,
              "features {} / output {} do not match the plan ({} x {} entries)", features.shape_vec(), dst.shape_vec(),
              n_query, width);
  Block recv = exchange->forward(as_matrix(features, exchange->n_src(), op), ctx);  // [U, C]
  const Block map = index_block(expand, ctx);
  const index_t shape[2] = {n_query * width, C};
  exec::rows_gather(exec::RowsGeometry{n_unique(), n_query * width, C}, recv, map,
                    Block::view(dst.dtype, dst.device, dst.data, shape, 2, nullptr, dst.owner), ctx);
  shard::detail::bump_version(dst.owner);
}

Block NeighborGatherPlan::adjoint(const Block& g, ExecContext& ctx) const {
  SHARD_CHECK(g.rank == 3 && g.shape[0] == n_query && g.shape[1] == width && g.is_contiguous(), "gather_neighbors",
              "gradient {} does not match the plan ({} x {} entries)", g.shape_vec(), n_query, width);
  const index_t C = g.shape[2];
  const index_t U = n_unique();
  const index_t rshape[2] = {U, C}, fshape[2] = {exchange->n_src(), C};
  Block grecv = Block::allocate(g.dtype, ctx.device(), rshape, 2);
  exec::box_zero(grecv, ctx);
  const Block map = index_block(expand, ctx);
  const index_t gshape[2] = {n_query * width, C};
  exec::rows_scatter_add(exec::RowsGeometry{U, n_query * width, C},
                         Block::view(g.dtype, g.device, g.data, gshape, 2, nullptr, g.owner), map, grecv, ctx);
  Block gf = Block::allocate(g.dtype, ctx.device(), fshape, 2);
  exec::box_zero(gf, ctx);
  exchange->adjoint_add(grecv, gf, ctx);
  return gf;
}

}  // namespace shard::detail
