#pragma once
// Kernel firewall of the attention family (kernels/attention.cu): plain C++17, no shardtensor
// headers. Launchers enqueue on `stream` (a cudaStream_t), return a cudaError_t code (0 =
// success) and do not synchronise. Device pointers. dtype: 0 float, 1 double, 2 bfloat16, 3 half
// (float accumulation; lse in float for float, bfloat16 and half, double for double). Semantics and operand
// layout as include/shardtensor/exec/attention.hpp; head dims D, Dv <= kMaxHeadDim.
#include <cstddef>
#include <cstdint>

namespace shard::kernels::attention {

using idx = std::int64_t;

constexpr idx kMaxHeadDim = 256;

struct Geom {
  idx B, H, Nq, Nk, D, Dv;
};
/// Strided [B, H, N, D] operand (element strides; d stride 1).
struct In {
  const void* p;
  idx sb, sh, sn;
};
struct Out {
  void* p;
  idx sb, sh, sn;
};
struct Mask {
  double scale;
  int causal;
  idx q_pos0, k_pos0;
  const void* bias;  ///< [B, H, Nq, Nk] strided in the operands' dtype, or null
  idx bias_sb, bias_sh, bias_sq, bias_sk;
};

/// Bits of the launchers' `flags`.
constexpr int kAllowTF32 = 1;        ///< f32 may run on TF32 tensor cores (ExecSettings::allow_tf32)
constexpr int kLowpTensorCores = 2;  ///< bf16 / f16 may run on the tensor cores, which round P and dS to
                                     ///< the storage type (ExecSettings::native_low_precision); without
                                     ///< it they take the SIMT kernels, within one ulp of the f32 route

/// out, lse (see the contract).
int forward(int dtype, const Geom& g, In q, In k, In v, const Mask& m, Out out, void* lse, void* stream,
            int flags = 0);
/// Bytes of device scratch `backward` needs (the per-query delta = dout . out).
std::size_t backward_scratch_bytes(int dtype, const Geom& g);
/// Adds dq, dk, dv (each may have a null pointer). `scratch` has backward_scratch_bytes bytes.
int backward(int dtype, const Geom& g, In q, In k, In v, In out, In dout, const void* lse, const Mask& m, Out dq,
             Out dk, Out dv, void* scratch, void* stream, int flags = 0);
/// The kernel set a forward (backward = false) or a backward with dq / dk-or-dv wanted runs on the
/// current device (for the CUDA table's profiler rows):
///  - kTensorCores: wmma kernels (with kLowpTensorCores: f16 on compute capability 7.0+, bf16 on
///    8.0+; with kAllowTF32: f32 on 8.0+; head dims <= 128; SHARDTENSOR_ATTENTION_TC not 0; shared memory granted);
///  - kTiled: SIMT register-blocked kernels (float accumulation, head dims <= 128,
///    SHARDTENSOR_ATTENTION_TILED not 0, shared memory granted);
///  - kRowKernels: one thread per row (f64, head dims above 128, or what the others decline).
enum KernelSet : int { kRowKernels = 0, kTiled = 1, kTensorCores = 2 };
int kernel_set(int dtype, const Geom& g, bool backward, bool dq, bool dkv, int flags = 0);
/// Log-sum-exp merge of (out_b, lse_b) into (out, lse).
int merge(int dtype, const Geom& g, Out out, void* lse, In out_b, const void* lse_b, void* stream);

}  // namespace shard::kernels::attention
