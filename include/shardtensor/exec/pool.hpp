#pragma once
/// \file pool.hpp
/// Pool kernel family front: average and max pooling forward and backward on contiguous
/// [planes, in...] blocks (3 spatial dims; leading extents 1 for 1-D and 2-D pooling), on the
/// device of the data (CPU: src/exec/pool_cpu.cpp; CUDA: kernels/pool.cu). Semantics as
/// nn/functional/pool_local.hpp: explicit padding per side, padded cells never selected by max and counted
/// by avg only with count_include_pad; max's argmax is a flat index into the input plane.
/// Backward passes gather (each input cell sums over the outputs that read it, in output order):
/// deterministic on every device.
#include <array>
#include <cstdint>
#include <limits>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// `PoolGeometry::pad_end` value meaning "no clipping" (the default: the divisor is the kernel).
inline constexpr index_t kPoolNoClip = std::numeric_limits<index_t>::max() / 4;

/// Pooling as seen by the type-erased kernels: `planes` = N * C independent planes, 3 spatial
/// dims (leading extents 1 for S < 3). Output o's window starts at o * stride - pad_lo (relative
/// to the block's first cell) and is clipped to [0, in) for the values.
struct PoolGeometry {
  index_t planes = 1;
  std::array<index_t, 3> in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1}, stride{1, 1, 1}, pad_lo{0, 0, 0};
  bool count_include_pad = true;
  /// End of the padded domain (input + high padding) relative to the block's first cell, per
  /// dim: with count_include_pad the avg divisor is the window clipped to it (PyTorch's
  /// ceil_mode rule: the last window may run past the padding). kPoolNoClip (default): the
  /// divisor is the kernel volume.
  std::array<index_t, 3> pad_end{kPoolNoClip, kPoolNoClip, kPoolNoClip};
};

/// y[planes, out] = average pooling of x[planes, in]. x and y contiguous, of one dtype (f32, f64,
/// or bf16 / f16: read and written in place, sums in double (max's gradient in float), each result
/// rounded once more to the storage type: bit for bit the f32 op on the widened values, rounded),
/// on the context's device, with the geometry's element counts.
void avg_pool_forward(const PoolGeometry& g, const Block& x, const Block& y, ExecContext& ctx);
/// gx[planes, in] = adjoint of avg_pool_forward applied to gy[planes, out] (overwrites gx).
void avg_pool_backward(const PoolGeometry& g, const Block& gy, const Block& gx, ExecContext& ctx);
/// y[planes, out] = max pooling of x, idx (i64, y's element count) = flat input-plane index of each
/// max (ties: first in window order; NaN wins over numbers).
void max_pool_forward(const PoolGeometry& g, const Block& x, const Block& y, const Block& idx, ExecContext& ctx);
/// gx[planes, in] = gy added at the argmax positions idx (overwrites gx).
void max_pool_backward(const PoolGeometry& g, const Block& gy, const Block& idx, const Block& gx, ExecContext& ctx);

}  // namespace shard::exec
