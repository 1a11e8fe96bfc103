#pragma once
// Private to src/dist/point*.cpp: the checks shared by every operation that reads a point set's
// coordinates against a box partition (check_in_partition, the routing plan), written once, and
// the small helpers of the point plans.
#include <cstdint>
#include <span>

#include "shardtensor/dist/points.hpp"

namespace shard::detail {

/// Spec-only and block checks (the same outcome on every rank for the spec part): `spec` is a
/// point set on part's mesh with D == part.dim(); `points` a contiguous host [n, D] f32 / f64
/// block of this rank's rows.
void check_points_against(const DistSpec& spec, const Block& points, const BoxPartition& part, const char* op);

/// Calls fn(i, p) for every local row i with its coordinates p (D doubles).
template <class Fn>
void for_each_point(const Block& points, index_t n, index_t D, Fn&& fn) {
  std::vector<double> p(static_cast<std::size_t>(D));
  for (index_t i = 0; i < n; ++i) {
    for (index_t d = 0; d < D; ++d)
      p[static_cast<std::size_t>(d)] = points.dtype == DType::f32
                                           ? static_cast<const float*>(points.data)[i * D + d]
                                           : static_cast<const double*>(points.data)[i * D + d];
    fn(i, p.data());
  }
}

/// One allgather of every rank's count of bad items; throws on every rank when any is > 0, with
/// `what` (e.g. "points outside the partition's domain (or NaN)") and "rank r: n <unit>" per rank.
void agree_none_bad(const CommPtr& comm, std::int64_t bad, const char* op, const char* what, const char* unit);

/// An index vector as a Block on ctx's device (a host view, or a device copy).
Block index_block(std::span<const index_t> v, ExecContext& ctx);

}  // namespace shard::detail
