// Front of the neighbour-search kernel family: geometry, dtype, shape and device checks, then
// dispatch (include/shardtensor/exec/neighbors.hpp).
#include "shardtensor/exec/neighbors.hpp"

#include <cmath>

#include "exec/front_util.hpp"
#include "exec/neighbors_kernels.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

SHARD_KEEP_CPU_TABLE(neighbors);

namespace {

/// A contiguous [rows, cols] block of dtype dt on ctx's device (exactly rank 2, that shape).
void check_matrix(const char* op, const char* what, const Block& b, DType dt, index_t rows, index_t cols,
                  const ExecContext& ctx) {
  SHARD_CHECK(b.rank == 2 && b.shape[0] == rows && b.shape[1] == cols, op, "{} must have shape [{}, {}], got {}", what,
              rows, cols, b.shape_vec());
  detail::check_block(op, what, b, dt, rows * cols, ctx);
}

/// A contiguous [n] i64 block on ctx's device.
void check_counts(const char* op, const char* what, const Block& b, index_t n, const ExecContext& ctx) {
  SHARD_CHECK(b.rank == 1 && b.shape[0] == n, op, "{} must have shape [{}], got {}", what, n, b.shape_vec());
  detail::check_block(op, what, b, DType::i64, n, ctx);
}

void check_points(const char* op, index_t nq, index_t ns, int dim, index_t offset) {
  SHARD_CHECK(nq >= 0 && ns >= 0, op, "negative point count (n_query {}, n_support {})", nq, ns);
  SHARD_CHECK(dim >= 1, op, "point dimension must be >= 1, got {}", dim);
  SHARD_CHECK(offset >= 0, op, "index_offset must be >= 0, got {}", offset);
}

/// The points' dtype (query's), after checking query and support against the geometry.
DType check_query_support(const char* op, const Block& query, const Block& support, index_t nq, index_t ns, int dim,
                          const ExecContext& ctx) {
  const DType dt = query.dtype;
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64, op, "points must be f32 or f64, got {}", dt);
  SHARD_CHECK(query.rank == 2 && support.rank == 2 && query.shape[1] == support.shape[1], op,
              "query {} and support {} must be [N, D] blocks of the same point dimension D", query.shape_vec(),
              support.shape_vec());
  check_matrix(op, "query", query, dt, nq, dim, ctx);
  check_matrix(op, "support", support, dt, ns, dim, ctx);
  return dt;
}

}  // namespace

void neighbors_knn(const KnnGeometry& g, const Block& query, const Block& support, const Block& indices,
                   const Block& dist2, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "neighbors", "knn", &ctx);
  const char* op = "neighbors_knn";
  check_points(op, g.n_query, g.n_support, g.dim, g.index_offset);
  SHARD_CHECK(g.k >= 1, op, "k must be >= 1, got {}", g.k);
  const DType dt = check_query_support(op, query, support, g.n_query, g.n_support, g.dim, ctx);
  check_matrix(op, "indices", indices, DType::i64, g.n_query, g.k, ctx);
  check_matrix(op, "dist2", dist2, dt, g.n_query, g.k, ctx);
  const auto& t = detail::front_table<NeighborsKernels>(op, dt, ctx.device(), ctx);
  if (g.n_query == 0) return;
  shard::detail::bump_version(indices.owner);
  shard::detail::bump_version(dist2.owner);
  t.knn(dt, g, query.data, support.data, static_cast<index_t*>(indices.data), dist2.data, ctx);
}

void neighbors_radius(const RadiusGeometry& g, const Block& query, const Block& support, const Block& indices,
                      const Block& dist2, const Block& counts, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "neighbors", "radius", &ctx);
  const char* op = "neighbors_radius";
  check_points(op, g.n_query, g.n_support, g.dim, g.index_offset);
  SHARD_CHECK(g.radius >= 0 && std::isfinite(g.radius), op, "radius must be finite and >= 0, got {}", g.radius);
  SHARD_CHECK(g.max_neighbours >= 1, op, "max_neighbours must be >= 1, got {}", g.max_neighbours);
  const DType dt = check_query_support(op, query, support, g.n_query, g.n_support, g.dim, ctx);
  check_matrix(op, "indices", indices, DType::i64, g.n_query, g.max_neighbours, ctx);
  check_matrix(op, "dist2", dist2, dt, g.n_query, g.max_neighbours, ctx);
  check_counts(op, "counts", counts, g.n_query, ctx);
  const auto& t = detail::front_table<NeighborsKernels>(op, dt, ctx.device(), ctx);
  if (g.n_query == 0) return;
  shard::detail::bump_version(indices.owner);
  shard::detail::bump_version(dist2.owner);
  shard::detail::bump_version(counts.owner);
  t.radius(dt, g, query.data, support.data, static_cast<index_t*>(indices.data), dist2.data,
           static_cast<index_t*>(counts.data), ctx);
}

void neighbors_merge(const NeighborMergeGeometry& g, const Block& indices, const Block& dist2, const Block* counts,
                     const Block& cand_indices, const Block& cand_dist2, const Block* cand_counts, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "neighbors", "merge", &ctx);
  const char* op = "neighbors_merge";
  SHARD_CHECK(g.n_query >= 0, op, "negative n_query {}", g.n_query);
  SHARD_CHECK(g.width >= 1, op, "width must be >= 1, got {}", g.width);
  SHARD_CHECK((counts == nullptr) == (cand_counts == nullptr), op,
              "counts and cand_counts must both be given (radius lists) or both null (kNN lists)");
  const DType dt = dist2.dtype;
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64, op, "distances must be f32 or f64, got {}", dt);
  check_matrix(op, "indices", indices, DType::i64, g.n_query, g.width, ctx);
  check_matrix(op, "dist2", dist2, dt, g.n_query, g.width, ctx);
  check_matrix(op, "cand_indices", cand_indices, DType::i64, g.n_query, g.width, ctx);
  check_matrix(op, "cand_dist2", cand_dist2, dt, g.n_query, g.width, ctx);
  if (counts) {
    check_counts(op, "counts", *counts, g.n_query, ctx);
    check_counts(op, "cand_counts", *cand_counts, g.n_query, ctx);
  }
  const auto& t = detail::front_table<NeighborsKernels>(op, dt, ctx.device(), ctx);
  if (g.n_query == 0) return;
  shard::detail::bump_version(indices.owner);
  shard::detail::bump_version(dist2.owner);
  if (counts) shard::detail::bump_version(counts->owner);
  t.merge(dt, g, static_cast<index_t*>(indices.data), dist2.data, counts ? static_cast<index_t*>(counts->data) : nullptr,
          static_cast<const index_t*>(cand_indices.data), cand_dist2.data,
          cand_counts ? static_cast<const index_t*>(cand_counts->data) : nullptr, ctx);
}

}  // namespace shard::exec
