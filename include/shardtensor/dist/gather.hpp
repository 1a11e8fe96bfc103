#pragma once
/// \file gather.hpp
/// Gather a distributed tensor to one root rank and scatter one back, with O(global) memory on
/// the root only and O(local) on every other rank (no full_tensor() on every rank). Type-erased
/// core; the typed fronts are DistTensor::gather_to / DistTensor::scatter_from.
#include "shardtensor/dist/dist_spec.hpp"
#include "shardtensor/runtime/block.hpp"

namespace shard::detail {

/// The spec with every Partial placement replaced by Replicate (the layouts are kept).
DistSpec without_partials(const DistSpec& spec);

/// True when this rank is the one replica of its box that writes/sends it: coordinate 0 on every
/// mesh dim whose placement is not Shard. (Partial placements must be resolved first.)
bool is_box_writer(const DistSpec& spec, int mesh_rank);

/// Gathers the global tensor of (`spec`, this rank's `local` block) to mesh rank `root`.
/// Partial placements are reduced first (one allreduce of the local block). Ranks then send
/// their boxes to the root one at a time (one replica per box); the root receives each into a
/// staging buffer of the largest box and copies it into place. Returns a contiguous block of
/// the global shape on `local.device` at the root, an empty Block elsewhere. Collective over
/// the mesh. Memory: root global + largest box; others at most twice their local block.
Block gather_to(const DistSpec& spec, const Block& local, int root);

/// The inverse: `full` (significant on mesh rank `root` only: a block of the global shape of
/// `spec`, any strides, any device) is cut into every rank's box of `spec` and sent one box at a
/// time. Partial(sum) placements put the value on coordinate 0 and zeros elsewhere, avg/max/min
/// the value on every rank. Returns this rank's contiguous local block on `dev`. Collective.
Block scatter_from(const DistSpec& spec, const Block& full, int root, DType dt, Device dev);

}  // namespace shard::detail
