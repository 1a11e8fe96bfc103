// Resize kernel family front: operand checks and device dispatch (see include/shardtensor/exec/resize.hpp).
// bf16 / f16 go to the table as they are (KernelTable::native_storage; both the CPU and the CUDA
// table compute them in place, bit for bit the f32 working-copy route); a table that does not take
// them refuses them with the dtype named.
#include "shardtensor/exec/resize.hpp"

#include "exec/front_util.hpp"
#include "exec/resize_kernels.hpp"
#include "exec/strided_rows.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

/// Keeps src/exec/resize_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
SHARD_KEEP_CPU_TABLE(resize);

namespace {
index_t in_numel(const ResizeGeometry& g) { return g.planes * g.in_len[0] * g.in_len[1] * g.in_len[2]; }
index_t out_numel(const ResizeGeometry& g) { return g.planes * g.out_len[0] * g.out_len[1] * g.out_len[2]; }
}  // namespace

void resize_forward(const ResizeGeometry& g0, const Block& x, const Block& y, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "resize", "forward", &ctx);
  const char* op = "resize_forward";
  const DType dt = x.dtype;
  const bool dense = x.is_contiguous() || x.numel() == 0;
  if (detail::F32Work::needed(x.dtype, y.dtype)) detail::F32Work::check_same(op, {x.dtype, y.dtype});
  detail::check_block(op, "input", x, dt, -1, ctx);
  SHARD_CHECK(!dense || x.numel() == in_numel(g0), op, "input of shape {} does not hold {} planes of {}", x.shape_vec(),
              g0.planes, g0.in_len);
  detail::check_block(op, "output", y, dt, out_numel(g0), ctx);
  const auto& k = detail::storage_table<ResizeKernels>(op, dt, KernelPass::forward, ctx.device(), ctx);
  if (ctx.device().is_cuda()) check_resize_geometry(op, g0.mode, g0);  // the CPU kernel checks as it builds its taps
  ResizeGeometry g = g0;
  g.x_strided = false;
  if (dense) {
    k.forward(dt, g.mode, g, x.data, y.data, ctx);
    return;
  }
  // A strided [N, C, spatial...] view: its shape must be the geometry's.
  const int S = x.rank - 2;
  bool ok = S >= 1 && S <= 3 && x.shape[0] * x.shape[1] == g.planes;
  for (int d = 0; ok && d < S; ++d) ok = x.shape[static_cast<std::size_t>(2 + d)] == g.in_len[static_cast<std::size_t>(3 - S + d)];
  SHARD_CHECK(ok, op, "strided input of shape {} does not match {} planes of {}", x.shape_vec(), g.planes, g.in_len);
  if (!k.takes_strided_input()) {  // one contiguous copy for tables without strides
    const Block xc = detail::materialize(x, ctx);
    k.forward(dt, g.mode, g, xc.data, y.data, ctx);
    return;
  }
  g.x_strided = true;
  g.channels = x.shape[1];
  g.x_strides = {x.strides[0], x.strides[1], 0, 0, 0};
  for (int d = 0; d < S; ++d) g.x_strides[static_cast<std::size_t>(5 - S + d)] = x.strides[static_cast<std::size_t>(2 + d)];
  k.forward(dt, g.mode, g, x.data, y.data, ctx);
}

void resize_backward(const ResizeGeometry& g, const Block& gy, const Block& gx, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "resize", "backward", &ctx);
  const char* op = "resize_backward";
  if (detail::F32Work::needed(gy.dtype, gx.dtype)) detail::F32Work::check_same(op, {gy.dtype, gx.dtype});
  detail::check_block(op, "output gradient", gy, gy.dtype, out_numel(g), ctx);
  detail::check_block(op, "input gradient", gx, gy.dtype, in_numel(g), ctx);
  const auto& k = detail::storage_table<ResizeKernels>(op, gy.dtype, KernelPass::backward_data, ctx.device(), ctx);
  if (ctx.device().is_cuda()) check_resize_geometry(op, g.mode, g);
  k.backward(gy.dtype, g.mode, g, gy.data, gx.data, ctx);
}

}  // namespace shard::exec
