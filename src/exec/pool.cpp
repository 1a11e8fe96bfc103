// Pool kernel family front: device dispatch (see include/shardtensor/exec/pool.hpp).
#include "shardtensor/exec/pool.hpp"

#include "exec/front_util.hpp"
#include "exec/pool_kernels.hpp"

namespace shard::exec {

/// Keeps src/exec/pool_cpu.cpp (and its registrar) in every link of the front: an external
/// definition the compiler must emit, whose initialiser references the CPU anchor.
extern const int* const pool_cpu_keep;
const int* const pool_cpu_keep = &pool_cpu_anchor;

namespace {
const PoolKernels& table(const char* op, DType dt, Device dev, const ExecContext& ctx) {
  return detail::front_table<PoolKernels>(op, dt, dev, ctx);
}
bool empty(const PoolGeometry& g) {
  return g.planes == 0 || g.out[0] * g.out[1] * g.out[2] == 0 || g.in[0] * g.in[1] * g.in[2] == 0;
}
}  // namespace

void avg_pool_forward(DType dt, const PoolGeometry& g, const void* x, void* y, Device dev, ExecContext& ctx) {
  const auto& k = table("avg_pool_forward", dt, dev, ctx);
  if (!empty(g)) k.avg_forward(dt, g, x, y, ctx);
}

void avg_pool_backward(DType dt, const PoolGeometry& g, const void* gy, void* gx, Device dev, ExecContext& ctx) {
  const auto& k = table("avg_pool_backward", dt, dev, ctx);
  if (g.planes * g.in[0] * g.in[1] * g.in[2] > 0) k.avg_backward(dt, g, gy, gx, ctx);
}

void max_pool_forward(DType dt, const PoolGeometry& g, const void* x, void* y, std::int64_t* idx, Device dev,
                      ExecContext& ctx) {
  const auto& k = table("max_pool_forward", dt, dev, ctx);
  if (!empty(g)) k.max_forward(dt, g, x, y, idx, ctx);
}

void max_pool_backward(DType dt, const PoolGeometry& g, const void* gy, const std::int64_t* idx, void* gx, Device dev,
                       ExecContext& ctx) {
  const auto& k = table("max_pool_backward", dt, dev, ctx);
  if (g.planes * g.in[0] * g.in[1] * g.in[2] > 0) k.max_backward(dt, g, gy, idx, gx, ctx);
}

}  // namespace shard::exec
