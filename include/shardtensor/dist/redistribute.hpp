#pragma once
/// \file redistribute.hpp
/// The type-erased core of DistTensor: moving local blocks between two DistSpecs of one global
/// tensor. The typed front (DistTensor<T,Rank>) calls these with Blocks (exec/block.hpp).
#include <string>
#include <vector>

#include "shardtensor/dist/dist_spec.hpp"
#include "shardtensor/exec/block.hpp"

namespace shard::detail {

/// Returns this rank's block under `dst` given its block `in` under `src` (same mesh and global
/// shape). Collective over the mesh when data must move; returns `in` itself when nothing changes.
Block redistribute(const DistSpec& src, const Block& in, const DistSpec& dst);

/// Which communication `redistribute(src -> dst)` performs, for tests and benchmarks:
/// "none", "local", "allgatherv", "alltoallv", "reduce_scatterv", "allreduce" and combinations.
std::vector<std::string> redistribute_plan(const DistSpec& src, const DistSpec& dst);

}  // namespace shard::detail
