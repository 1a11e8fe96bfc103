#pragma once
// Pool kernel family (private interface; see include/shardtensor/exec/pool.hpp for the contract).
#include "shardtensor/exec/pool.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct PoolKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::pool;
  virtual ~PoolKernels() = default;
  // native_storage (KernelTable): the table reads and writes bf16 / f16 in place (forward and
  // backward_data), bit for bit the f32 working-copy route (exec/precision.hpp). CPU and CUDA: yes.
  virtual void avg_forward(DType dt, const PoolGeometry& g, const void* x, void* y, ExecContext& ctx) const = 0;
  virtual void avg_backward(DType dt, const PoolGeometry& g, const void* gy, void* gx, ExecContext& ctx) const = 0;
  virtual void max_forward(DType dt, const PoolGeometry& g, const void* x, void* y, std::int64_t* idx,
                           ExecContext& ctx) const = 0;
  virtual void max_backward(DType dt, const PoolGeometry& g, const void* gy, const std::int64_t* idx, void* gx,
                            ExecContext& ctx) const = 0;
};


}  // namespace shard::exec
