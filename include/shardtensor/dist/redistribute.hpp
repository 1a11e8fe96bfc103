#pragma once
/// \file redistribute.hpp
/// The type-erased core of DistTensor: moving local blocks between two DistSpecs of one global
/// tensor. The typed front (DistTensor<T,Rank>) calls these with (dtype, pointer, shape, strides).
#include <memory>
#include <vector>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/dist/dist_spec.hpp"

namespace shard::detail {

/// A host block of elements: base pointer, shape and strides (in elements), and its owner.
struct LocalBlock {
  std::shared_ptr<void> storage;  ///< keeps the memory alive (may be null for user views)
  void* data = nullptr;
  std::vector<index_t> shape, strides;
  /// Contiguous block of `shape` freshly allocated on the host.
  static LocalBlock allocate(DType dt, const std::vector<index_t>& shape);
  bool is_contiguous() const;
  index_t numel() const;
};

/// Copies the box `len` at `src_lo` of `src` to `dst_lo` of `dst` (local coordinates).
void copy_box(DType dt, const LocalBlock& src, const std::vector<index_t>& src_lo, const LocalBlock& dst,
              const std::vector<index_t>& dst_lo, const std::vector<index_t>& len);

/// Returns this rank's block under `dst` given its block `in` under `src` (same mesh and global
/// shape). Collective over the mesh when data must move; returns `in` itself when nothing changes.
LocalBlock redistribute(DType dt, const DistSpec& src, const LocalBlock& in, const DistSpec& dst);

/// Which communication `redistribute(src -> dst)` performs, for tests and benchmarks:
/// "none", "local", "allgatherv", "alltoallv", "reduce_scatterv", "allreduce" and combinations.
std::vector<std::string> redistribute_plan(const DistSpec& src, const DistSpec& dst);

}  // namespace shard::detail
