#pragma once
// Shared checks of the kernel-family fronts: every operand on the context's device with the
// front's dtype (f32 or f64; bf16 off the CPU for the attention families) and the geometry's
// shape; the family table for the context's device.
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/runtime/registry.hpp"

namespace shard::exec::detail {

/// The family table for `dev`, after checking that `ctx` runs on `dev` and `dt` is f32 or f64.
template <class Family>
const Family& front_table(const char* op, DType dt, Device dev, const ExecContext& ctx) {
  SHARD_CHECK(ctx.device() == dev, op, "operands on different devices: data on {} but the execution context on {}", dev,
              ctx.device());
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64, op, "dtype {} not supported (f32 and f64 only)", dt);
  return kernels_for<Family>(dev, op);
}

/// front_table for the families whose tables may take bf16 / f16 in place: `dt` is f32, f64, or
/// a storage dtype the device's table takes (Family::takes_storage).
template <class Family>
const Family& storage_table(const char* op, DType dt, Device dev, const ExecContext& ctx) {
  SHARD_CHECK(ctx.device() == dev, op, "operands on different devices: data on {} but the execution context on {}", dev,
              ctx.device());
  const Family& t = kernels_for<Family>(dev, op);
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64 || ((dt == DType::bf16 || dt == DType::f16) && t.takes_storage(dt)),
              op, "dtype {} not supported on {} (f32, f64{})", dt, dev,
              t.takes_storage(DType::bf16) ? ", bf16, f16" : "");
  return t;
}

/// The family table for ctx's device, after checking that `dt` is f32 or f64, or bf16 / f16 off
/// the CPU when `lowp_off_cpu` (the attention families). The caller has checked that every operand
/// is on ctx.device().
template <class Family>
const Family& front_table(const char* op, DType dt, const ExecContext& ctx, bool lowp_off_cpu) {
  const Device dev = ctx.device();
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64 ||
                  (lowp_off_cpu && (dt == DType::bf16 || dt == DType::f16) && !dev.is_cpu()),
              op, "dtype {} not supported on {} ({})", dt, dev,
              lowp_off_cpu ? "f32 and f64; bf16 and f16 on CUDA" : "f32 and f64");
  return kernels_for<Family>(dev, op);
}

/// One operand of a Block front: on the context's device, of dtype `dt`; with numel >= 0 also
/// contiguous with `numel` elements (numel < 0: any strides and shape, checked by the caller).
inline void check_block(const char* op, const char* what, const Block& b, DType dt, index_t numel,
                        const ExecContext& ctx) {
  SHARD_CHECK(b.device == ctx.device(), op,
              "operands on different devices: {} is on {} but the execution context on {}", what, b.device,
              ctx.device());
  SHARD_CHECK(b.dtype == dt, op, "{} has dtype {}, expected {}", what, b.dtype, dt);
  if (numel >= 0)
    SHARD_CHECK(b.is_contiguous() && b.numel() == numel, op,
                "{} must be contiguous with {} elements (shape {}, strides {})", what, numel, b.shape_vec(),
                b.strides_vec());
}

}  // namespace shard::exec::detail
