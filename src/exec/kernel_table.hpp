#pragma once
// The common base of every kernel-family interface (src/exec/<family>_kernels.hpp): the one
// precision question each table answers, for its device (docs/architecture.md, "The op recipe",
// step "precision").
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// One precision question to a table: may it compute `pass` itself on operands stored in the
/// bf16 / f16 dtype `dtype`, on `ctx` (its device, its settings)? `conv`: the problem, for the
/// family whose answer depends on it (the CPU conv engine takes storage dtypes on its direct path
/// only); null for the other families.
struct StorageQuery {
  DType dtype;
  KernelPass pass;
  const ExecContext& ctx;
  const ConvGeometry* conv = nullptr;
};

/// Every kernel table (one per family and device) derives from this.
struct KernelTable {
  virtual ~KernelTable() = default;
  /// True when the table computes q.pass itself with every operand in the storage dtype q.dtype
  /// (bf16 / f16): it reads and writes that dtype in place, with f32 (or wider) arithmetic and
  /// accumulation, each result rounded once. False (the default): the front takes f32 working
  /// copies, calls the table in f32 and narrows the results back (exec/precision.hpp, F32Work).
  /// f32 and f64 are computed natively by every table and never asked about. Asked only through
  /// exec::native_storage (exec/precision.hpp) and detail::native_storage (front_util.hpp).
  virtual bool native_storage(const StorageQuery& q) const {
    (void)q;
    return false;
  }
};

}  // namespace shard::exec
