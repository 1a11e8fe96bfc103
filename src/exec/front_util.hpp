#pragma once
// Shared checks of the kernel-family fronts (norm, pool, resize, gemm, attention, nbhd_attention):
// the context must be on the operands' device and the dtype a compute type.
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

/// The family table for ctx's device, after checking that `dt` is f32 or f64, or bf16 off the CPU
/// when `bf16_off_cpu` (the attention families). The caller has checked that every operand is on
/// ctx.device().
template <class Family>
const Family& front_table(const char* op, DType dt, const ExecContext& ctx, bool bf16_off_cpu) {
  const Device dev = ctx.device();
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64 || (bf16_off_cpu && dt == DType::bf16 && !dev.is_cpu()), op,
              "dtype {} not supported on {} ({})", dt, dev, bf16_off_cpu ? "f32 and f64; bf16 on CUDA" : "f32 and f64");
  return kernels_for<Family>(dev, op);
}

}  // namespace shard::exec::detail
