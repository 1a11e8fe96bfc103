#pragma once
// The row kernel family's interface (private): src/exec/rows_cpu.cpp (DeviceKind::cpu) and the
// CUDA table. The front has checked dtypes, shapes and devices; blocks are contiguous;
// n_index > 0 and width > 0. Index entries are -1 or valid rows (the CPU table re-checks).
#include "shardtensor/exec/rows.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct RowsKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::rows;
  virtual ~RowsKernels() = default;
  /// dst[i] = index[i] >= 0 ? src[index[i]] : 0; elements of `elem_bytes` bytes (1, 2, 4, 8 or 16).
  virtual void gather(std::size_t elem_bytes, const RowsGeometry& g, const void* src, const index_t* index, void* dst,
                      ExecContext& ctx) const = 0;
  /// dst[index[i]] += src[i]; dt is f32, f64 or i64 (complex types arrive as their real type with
  /// twice the width).
  virtual void scatter_add(DType dt, const RowsGeometry& g, const void* src, const index_t* index, void* dst,
                           ExecContext& ctx) const = 0;
  /// dst[index[i]] = src[i] for index[i] >= 0; elements of `elem_bytes` bytes.
  virtual void scatter(std::size_t elem_bytes, const RowsGeometry& g, const void* src, const index_t* index, void* dst,
                       ExecContext& ctx) const = 0;
};

}  // namespace shard::exec
