#pragma once
// Pool kernel family (private interface; see include/shardtensor/exec/pool.hpp for the contract).
#include "shardtensor/exec/pool.hpp"
#include "shardtensor/runtime/registry.hpp"

namespace shard::exec {

struct PoolKernels {
  static constexpr KernelFamily id = KernelFamily::pool;
  virtual ~PoolKernels() = default;
  /// True when the table reads and writes bf16 / f16 dtype `dt` in place, bit for bit the f32
  /// working-copy route (exec/precision.hpp), which the front takes otherwise.
  virtual bool takes_storage(DType /*dt*/) const { return false; }
  virtual void avg_forward(DType dt, const PoolGeometry& g, const void* x, void* y, ExecContext& ctx) const = 0;
  virtual void avg_backward(DType dt, const PoolGeometry& g, const void* gy, void* gx, ExecContext& ctx) const = 0;
  virtual void max_forward(DType dt, const PoolGeometry& g, const void* x, void* y, std::int64_t* idx,
                           ExecContext& ctx) const = 0;
  virtual void max_backward(DType dt, const PoolGeometry& g, const void* gy, const std::int64_t* idx, void* gx,
                            ExecContext& ctx) const = 0;
};


}  // namespace shard::exec
