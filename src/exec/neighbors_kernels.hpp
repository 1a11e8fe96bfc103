#pragma once
// The neighbour-search kernel family's interface (private): src/exec/neighbors_cpu.cpp
// (DeviceKind::cpu) and src/cuda/neighbors_cuda.cpp (DeviceKind::cuda; NeighborMethod ignored).
// The front has checked dtypes, shapes, devices and the geometry; blocks are contiguous; `dt` is
// the points' dtype (f32 or f64); n_query > 0.
#include "shardtensor/exec/neighbors.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct NeighborsKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::neighbors;
  virtual ~NeighborsKernels() = default;
  virtual void knn(DType dt, const KnnGeometry& g, const void* query, const void* support, index_t* indices,
                   void* dist2, ExecContext& ctx) const = 0;
  virtual void radius(DType dt, const RadiusGeometry& g, const void* query, const void* support, index_t* indices,
                      void* dist2, index_t* counts, ExecContext& ctx) const = 0;
  /// counts / cand_counts: both null (kNN lists) or both non-null (radius lists).
  virtual void merge(DType dt, const NeighborMergeGeometry& g, index_t* indices, void* dist2, index_t* counts,
                     const index_t* cand_indices, const void* cand_dist2, const index_t* cand_counts,
                     ExecContext& ctx) const = 0;
};

}  // namespace shard::exec
