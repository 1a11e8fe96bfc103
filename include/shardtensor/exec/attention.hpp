#pragma once
/// \file attention.hpp
/// Attention kernel family front: scaled dot-product attention of one local block, forward
/// (output + per-query log-sum-exp), backward (from q, k, v, the final out and lse, dout) and the
/// log-sum-exp merge of partial results that ring attention uses, on the device of the operands
/// (CPU: src/exec/attention_cpu.cpp; CUDA: kernels/attention.cu).
///
/// Operands are strided views of [B, H, N, D] (element strides for b, h, n; the d stride is 1),
/// so both the head-major [B, H, N, D] and the token-major [B, N, H, D] layouts (the local block of
/// a [B, spatial..., H, D] DistTensor) are read in place.
///
/// Semantics, for one (b, h) and query i:
///   s_ij  = scale * q_i . k_j + bias_ij           (bias optional; -inf masks a key)
///   masked when causal and k_pos0 + j > q_pos0 + i (global token positions), or bias_ij = -inf
///   lse_i = log sum_{j unmasked} exp(s_ij)        (-inf for a fully masked row)
///   out_i = sum_j exp(s_ij - lse_i) v_j           (0 for a fully masked row)
/// lse is a contiguous [B, H, Nq] array in the accumulation type: double for f64, float for f32
/// and bf16. Memory of every implementation is O(N * D) (blockwise online softmax), never O(N^2).
#include "shardtensor/core/device.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/exec/context.hpp"

namespace shard::exec {

/// Sizes of one attention block: batch, heads, query and key counts, q/k head dim, v head dim.
struct AttnGeom {
  index_t B = 0, H = 0, Nq = 0, Nk = 0, D = 0, Dv = 0;
};

/// A read-only strided [B, H, N, D] operand (element strides; d stride 1).
struct AttnIn {
  const void* data = nullptr;
  index_t sb = 0, sh = 0, sn = 0;
};

/// A writable strided [B, H, N, D] operand (element strides; d stride 1).
struct AttnOut {
  void* data = nullptr;
  index_t sb = 0, sh = 0, sn = 0;
};

/// Scale, causal mask and optional additive bias.
struct AttnMask {
  double scale = 1.0;
  bool causal = false;
  index_t q_pos0 = 0;  ///< global position of query 0 (causal)
  index_t k_pos0 = 0;  ///< global position of key 0 (causal)
  /// Optional additive bias [B, H, Nq, Nk] in the operands' dtype with element strides (0
  /// broadcasts); -inf masks. Not differentiated.
  const void* bias = nullptr;
  index_t bias_sb = 0, bias_sh = 0, bias_sq = 0, bias_sk = 0;
};

/// Forward: writes out [B, H, Nq, Dv] and lse [B, H, Nq] (see the file comment).
void attention_forward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, const AttnMask& m, AttnOut out,
                       void* lse, Device dev, ExecContext& ctx);

/// Backward of one (q block, k/v block) pair given the FINAL out and lse of the queries (over all
/// key blocks, as ring attention has them): ADDS the block's contributions to dq [B,H,Nq,D],
/// dk [B,H,Nk,D] and dv [B,H,Nk,Dv] (any may have a null data pointer: not computed). Uses
/// delta_i = dout_i . out_i; P_ij = exp(s_ij - lse_i); dv += P^T dout; dS = P (dout v^T - delta);
/// dq += scale dS k; dk += scale dS^T q.
void attention_backward(DType dt, const AttnGeom& g, AttnIn q, AttnIn k, AttnIn v, AttnIn out, AttnIn dout,
                        const void* lse, const AttnMask& m, AttnOut dq, AttnOut dk, AttnOut dv, Device dev,
                        ExecContext& ctx);

/// Log-sum-exp merge of a partial result (out_b, lse_b) into (out, lse), both [B, H, Nq, Dv] /
/// [B, H, Nq]: lse' = log(exp(lse) + exp(lse_b)), out' = exp(lse - lse') out + exp(lse_b - lse')
/// out_b (rows with both -inf stay 0 / -inf).
void attention_merge(DType dt, const AttnGeom& g, AttnOut out, void* lse, AttnIn out_b, const void* lse_b, Device dev,
                     ExecContext& ctx);

}  // namespace shard::exec
