#pragma once
// Shared checks of the kernel-family fronts: every operand on the context's device with the
// front's dtype (f32 or f64; bf16 / f16 where the table computes them natively) and the
// geometry's shape; the family table for the context's device; the precision decision.
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec::detail {

/// The family table for `dev`, after checking that `ctx` runs on `dev` and `dt` is f32 or f64.
template <class Family>
const Family& front_table(const char* op, DType dt, Device dev, const ExecContext& ctx) {
  SHARD_CHECK(ctx.device() == dev, op, "operands on different devices: data on {} but the execution context on {}", dev,
              ctx.device());
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64, op, "dtype {} not supported (f32 and f64 only)", dt);
  return kernels_for<Family>(dev, op);
}

/// The precision decision of every front (the one place it is made; exec::native_storage asks
/// it for callers above exec): true when table `t` computes `pass` itself on operands stored in
/// `dt`. f32 / f64 (and the non-float dtypes, which the tables check themselves) always; bf16 /
/// f16 when the table says so (KernelTable::native_storage), else the front widens them to f32
/// working copies (F32Work) and narrows the results back.
inline bool native_storage(const KernelTable& t, DType dt, KernelPass pass, const ExecContext& ctx,
                           const ConvGeometry* conv = nullptr) {
  return !is_low_precision(dt) || t.native_storage(StorageQuery{dt, pass, ctx, conv});
}

/// front_table for operands that reach the table in their own dtype: `dt` is f32, f64, or a
/// storage dtype the device's table computes natively for `pass` (native_storage above).
template <class Family>
const Family& storage_table(const char* op, DType dt, KernelPass pass, Device dev, const ExecContext& ctx) {
  SHARD_CHECK(ctx.device() == dev, op, "operands on different devices: data on {} but the execution context on {}", dev,
              ctx.device());
  const Family& t = kernels_for<Family>(dev, op);
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64 || (is_low_precision(dt) && native_storage(t, dt, pass, ctx)), op,
              "dtype {} not supported on {} (f32, f64{})", dt, dev,
              native_storage(t, DType::bf16, pass, ctx) ? ", bf16, f16" : "");
  return t;
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
