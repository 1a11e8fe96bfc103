#pragma once
// Private to src/dist/point*.cpp: the checks shared by every operation that reads a point set's
// coordinates against a box partition (check_in_partition, the routing plan), written once, and
// the small helpers of the point plans.
#include <cstdint>
#include <span>
#include <vector>

#include "shardtensor/dist/points.hpp"

namespace shard::detail {

/// Spec-only and block checks (the same outcome on every rank for the spec part): `spec` is a
/// point set on part's mesh with D == part.dim(); `points` a contiguous [n, D] f32 / f64
/// block of this rank's rows, on any device.
void check_points_against(const DistSpec& spec, const Block& points, const BoxPartition& part, const char* op);

/// The owners of this rank's points under `part` (points: part.dim() coordinates per row, on
/// ctx's device), on ctx's device through the points family (exec/points.hpp points_owner): writes
/// `*owner` [n] (i64) when given and returns the per-rank counts with the outside / NaN count last
/// (ranks + 1 values: the only bytes that reach the host).
std::vector<index_t> point_owners(const BoxPartition& part, const Block& points, const Block* owner,
                                  ExecContext& ctx);

/// One allgather of every rank's count of bad items; throws on every rank when any is > 0, with
/// `what` (e.g. "points outside the partition's domain (or NaN)") and "rank r: n <unit>" per rank.
void agree_none_bad(const CommPtr& comm, std::int64_t bad, const char* op, const char* what, const char* unit);

/// An index vector as a Block on ctx's device (a host view, or a device copy).
Block index_block(std::span<const index_t> v, ExecContext& ctx);

}  // namespace shard::detail
