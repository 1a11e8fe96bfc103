// CUDA implementation of the attention kernel family (kernels/attention.cu behind
// src/kernels_api/attention.hpp), registered for DeviceKind::cuda when shardtensor::cuda is linked.
// f32, f64, bf16 and f16 (float accumulation, float lse); head dims up to 256.
// bf16 / f16 forward and backward go to cuDNN's fused attention first (src/cuda/attention_cudnn.cpp;
// which calls qualify: src/cuda/attention_cudnn_select.hpp); what it declines runs on our kernels:
// the tensor-core (wmma) ones for f16 / bf16, and for f32 when ExecSettings::allow_tf32 is set
// (TF32), else the SIMT tiled or row kernels (kernels/attention.cu, kernels/attention_tc.cu).
// ExecSettings::native_low_precision = false keeps bf16 / f16 off cuDNN and the tensor cores.
#include "cuda/attention_cudnn.hpp"
#include "cuda/family_util.hpp"
#include "exec/attention_kernels.hpp"
#include "kernels_api/attention.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {
namespace {

namespace ka = shard::kernels::attention;
using cuda_glue::check;

int code(DType dt) { return cuda_glue::storage_code(dt); }
ka::Geom geom(const AttnGeom& g) { return {g.B, g.H, g.Nq, g.Nk, g.D, g.Dv}; }
ka::In in(AttnIn x) { return {x.data, x.sb, x.sh, x.sn}; }
ka::Out outp(AttnOut x) { return {x.data, x.sb, x.sh, x.sn}; }
ka::Mask mask(const AttnMask& m) {
  return {m.scale, m.causal ? 1 : 0, m.q_pos0, m.k_pos0, m.bias, m.bias_sb, m.bias_sh, m.bias_sq, m.bias_sk};
}
/// ExecSettings as the launchers' flags: allow_tf32 lets f32 run on TF32 tensor cores;
/// native_low_precision lets bf16 / f16 run on cuDNN's fused attention and our tensor-core kernels,
/// which round P and dS to the storage type (off: the SIMT kernels, within one ulp of the f32 route).
int flags(const ExecContext& ctx) {
  const auto& st = ctx.settings();
  return (st.allow_tf32 ? ka::kAllowTF32 : 0) | (st.native_low_precision ? ka::kLowpTensorCores : 0);
}
/// Runs `run` under the profiler row of the kernel set it takes: kernel/attention_tc (tensor
/// cores), kernel/attention_tiled or kernel/attention_rows (the sites need literal names).
#define SHARD_ATTN_PROFILED(set, pass, ctx, ...)          \
  do {                                                    \
    if ((set) == ka::kTensorCores) {                      \
      SHARD_PROFILE_SCOPE("kernel", "attention_tc", pass, &(ctx));    \
      __VA_ARGS__;                                        \
    } else if ((set) == ka::kTiled) {                     \
      SHARD_PROFILE_SCOPE("kernel", "attention_tiled", pass, &(ctx)); \
      __VA_ARGS__;                                        \
    } else {                                              \
      SHARD_PROFILE_SCOPE("kernel", "attention_rows", pass, &(ctx));  \
      __VA_ARGS__;                                        \
    }                                                     \
  } while (0)
void check_geom(const AttnGeom& g, const char* op) {
  SHARD_CHECK(g.D <= ka::kMaxHeadDim && g.Dv <= ka::kMaxHeadDim, op,
              "head dims D={} Dv={} exceed the CUDA kernel's limit {}", g.D, g.Dv, ka::kMaxHeadDim);
  SHARD_CHECK(g.B <= 65535 && g.H <= 65535, op, "B={} or H={} exceeds the CUDA grid limit 65535", g.B, g.H);
}

struct CudaAttention final : AttentionKernels {
  // bf16 / f16 natively, every pass (cuDNN's fused attention or our kernels; float accumulation).
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void forward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, const AttnMask& m, AttnOut out, void* lse,
               ExecContext& ctx) const override {
    const char* op = "attention_forward (cuda)";
    check_geom(g, op);
    if (ctx.settings().native_low_precision && cudnn_attention::try_forward(dt, g, q, k, v, m, out, lse, ctx)) return;
    const auto s = cuda_glue::enter(ctx, op);
    const int fl = flags(ctx);
    auto run = [&] { check(ka::forward(code(dt), geom(g), in(q), in(k), in(v), mask(m), outp(out), lse, s, fl), op); };
    SHARD_ATTN_PROFILED(ka::kernel_set(code(dt), geom(g), false, false, false, fl), "forward", ctx, run());
  }
  void backward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, AttnIn out, AttnIn dout, const void* lse,
                const AttnMask& m, AttnOut dq, AttnOut dk, AttnOut dv, ExecContext& ctx) const override {
    const char* op = "attention_backward (cuda)";
    check_geom(g, op);
    if (ctx.settings().native_low_precision &&
        cudnn_attention::try_backward(dt, g, q, k, v, out, dout, lse, m, dq, dk, dv, ctx))
      return;
    const auto s = cuda_glue::enter(ctx, op);
    cuda_glue::Scratch<char> delta(ka::backward_scratch_bytes(code(dt), geom(g)), s, op);
    const int fl = flags(ctx);
    const int set = ka::kernel_set(code(dt), geom(g), true, dq.data != nullptr, dk.data != nullptr || dv.data != nullptr, fl);
    auto run = [&] {
      check(ka::backward(code(dt), geom(g), in(q), in(k), in(v), in(out), in(dout), lse, mask(m), outp(dq), outp(dk),
                         outp(dv), delta.get(), s, fl),
            op);
    };
    SHARD_ATTN_PROFILED(set, "backward", ctx, run());
  }
  void merge(DType dt, const AttnGeom& g, AttnOut out, void* lse, AttnIn out_b, const void* lse_b,
             ExecContext& ctx) const override {
    const char* op = "attention_merge (cuda)";
    const auto s = cuda_glue::enter(ctx, op);
    check(ka::merge(code(dt), geom(g), outp(out), lse, in(out_b), lse_b, s), op);
  }
};

const CudaAttention g_cuda_attention;

}  // namespace

/// Referenced by the shardtensor::cuda registration anchor so that the linker keeps this file.
extern const int attention_cuda_anchor;
const int attention_cuda_anchor =
    (register_family(DeviceKind::cuda, KernelFamily::attention, &g_cuda_attention), 1);

}  // namespace shard::exec
