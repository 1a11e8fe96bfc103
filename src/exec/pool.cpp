// Pool kernel family front: operand checks and device dispatch (see include/shardtensor/exec/pool.hpp).
// bf16 / f16 go to the table as they are (KernelTable::native_storage; both the CPU and the CUDA
// table compute them in place, bit for bit the f32 working-copy route); a table that does not take
// them refuses them with the dtype named.
#include "shardtensor/exec/pool.hpp"

#include "exec/front_util.hpp"
#include "exec/pool_kernels.hpp"
#include "shardtensor/exec/precision.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

/// Keeps src/exec/pool_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
SHARD_KEEP_CPU_TABLE(pool);

namespace {
index_t in_numel(const PoolGeometry& g) { return g.planes * g.in[0] * g.in[1] * g.in[2]; }
index_t out_numel(const PoolGeometry& g) { return g.planes * g.out[0] * g.out[1] * g.out[2]; }
bool empty(const PoolGeometry& g) { return in_numel(g) == 0 || out_numel(g) == 0; }

/// The table, after checking the input-side block `in` (in-plane counts) and the output-side block
/// `out` (out-plane counts) against the geometry; both of `in`'s dtype.
const PoolKernels& pool_table(const char* op, KernelPass pass, const PoolGeometry& g, const Block& in, index_t in_n,
                              const Block& out, index_t out_n, const ExecContext& ctx) {
  if (detail::F32Work::needed(in.dtype, out.dtype)) detail::F32Work::check_same(op, {in.dtype, out.dtype});
  detail::check_block(op, "input", in, in.dtype, in_n, ctx);
  detail::check_block(op, "output", out, in.dtype, out_n, ctx);
  SHARD_CHECK(g.planes >= 0, op, "negative plane count {}", g.planes);
  return detail::storage_table<PoolKernels>(op, in.dtype, pass, ctx.device(), ctx);
}
}  // namespace

void avg_pool_forward(const PoolGeometry& g, const Block& x, const Block& y, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pool", "avg_forward", &ctx);
  const auto& k = pool_table("avg_pool_forward", KernelPass::forward, g, x, in_numel(g), y, out_numel(g), ctx);
  if (!empty(g)) k.avg_forward(x.dtype, g, x.data, y.data, ctx);
}

void avg_pool_backward(const PoolGeometry& g, const Block& gy, const Block& gx, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pool", "avg_backward", &ctx);
  const auto& k = pool_table("avg_pool_backward", KernelPass::backward_data, g, gy, out_numel(g), gx, in_numel(g), ctx);
  if (in_numel(g) > 0) k.avg_backward(gy.dtype, g, gy.data, gx.data, ctx);
}

void max_pool_forward(const PoolGeometry& g, const Block& x, const Block& y, const Block& idx, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pool", "max_forward", &ctx);
  const char* op = "max_pool_forward";
  const auto& k = pool_table(op, KernelPass::forward, g, x, in_numel(g), y, out_numel(g), ctx);
  detail::check_block(op, "indices", idx, DType::i64, out_numel(g), ctx);
  if (!empty(g)) k.max_forward(x.dtype, g, x.data, y.data, static_cast<std::int64_t*>(idx.data), ctx);
}

void max_pool_backward(const PoolGeometry& g, const Block& gy, const Block& idx, const Block& gx, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "pool", "max_backward", &ctx);
  const char* op = "max_pool_backward";
  const auto& k = pool_table(op, KernelPass::backward_data, g, gy, out_numel(g), gx, in_numel(g), ctx);
  detail::check_block(op, "indices", idx, DType::i64, out_numel(g), ctx);
  if (in_numel(g) > 0)
    k.max_backward(gy.dtype, g, gy.data, static_cast<const std::int64_t*>(idx.data), gx.data, ctx);
}

}  // namespace shard::exec
