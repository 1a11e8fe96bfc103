#pragma once
/// \file attention.hpp
/// Attention kernel family front: scaled dot-product attention of one local block, forward
/// (output + per-query log-sum-exp), backward (from q, k, v, the final out and lse, dout) and the
/// log-sum-exp merge of partial results that ring attention uses, on the execution context's
/// device (CPU: src/exec/attention_cpu.cpp; CUDA: src/cuda/attention_cuda.cpp + kernels/attention.cu).
/// One calling convention: geometry, mask, operand Blocks, ExecContext; the front checks every
/// Block's device (ctx.device()), dtype and shape against the geometry before it dispatches.
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
/// lse is a contiguous [B, H, Nq] array in the accumulation type: double for f64, float for f32,
/// bf16 and f16. Memory of every implementation is O(N * D) (blockwise online softmax), never O(N^2).
#include "shardtensor/core/device.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// Sizes of one attention block: batch, heads, query and key counts, q/k head dim, v head dim.
struct AttnGeom {
  index_t B = 0, H = 0, Nq = 0, Nk = 0, D = 0, Dv = 0;
};

/// A read-only strided [B, H, N, D] operand (element strides; d stride 1), as the kernel tables
/// read it (the front makes it from a Block).
struct AttnIn {
  const void* data = nullptr;
  index_t sb = 0, sh = 0, sn = 0;
};

/// A writable strided [B, H, N, D] operand (element strides; d stride 1), as the kernel tables
/// write it (the front makes it from a Block).
struct AttnOut {
  void* data = nullptr;
  index_t sb = 0, sh = 0, sn = 0;
};

/// Scale, causal mask and (set by the front from its `bias` Block) the additive bias.
struct AttnMask {
  double scale = 1.0;
  bool causal = false;
  index_t q_pos0 = 0;  ///< global position of query 0 (causal)
  index_t k_pos0 = 0;  ///< global position of key 0 (causal)
  /// Additive bias [B, H, Nq, Nk] with element strides, as the kernel tables read it: the front
  /// sets these from its `bias` Block (callers leave them null / 0).
  const void* bias = nullptr;
  index_t bias_sb = 0, bias_sh = 0, bias_sq = 0, bias_sk = 0;
};

/// A [B, H, N, D] attention operand viewing `data` (dtype `dt`, on `dev`) with element strides
/// sb, sh, sn for b, h, n and 1 for d; e.g. rows [row0, row0 + N) of a contiguous token-major
/// [B, N_all, H, D] block are attention_view(dt, dev, base + row0 * H * D, B, H, N, D, N_all * H * D, D, H * D).
Block attention_view(DType dt, Device dev, const void* data, index_t B, index_t H, index_t N, index_t D, index_t sb,
                     index_t sh, index_t sn);

/// Forward: writes out [B, H, Nq, Dv] and lse [B, H, Nq] (see the file comment). q [B, H, Nq, D],
/// k [B, H, Nk, D], v [B, H, Nk, Dv] and out are strided Blocks with a unit d stride; lse is
/// contiguous in the accumulation type; `bias` (optional, may be null) is a strided
/// [B, H, Nq, Nk] Block of the operands' dtype (stride 0 broadcasts; -inf masks; not
/// differentiated). Every Block on ctx.device(); one dtype (f32, f64; bf16 and f16 on CUDA, float accumulation).
void attention_forward(const AttnGeom& g, const AttnMask& m, const Block& q, const Block& k, const Block& v,
                       const Block* bias, const Block& out, const Block& lse, ExecContext& ctx);

/// Backward of one (q block, k/v block) pair given the FINAL out and lse of the queries (over all
/// key blocks, as ring attention has them): ADDS the block's contributions to dq [B,H,Nq,D],
/// dk [B,H,Nk,D] and dv [B,H,Nk,Dv] (any may be null: not computed). Uses
/// delta_i = dout_i . out_i; P_ij = exp(s_ij - lse_i); dv += P^T dout; dS = P (dout v^T - delta);
/// dq += scale dS k; dk += scale dS^T q.
void attention_backward(const AttnGeom& g, const AttnMask& m, const Block& q, const Block& k, const Block& v,
                        const Block* bias, const Block& out, const Block& dout, const Block& lse, const Block* dq,
                        const Block* dk, const Block* dv, ExecContext& ctx);

/// Log-sum-exp merge of a partial result (out_b, lse_b) into (out, lse), both [B, H, Nq, Dv] /
/// [B, H, Nq]: lse' = log(exp(lse) + exp(lse_b)), out' = exp(lse - lse') out + exp(lse_b - lse')
/// out_b (rows with both -inf stay 0 / -inf).
void attention_merge(const AttnGeom& g, const Block& out, const Block& lse, const Block& out_b, const Block& lse_b,
                     ExecContext& ctx);

}  // namespace shard::exec
