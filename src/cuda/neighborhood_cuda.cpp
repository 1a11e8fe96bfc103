// CUDA implementation of the neighbourhood-attention kernel family (kernels/neighborhood.cu
// behind src/kernels_api/neighborhood.hpp), registered for DeviceKind::cuda when shardtensor::cuda
// is linked. fp32, fp64, bf16 and f16 (fp32 accumulation); head dims up to kMaxHeadDim. f16 / bf16
// (ExecSettings::native_low_precision) and f32 under allow_tf32 take the tensor-core kernels
// (kernels/neighborhood_tc.cu) for head dims <= 128.
#include "cuda/family_util.hpp"
#include "exec/neighborhood_kernels.hpp"
#include "kernels_api/neighborhood.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {
namespace {

namespace k = shard::kernels::nbhd;
using cuda_glue::check;

k::Geom geom(const NbhdGeom& g) {
  k::Geom r{};
  r.B = g.B;
  r.H = g.H;
  r.D = g.D;
  r.Dv = g.Dv;
  for (int d = 0; d < 3; ++d) {
    r.nq[d] = g.nq[d];
    r.nk[d] = g.nk[d];
    r.qoff[d] = g.qoff[d];
    r.window[d] = g.window[d];
    r.dilation[d] = g.dilation[d];
    r.valid_lo[d] = g.valid_lo[d];
    r.valid_hi[d] = g.valid_hi[d];
    r.wrap[d] = g.wrap[d] ? 1 : 0;
  }
  r.scale = g.scale;
  return r;
}
k::Operand operand(const NbhdIn& a) { return {a.data, a.sb, {a.ss[0], a.ss[1], a.ss[2]}, a.sh}; }
k::Operand operand(const NbhdOut& a) { return {a.data, a.sb, {a.ss[0], a.ss[1], a.ss[2]}, a.sh}; }
static_assert(k::f32 == 0 && k::f64 == 1 && k::bf16 == 2 && k::f16 == 3, "the storage dtype codes of family_util.hpp");
int code(DType dt) { return cuda_glue::storage_code(dt); }

/// ExecSettings as the launchers' flags (as the attention table's): allow_tf32 lets f32 run on TF32
/// tensor cores; native_low_precision lets bf16 / f16 run on the tensor-core kernels, which round
/// P and dS to the storage type (off: the warp-per-row kernels in the storage type).
int flags(const ExecContext& ctx) {
  const auto& st = ctx.settings();
  return (st.allow_tf32 ? k::kAllowTF32 : 0) | (st.native_low_precision ? k::kLowpTensorCores : 0);
}

void check_head_dims(const NbhdGeom& g, const char* op) {
  SHARD_CHECK(g.D <= k::kMaxHeadDim && g.Dv <= k::kMaxHeadDim, op,
              "head dims {} / {} exceed the CUDA kernel's limit {}", g.D, g.Dv, k::kMaxHeadDim);
}

struct CudaNbhdAttention final : NbhdAttentionKernels {
  // bf16 / f16 natively, forward and backward (fp32 accumulation).
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void forward(DType dt, const NbhdGeom& g, NbhdIn q, NbhdIn kk, NbhdIn v, NbhdOut out, void* lse,
               ExecContext& ctx) const override {
    const char* op = "nbhd_attention_forward (cuda)";
    check_head_dims(g, op);
    const auto s = cuda_glue::enter(ctx, op);
    const int fl = flags(ctx);
    const k::Geom kg = geom(g);
    auto run = [&] { check(k::forward(code(dt), kg, operand(q), operand(kk), operand(v), operand(out), lse, s, fl), op); };
    // profiler rows kernel/nbhd_tc (tensor cores) and kernel/nbhd_rows (warp per row)
    if (k::takes_tensor_cores(code(dt), kg, false, fl)) {
      SHARD_PROFILE_SCOPE("kernel", "nbhd_tc", "forward", &ctx);
      run();
    } else {
      SHARD_PROFILE_SCOPE("kernel", "nbhd_rows", "forward", &ctx);
      run();
    }
  }
  void backward(DType dt, const NbhdGeom& g, NbhdIn q, NbhdIn kk, NbhdIn v, NbhdIn out, NbhdIn dout, const void* lse,
                NbhdOut dq, NbhdOut dk, NbhdOut dv, ExecContext& ctx) const override {
    const char* op = "nbhd_attention_backward (cuda)";
    check_head_dims(g, op);
    const auto s = cuda_glue::enter(ctx, op);
    const auto rows = static_cast<std::size_t>(g.B * g.nq[0] * g.nq[1] * g.nq[2] * g.H);
    const std::size_t acc = dt == DType::f64 ? sizeof(double) : sizeof(float);
    cuda_glue::Scratch<unsigned char> delta(rows * acc, s, op);
    const int fl = flags(ctx);
    const k::Geom kg = geom(g);
    auto run = [&] {
      check(k::backward(code(dt), kg, operand(q), operand(kk), operand(v), operand(out), operand(dout), lse,
                        operand(dq), operand(dk), operand(dv), delta.get(), s, fl),
            op);
    };
    if (k::takes_tensor_cores(code(dt), kg, true, fl)) {
      SHARD_PROFILE_SCOPE("kernel", "nbhd_tc", "backward", &ctx);
      run();
    } else {
      SHARD_PROFILE_SCOPE("kernel", "nbhd_rows", "backward", &ctx);
      run();
    }
  }
};

const CudaNbhdAttention g_cuda_nbhd_attention;

}  // namespace

/// Referenced by the shardtensor::cuda registration anchor so that the linker keeps this file.
extern const int nbhd_attention_cuda_anchor;
const int nbhd_attention_cuda_anchor =
    (register_family(DeviceKind::cuda, KernelFamily::nbhd_attention, &g_cuda_nbhd_attention), 1);

}  // namespace shard::exec
