// Attention kernel family front: size checks and device dispatch (see
// include/shardtensor/exec/attention.hpp).
#include "shardtensor/exec/attention.hpp"

#include "exec/attention_kernels.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {

extern const int* const attention_cpu_keep;
const int* const attention_cpu_keep = &attention_cpu_anchor;

namespace {

const AttentionKernels& table(const char* op, DType dt, Device dev, const ExecContext& ctx) {
  SHARD_CHECK(ctx.device() == dev, op, "operands on different devices: data on {} but the execution context on {}", dev,
              ctx.device());
  SHARD_CHECK(dt == DType::f32 || dt == DType::f64 || (dt == DType::bf16 && dev.kind != DeviceKind::cpu), op,
              "dtype {} not supported on {} (f32 and f64; bf16 on CUDA)", dt, dev);
  return kernels_for<AttentionKernels>(dev, op);
}

void check_geom(const char* op, const AttnGeom& g) {
  SHARD_CHECK(g.B >= 0 && g.H >= 0 && g.Nq >= 0 && g.Nk >= 0 && g.D >= 0 && g.Dv >= 0, op,
              "negative size B={} H={} Nq={} Nk={} D={} Dv={}", g.B, g.H, g.Nq, g.Nk, g.D, g.Dv);
}

bool empty_rows(const AttnGeom& g) { return g.B == 0 || g.H == 0 || g.Nq == 0; }

}  // namespace

void attention_forward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, const AttnMask& m, AttnOut out,
                       void* lse, Device dev, ExecContext& ctx) {
  const char* op = "attention_forward";
  const auto& t = table(op, dt, dev, ctx);
  check_geom(op, g);
  if (empty_rows(g)) return;
  t.forward(dt, g, q, k, v, m, out, lse, ctx);
}

void attention_backward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, AttnIn out, AttnIn dout,
                        const void* lse, const AttnMask& m, AttnOut dq, AttnOut dk, AttnOut dv, Device dev,
                        ExecContext& ctx) {
  const char* op = "attention_backward";
  const auto& t = table(op, dt, dev, ctx);
  check_geom(op, g);
  if (empty_rows(g) || g.Nk == 0) return;
  t.backward(dt, g, q, k, v, out, dout, lse, m, dq, dk, dv, ctx);
}

void attention_merge(DType dt, const AttnGeom& g, AttnOut out, void* lse, AttnIn out_b, const void* lse_b, Device dev,
                     ExecContext& ctx) {
  const char* op = "attention_merge";
  const auto& t = table(op, dt, dev, ctx);
  check_geom(op, g);
  if (empty_rows(g)) return;
  t.merge(dt, g, out, lse, out_b, lse_b, ctx);
}

}  // namespace shard::exec
