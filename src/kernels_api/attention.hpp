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

/// out, lse (see the contract).
int forward(int dtype, const Geom& g, In q, In k, In v, const Mask& m, Out out, void* lse, void* stream);
/// Bytes of device scratch `backward` needs (the per-query delta = dout . out).
std::size_t backward_scratch_bytes(int dtype, const Geom& g);
/// Adds dq, dk, dv (each may have a null pointer). `scratch` has backward_scratch_bytes bytes.
int backward(int dtype, const Geom& g, In q, In k, In v, In out, In dout, const void* lse, const Mask& m, Out dq,
             Out dk, Out dv, void* scratch, void* stream);
/// Whether forward (backward = false) or backward with dq / dk-or-dv wanted runs the tiled kernels
/// (float accumulation, head dims <= 128, SHARDTENSOR_ATTENTION_TILED not 0, the current device
/// grants their shared memory) rather than the row kernels; for the CUDA table's profiler rows.
bool takes_tiled(int dtype, const Geom& g, bool backward, bool dq, bool dkv);
/// Log-sum-exp merge of (out_b, lse_b) into (out, lse).
int merge(int dtype, const Geom& g, Out out, void* lse, In out_b, const void* lse_b, void* stream);

}  // namespace shard::kernels::attention
