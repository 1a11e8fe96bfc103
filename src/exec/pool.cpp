// Pool kernel family front: operand checks and device dispatch (see include/shardtensor/exec/pool.hpp).
#include "shardtensor/exec/pool.hpp"

#include "exec/front_util.hpp"
#include "exec/precision.hpp"
#include "exec/pool_kernels.hpp"

namespace shard::exec {

/// Keeps src/exec/pool_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
SHARD_KEEP_CPU_TABLE(pool);

namespace {
/// Elements [lo, lo + len) of a contiguous block (the max-pool indices of a chunk of planes).
Block plane_rows(const Block& b, index_t lo, index_t len) {
  SHARD_CHECK(b.is_contiguous() && lo + len <= b.numel(), "max_pool",
              "indices of shape {} must be contiguous with the output's elements", b.shape_vec());
  return detail::flat_piece(b, lo, len);
}
index_t in_numel(const PoolGeometry& g) { return g.planes * g.in[0] * g.in[1] * g.in[2]; }
index_t out_numel(const PoolGeometry& g) { return g.planes * g.out[0] * g.out[1] * g.out[2]; }
bool empty(const PoolGeometry& g) { return in_numel(g) == 0 || out_numel(g) == 0; }

/// The table, after checking the input-side block `in` (in-plane counts) and the output-side block
/// `out` (out-plane counts) against the geometry; both of `in`'s dtype.
const PoolKernels& table(const char* op, const PoolGeometry& g, const Block& in, index_t in_n, const Block& out,
                         index_t out_n, const ExecContext& ctx) {
  detail::check_block(op, "input", in, in.dtype, in_n, ctx);
  detail::check_block(op, "output", out, in.dtype, out_n, ctx);
  SHARD_CHECK(g.planes >= 0, op, "negative plane count {}", g.planes);
  return detail::front_table<PoolKernels>(op, in.dtype, ctx.device(), ctx);
}
}  // namespace

void avg_pool_forward(const PoolGeometry& g, const Block& x, const Block& y, ExecContext& ctx) {
  if (detail::F32Work::needed(x.dtype, y.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("avg_pool_forward", {x.dtype, y.dtype});
    const index_t pin = in_numel(g) / std::max<index_t>(1, g.planes), pout = out_numel(g) / std::max<index_t>(1, g.planes);
    if (detail::chunked_planes_f32<1, 1>(ctx, g.planes, {&x}, {pin}, {&y}, {pout},
                                         [&](index_t p0, index_t count, const auto& in, const auto& out) {
                                           PoolGeometry gc = g;
                                           gc.planes = count;
                                           avg_pool_forward(gc, in[0], out[0], ctx);
                                           (void)p0;
                                         }))
      return;
    detail::F32Work f(ctx);
    avg_pool_forward(g, f.in(x), f.out(y), ctx);
    return f.finish();
  }
  const auto& k = table("avg_pool_forward", g, x, in_numel(g), y, out_numel(g), ctx);
  if (!empty(g)) k.avg_forward(x.dtype, g, x.data, y.data, ctx);
}

void avg_pool_backward(const PoolGeometry& g, const Block& gy, const Block& gx, ExecContext& ctx) {
  if (detail::F32Work::needed(gy.dtype, gx.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("avg_pool_backward", {gy.dtype, gx.dtype});
    const index_t pin = in_numel(g) / std::max<index_t>(1, g.planes), pout = out_numel(g) / std::max<index_t>(1, g.planes);
    if (detail::chunked_planes_f32<1, 1>(ctx, g.planes, {&gy}, {pout}, {&gx}, {pin},
                                         [&](index_t p0, index_t count, const auto& in, const auto& out) {
                                           PoolGeometry gc = g;
                                           gc.planes = count;
                                           avg_pool_backward(gc, in[0], out[0], ctx);
                                           (void)p0;
                                         }))
      return;
    detail::F32Work f(ctx);
    avg_pool_backward(g, f.in(gy), f.out(gx), ctx);
    return f.finish();
  }
  const auto& k = table("avg_pool_backward", g, gy, out_numel(g), gx, in_numel(g), ctx);
  if (in_numel(g) > 0) k.avg_backward(gy.dtype, g, gy.data, gx.data, ctx);
}

void max_pool_forward(const PoolGeometry& g, const Block& x, const Block& y, const Block& idx, ExecContext& ctx) {
  if (detail::F32Work::needed(x.dtype, y.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("max_pool_forward", {x.dtype, y.dtype});
    const index_t pin = in_numel(g) / std::max<index_t>(1, g.planes), pout = out_numel(g) / std::max<index_t>(1, g.planes);
    if (detail::chunked_planes_f32<1, 1>(ctx, g.planes, {&x}, {pin}, {&y}, {pout},
                                         [&](index_t p0, index_t count, const auto& in, const auto& out) {
                                           PoolGeometry gc = g;
                                           gc.planes = count;
                                           max_pool_forward(gc, in[0], out[0], plane_rows(idx, p0 * pout, count * pout), ctx);
                                         }))
      return;
    detail::F32Work f(ctx);
    max_pool_forward(g, f.in(x), f.out(y), idx, ctx);
    return f.finish();
  }
  const char* op = "max_pool_forward";
  const auto& k = table(op, g, x, in_numel(g), y, out_numel(g), ctx);
  detail::check_block(op, "indices", idx, DType::i64, out_numel(g), ctx);
  if (!empty(g)) k.max_forward(x.dtype, g, x.data, y.data, static_cast<std::int64_t*>(idx.data), ctx);
}

void max_pool_backward(const PoolGeometry& g, const Block& gy, const Block& idx, const Block& gx, ExecContext& ctx) {
  if (detail::F32Work::needed(gy.dtype, gx.dtype)) {  // bf16 / f16 storage: f32 working copies (exec/precision.hpp)
    detail::F32Work::check_same("max_pool_backward", {gy.dtype, gx.dtype});
    const index_t pin = in_numel(g) / std::max<index_t>(1, g.planes), pout = out_numel(g) / std::max<index_t>(1, g.planes);
    if (detail::chunked_planes_f32<1, 1>(ctx, g.planes, {&gy}, {pout}, {&gx}, {pin},
                                         [&](index_t p0, index_t count, const auto& in, const auto& out) {
                                           PoolGeometry gc = g;
                                           gc.planes = count;
                                           max_pool_backward(gc, in[0], plane_rows(idx, p0 * pout, count * pout), out[0], ctx);
                                         }))
      return;
    detail::F32Work f(ctx);
    max_pool_backward(g, f.in(gy), idx, f.out(gx), ctx);
    return f.finish();
  }
  const char* op = "max_pool_backward";
  const auto& k = table(op, g, gy, out_numel(g), gx, in_numel(g), ctx);
  detail::check_block(op, "indices", idx, DType::i64, out_numel(g), ctx);
  if (in_numel(g) > 0)
    k.max_backward(gy.dtype, g, gy.data, static_cast<const std::int64_t*>(idx.data), gx.data, ctx);
}

}  // namespace shard::exec
