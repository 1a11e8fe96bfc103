#pragma once
// Shared checks of the kernel-family fronts (norm, pool, resize, gemm): the context must be on the
// operands' device and the dtype a compute type.
#include "exec/registry.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/exec/context.hpp"

namespace shard::exec::detail {

/// The family table for `dev`, after checking that `ctx` runs on `dev` and `dt` is f32 or f64.
template <class Family>
const Family& front_table(const char* op, DType dt, Device dev, const ExecContext& ctx) {
  SHARD_CHECK(ctx.device() == dev, op, "operands on different devices: data on {} but the execution context on {}", dev,
              ctx.device());
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64, op, "dtype {} not supported (f32 and f64 only)", dt);
  return kernels_for<Family>(dev, op);
}

}  // namespace shard::exec::detail
