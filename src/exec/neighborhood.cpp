// Neighbourhood-attention kernel family front: geometry checks and device dispatch (see
// include/shardtensor/exec/neighborhood.hpp).
#include "shardtensor/exec/neighborhood.hpp"

#include "exec/neighborhood_kernels.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {

extern const int* const nbhd_attention_cpu_keep;
const int* const nbhd_attention_cpu_keep = &nbhd_attention_cpu_anchor;

namespace {

const NbhdAttentionKernels& table(const char* op, DType dt, Device dev, const ExecContext& ctx) {
  SHARD_CHECK(ctx.device() == dev, op, "operands on different devices: data on {} but the execution context on {}", dev,
              ctx.device());
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64 || (dt == DType::bf16 && dev.kind != DeviceKind::cpu), op,
              "dtype {} not supported on {} (f32 and f64; bf16 on CUDA)", dt, dev);
  return kernels_for<NbhdAttentionKernels>(dev, op);
}

void check_geom(const char* op, const NbhdGeom& g) {
  SHARD_CHECK(g.B >= 0 && g.H >= 0 && g.D >= 0 && g.Dv >= 0, op, "negative size B={} H={} D={} Dv={}", g.B, g.H, g.D,
              g.Dv);
  for (int d = 0; d < 3; ++d) {
    SHARD_CHECK(g.nq[d] >= 0 && g.nk[d] >= 0, op, "negative block extent in spatial dim {}: nq={} nk={}", d, g.nq[d],
                g.nk[d]);
    SHARD_CHECK(g.window[d] >= 1 && g.dilation[d] >= 1, op, "window {} and dilation {} of spatial dim {} must be >= 1",
                g.window[d], g.dilation[d], d);
    SHARD_CHECK(0 <= g.valid_lo[d] && g.valid_lo[d] <= g.valid_hi[d] && g.valid_hi[d] <= g.nk[d], op,
                "valid key range [{}, {}) of spatial dim {} is not inside the key block [0, {})", g.valid_lo[d],
                g.valid_hi[d], d, g.nk[d]);
    SHARD_CHECK(!g.wrap[d] || (g.qoff[d] == 0 && g.nq[d] == g.nk[d]), op,
                "wrapped spatial dim {} needs the whole dim in both blocks (qoff {} nq {} nk {})", d, g.qoff[d],
                g.nq[d], g.nk[d]);
  }
}

}  // namespace

void nbhd_attention_forward(DType dt, const NbhdGeom& g, NbhdIn q, NbhdIn k, NbhdIn v, NbhdOut out, void* lse,
                            Device dev, ExecContext& ctx) {
  const char* op = "nbhd_attention_forward";
  const auto& t = table(op, dt, dev, ctx);
  check_geom(op, g);
  if (g.B * g.H * g.nq[0] * g.nq[1] * g.nq[2] == 0) return;
  t.forward(dt, g, q, k, v, out, lse, ctx);
}

void nbhd_attention_backward(DType dt, const NbhdGeom& g, NbhdIn q, NbhdIn k, NbhdIn v, NbhdIn out, NbhdIn dout,
                             const void* lse, NbhdOut dq, NbhdOut dk, NbhdOut dv, Device dev, ExecContext& ctx) {
  const char* op = "nbhd_attention_backward";
  const auto& t = table(op, dt, dev, ctx);
  check_geom(op, g);
  // No early return on an empty query block: dk and dv (the key block) are still overwritten.
  t.backward(dt, g, q, k, v, out, dout, lse, dq, dk, dv, ctx);
}

}  // namespace shard::exec
