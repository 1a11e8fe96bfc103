#pragma once
/// \file neighborhood.hpp
/// Neighbourhood-attention kernel family front (KernelFamily::nbhd_attention): windowed scaled
/// dot-product attention of one local block, forward (output + per-query log-sum-exp) and
/// backward, on the execution context's device (CPU: src/exec/neighborhood_cpu.cpp; CUDA:
/// kernels/neighborhood.cu + src/cuda/neighborhood_cuda.cpp). One calling convention: geometry,
/// operand Blocks, ExecContext; the front checks every Block's device (ctx.device()), dtype and
/// shape against the geometry before it dispatches.
///
/// Operands are strided [B, S0, S1, S2, H, D] views (element strides for b, the three spatial
/// dims and h; the d stride is 1). Fewer spatial dims are given as leading dims of extent 1 with
/// window 1 (their strides are ignored). Queries form the block `nq`; keys and values form the
/// block `nk`, which is usually the query block extended by halo cells, query (0,0,0) sitting at
/// `qoff` inside it.
///
/// Window, for query i (3-index) and window offset o with 0 <= o_d < window_d, per dim d:
///   e_d = qoff_d + i_d + dilation_d * (o_d - window_d / 2)
/// so odd windows w = 2r+1 cover -r..r and even windows w cover -w/2 .. w/2 - 1 (times the
/// dilation). With `wrap_d` the index is taken modulo nk_d (a periodic dim held whole: then
/// qoff_d = 0 and nq_d = nk_d). Key e takes part iff 0 <= e_d < nk_d and valid_lo_d <= e_d <
/// valid_hi_d in every dim (keys outside the global domain are excluded from the softmax, not
/// treated as zero keys). Then, per (b, h):
///   s_io  = scale * q_i . k_e(i,o)
///   lse_i = log sum_{o valid} exp(s_io)   (-inf when no key is valid)
///   out_i = sum_{o valid} exp(s_io - lse_i) v_e(i,o)   (0 when no key is valid)
/// If two offsets reach the same key (only possible when wrap_d and dilation_d * (window_d - 1)
/// >= nk_d, which the functional op refuses), the key counts once per offset.
///
/// lse is a contiguous [B, nq0, nq1, nq2, H] array in the accumulation type (double for f64,
/// float for f32, bf16 and f16). The backward OVERWRITES dq (the query block) and dk, dv (the whole
/// key block; keys seen by no query get 0). It is deterministic: dq is a sum over each query's
/// window in offset order, dk and dv are gathered per key over the queries that see it (offset
/// order), never scattered with atomics.
#include "shardtensor/core/device.hpp"
#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// Geometry of one neighbourhood-attention block (three spatial dims; unused ones extent 1).
struct NbhdGeom {
  index_t B = 0, H = 0, D = 0, Dv = 0;     ///< batch, heads, q/k head dim, v head dim
  index_t nq[3] = {1, 1, 1};               ///< query block extents
  index_t nk[3] = {1, 1, 1};               ///< key/value block extents
  index_t qoff[3] = {0, 0, 0};             ///< position of query (0,0,0) inside the key block
  index_t window[3] = {1, 1, 1};           ///< window sizes (>= 1)
  index_t dilation[3] = {1, 1, 1};         ///< dilations (>= 1)
  index_t valid_lo[3] = {0, 0, 0};         ///< keys below are outside the domain
  index_t valid_hi[3] = {1, 1, 1};         ///< keys at or above are outside the domain
  bool wrap[3] = {false, false, false};    ///< key index modulo nk (periodic dim held whole)
  double scale = 1.0;                      ///< score scale
};

/// A read-only strided [B, S0, S1, S2, H, D] operand (element strides; d stride 1), as the kernel
/// tables read it (the front makes it from a Block).
struct NbhdIn {
  const void* data = nullptr;
  index_t sb = 0, ss[3] = {0, 0, 0}, sh = 0;
};

/// A writable strided [B, S0, S1, S2, H, D] operand (element strides; d stride 1), as the kernel
/// tables write it (the front makes it from a Block).
struct NbhdOut {
  void* data = nullptr;
  index_t sb = 0, ss[3] = {0, 0, 0}, sh = 0;
};

/// Forward: writes out [B, nq..., H, Dv] and lse [B, nq..., H] (see the file comment). q, k, v and
/// out are strided [B, S..., H, D] Blocks with 1-3 spatial dims S (right-aligned onto the
/// geometry's three; the geometry's leading unused extents are 1) and a unit d stride: q and out
/// have the query block's extents nq, k and v the key block's nk. lse is contiguous in the
/// accumulation type. Every Block on ctx.device(); one dtype (f32, f64; bf16 and f16 on CUDA, float accumulation).
void nbhd_attention_forward(const NbhdGeom& g, const Block& q, const Block& k, const Block& v, const Block& out,
                            const Block& lse, ExecContext& ctx);

/// Backward from the forward's out and lse and the output gradient dout: OVERWRITES dq
/// [B, nq..., H, D], dk [B, nk..., H, D] and dv [B, nk..., H, Dv] (null: not computed).
/// delta_i = dout_i . out_i; P_io = exp(s_io - lse_i); dv_e += P dout_i;
/// dS = P (dout_i . v_e - delta_i); dq_i += scale dS k_e; dk_e += scale dS q_i.
void nbhd_attention_backward(const NbhdGeom& g, const Block& q, const Block& k, const Block& v, const Block& out,
                             const Block& dout, const Block& lse, const Block* dq, const Block* dk, const Block* dv,
                             ExecContext& ctx);

/// Left reach of a window of size w in offsets (w / 2): odd w = 2r+1 reaches r below, even w
/// reaches w/2 below.
constexpr index_t nbhd_reach_lo(index_t w) { return w / 2; }
/// Right reach of a window of size w in offsets (w - 1 - w / 2): r for odd, w/2 - 1 for even.
constexpr index_t nbhd_reach_hi(index_t w) { return w - 1 - w / 2; }

}  // namespace shard::exec
