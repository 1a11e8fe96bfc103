// Front of the spectral kernel family: dtype, shape and device checks, then dispatch.
#include "shardtensor/exec/spectral.hpp"

#include "exec/front_util.hpp"
#include "exec/spectral_kernels.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

SHARD_KEEP_CPU_TABLE(spectral);

namespace {

DType precision(const char* op, const Block& x) {
  SHARD_CHECK(x.dtype == DType::c64 || x.dtype == DType::c128, op, "needs complex blocks (c64 or c128), got {}",
              x.dtype);
  return x.dtype == DType::c64 ? DType::f32 : DType::f64;
}

void check_geometry(const char* op, const SpectralGeometry& g) {
  SHARD_CHECK(g.batch >= 0 && g.cin >= 0 && g.cout >= 0 && g.modes >= 0, op,
              "negative extent (batch {}, cin {}, cout {}, modes {})", g.batch, g.cin, g.cout, g.modes);
}

}  // namespace

void spectral_mul_forward(const SpectralGeometry& g, const Block& x, const Block& w, const Block& y, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "spectral", "forward", &ctx);
  const char* op = "spectral_mul_forward";
  check_geometry(op, g);
  const DType real = precision(op, x);
  detail::check_block(op, "x", x, x.dtype, g.batch * g.cin * g.modes, ctx);
  detail::check_block(op, "w", w, x.dtype, g.cin * g.cout * g.modes, ctx);
  detail::check_block(op, "y", y, x.dtype, g.batch * g.cout * g.modes, ctx);
  const auto& t = detail::front_table<SpectralKernels>(op, real, ctx.device(), ctx);
  if (y.numel() == 0) return;
  shard::detail::bump_version(y.owner);
  t.forward(real, g, x.data, w.data, y.data, ctx);
}

void spectral_mul_backward(const SpectralGeometry& g, const Block& x, const Block& w, const Block& gy, const Block* gx,
                           const Block* gw, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "spectral", "backward", &ctx);
  const char* op = "spectral_mul_backward";
  check_geometry(op, g);
  const DType real = precision(op, x);
  detail::check_block(op, "x", x, x.dtype, g.batch * g.cin * g.modes, ctx);
  detail::check_block(op, "w", w, x.dtype, g.cin * g.cout * g.modes, ctx);
  detail::check_block(op, "gy", gy, x.dtype, g.batch * g.cout * g.modes, ctx);
  if (gx) detail::check_block(op, "gx", *gx, x.dtype, g.batch * g.cin * g.modes, ctx);
  if (gw) detail::check_block(op, "gw", *gw, x.dtype, g.cin * g.cout * g.modes, ctx);
  const auto& t = detail::front_table<SpectralKernels>(op, real, ctx.device(), ctx);
  if (gx) shard::detail::bump_version(gx->owner);
  if (gw) shard::detail::bump_version(gw->owner);
  t.backward(real, g, x.data, w.data, gy.data, gx ? gx->data : nullptr, gw ? gw->data : nullptr, ctx);
}

}  // namespace shard::exec
