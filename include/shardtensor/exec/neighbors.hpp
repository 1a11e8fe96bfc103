#pragma once
/// \file neighbors.hpp
/// Neighbour-search kernel family front (issue 17, step 1): the LOCAL k-nearest-neighbour and
/// radius (ball) queries between a query point block and a support point block on
/// ctx.device() (CPU: src/exec/neighbors_cpu.cpp, a nanoflann k-d tree or brute force; CUDA:
/// src/cuda/neighbors_cuda.cpp, brute force, the identical result), and the merge of two
/// neighbour lists (the ring strategy merges the candidates of each support shard into a running
/// list). On CUDA, knn and radius wait for ctx's stream before returning (the NaN check); merge
/// is asynchronous.
///
/// Points are contiguous row-major [N, D] blocks, f32 or f64 (query, support and the distance
/// outputs share one dtype); indices and counts are i64.
///
/// Exact and deterministic, so a sharded search can reproduce the unsharded one bit for bit:
///  - the squared distance of query q and support point s is d2 = sum_{d = 0..D-1} (q[d] - s[d])^2,
///    accumulated left to right in the points' type (no FMA contraction);
///  - neighbour lists are sorted ascending by (d2, index): equal distances are broken by the
///    smaller (global) index. The result is the first `width` entries of ALL support points in
///    that total order, whatever the search structure (the tree only prunes);
///  - lists have a fixed width (k, or max_neighbours) and are padded at the end with index -1
///    and d2 = +inf (k > Ns; fewer than max_neighbours points within r). Padded entries always
///    sort after real ones.
///  - reported indices are the support row plus `index_offset` (a shard's rows become global
///    indices), so lists of disjoint shards merge into the unsharded answer.
/// NaN coordinates are refused (shard::Error from the tables; the front never reads data).
#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// How the CPU table searches: `automatic` picks brute force for small problems (few support
/// points, or too few queries to pay for building a tree) and a k-d tree otherwise; the others
/// force one path (tests, benchmarks). Every method gives the identical result.
enum class NeighborMethod : unsigned char { automatic, tree, brute };

/// kNN: query [n_query, dim], support [n_support, dim] -> indices [n_query, k] (i64) and
/// dist2 [n_query, k] (the points' dtype).
struct KnnGeometry {
  index_t n_query = 0, n_support = 0;
  int dim = 3;
  index_t k = 1;             ///< >= 1; k > n_support pads with -1 / +inf
  index_t index_offset = 0;  ///< >= 0; added to every reported support index
  NeighborMethod method = NeighborMethod::automatic;
};

/// Radius (ball) query: every support point with d2 <= r2, where r2 = radius * radius computed
/// in double and rounded to the points' type (radius = 0 finds exact duplicates). At most
/// max_neighbours per query, the nearest first in (d2, index) order. Output: the fixed padded
/// layout indices [n_query, max_neighbours] (i64), dist2 [n_query, max_neighbours] and
/// counts [n_query] (i64, the valid entries of each row, <= max_neighbours). Fixed rather than
/// CSR: a shard's rows merge with another shard's row by row, and the layout is known before
/// the search (no count pass, no ragged exchange).
struct RadiusGeometry {
  index_t n_query = 0, n_support = 0;
  int dim = 3;
  double radius = 0;           ///< >= 0, not NaN
  index_t max_neighbours = 1;  ///< >= 1
  index_t index_offset = 0;    ///< >= 0
  NeighborMethod method = NeighborMethod::automatic;
};

/// Merge of neighbour lists of width `width` over n_query rows (see neighbors_merge).
struct NeighborMergeGeometry {
  index_t n_query = 0;
  index_t width = 1;  ///< >= 1: k, or max_neighbours
};

/// The k nearest support points of every query point (see the file comment).
void neighbors_knn(const KnnGeometry& g, const Block& query, const Block& support, const Block& indices,
                   const Block& dist2, ExecContext& ctx);

/// The support points within g.radius of every query point, capped at g.max_neighbours.
void neighbors_radius(const RadiusGeometry& g, const Block& query, const Block& support, const Block& indices,
                      const Block& dist2, const Block& counts, ExecContext& ctx);

/// Merges the candidate lists (cand_indices, cand_dist2) into the running lists (indices, dist2),
/// in place: each running row becomes the first `width` entries of the union of the two rows in
/// (d2, index) order, padded with -1 / +inf. Both inputs must be lists as this family writes
/// them (sorted, padding at the end) over DISJOINT support sets (no index in both rows). kNN
/// lists: counts and cand_counts null. Radius lists: both non-null [n_query] i64 blocks, and
/// counts becomes the merged valid count. Blocks: indices/cand_indices [n_query, width] i64,
/// dist2/cand_dist2 [n_query, width] f32 or f64.
void neighbors_merge(const NeighborMergeGeometry& g, const Block& indices, const Block& dist2, const Block* counts,
                     const Block& cand_indices, const Block& cand_dist2, const Block* cand_counts, ExecContext& ctx);

}  // namespace shard::exec
