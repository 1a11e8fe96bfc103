#pragma once
/// \file attention.hpp
/// Domain-parallel scaled dot-product attention over sharded tokens (ring and all-to-all /
/// Ulysses), forward and backward on the tape, on the attention kernel family (exec/attention.hpp)
/// of the operands' device. This header holds the checks' entry points, the spec algebra and the
/// tape nodes; the schedule (the K/V ring, its split-phase shifts, the merge, the backward ring of
/// dK/dV) is src/nn/attention.cpp, the communication dist/ring.hpp (RingShift) and
/// dist/redistribute.hpp (Ulysses' tokens <-> heads redistributes).
///
/// Layout: q, k, v are [B, S_1, ..., S_k, H, Dh] (k = R - 3 >= 1 token dims, then heads, then head
/// dim); tokens are ordered row-major over (S_1..S_k) globally. Token dims may be sharded over any
/// mesh dims, unevenly (empty shards included); B may be sharded over a data-parallel mesh dim
/// (identically for q and k/v); H and Dh must be unsharded. k and v have the same spec except v's
/// head dim Dv; q may have another token shape than k (cross attention). The result has q's
/// spec with Dh replaced by Dv.
///
/// ring_attention: the ring runs over the product of the mesh dims that shard a token dim (one
/// mesh dim, or a 2-D/3-D domain over several, row-major in ascending mesh-dim order). Each step
/// computes this rank's queries against the K/V block it holds while the next K/V block is already
/// in flight (dist/ring.hpp: start before the step, finish after); partial results combine with
/// the log-sum-exp merge. Backward recomputes block probabilities from the saved out and lse
/// (exec::attention_backward) and sends the dK/dV accumulators around the ring with K/V (their
/// shift overlaps the next block's backward; a full loop returns them to their owner).
/// Variants, detected from the placements on the ring's mesh dims:
///  - q and k/v token-sharded (the ring);
///  - q replicated, k/v sharded: the ring runs for every rank's full q (output Replicate; dq is
///    computed whole on every rank, dK/dV of each block by its owner, nothing travels back);
///  - q sharded, k/v replicated: local attention, no communication; dK/dV come back Partial(sum);
///  - nothing sharded: local attention.
/// Causal (key position > query position masked; positions are global row-major token indices):
/// needs each rank's tokens to be contiguous in global order, i.e. at most one token dim sharded
/// and every token dim after it unsharded (a multi-dim spatial ring throws). Blocks entirely in a
/// query block's future are skipped. With `zigzag`, the token dim's global extent is cut into 2P
/// balanced chunks (P = ring size) and ring rank r must hold chunks r and 2P-1-r, in that order,
/// as its local block (the layout requirement of zigzag load balancing: every rank then does the
/// same causal work; where no mesh dim shards the tokens, the one-rank zigzag order is the identity
/// and zigzag is plain causal). `zigzag_sizes` gives the shard sizes and `zigzag_order` the global
/// permutation (a data loader, or a test, applies it once to the token dim).
///
/// ulysses_attention: redistributes q, k, v from token-sharded to head-sharded (Shard on the H dim
/// over the same mesh dims, balanced: head counts that do not divide work, some ranks may hold
/// none), runs local attention on whole sequences (the same schedule, which finds nothing sharded
/// on its ring dims), and redistributes the output back to q's layout; gradients flow through the
/// differentiable redistributes (autograd/comm_ops.hpp).
///
/// Errors (shard::Error on every rank, before any communication): mismatched batch, heads or head
/// dims; different meshes or devices; Partial inputs; sharded H/Dh; k and v laid out differently;
/// placements that disagree on a non-token mesh dim or shard q's and k's tokens over different
/// mesh dims; causal on a multi-dim ring; zigzag without causal or with a layout that is not the
/// zigzag one; an empty sequence.
#include <algorithm>
#include <vector>

#include "shardtensor/autograd/comm_ops.hpp"
#include "shardtensor/nn/functional/autocast.hpp"
#include "shardtensor/nn/functional/common.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard::nn::functional {

/// Options of ring_attention.
struct RingAttentionOptions {
  double scale = 0;  ///< 0 -> 1/sqrt(Dh)
  bool causal = false;
  /// Causal only: the token dim holds the zigzag layout (see the file comment).
  bool zigzag = false;
};

/// Options of ulysses_attention.
struct UlyssesOptions {
  double scale = 0;  ///< 0 -> 1/sqrt(Dh)
  bool causal = false;
};

/// Shard sizes of the zigzag layout of `n` tokens over a `p`-rank ring: rank r holds balanced
/// chunks r and 2p-1-r of 2p.
inline std::vector<index_t> zigzag_sizes(index_t n, int p) {
  std::vector<index_t> s(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r)
    s[static_cast<std::size_t>(r)] = balanced_size(n, 2 * p, r) + balanced_size(n, 2 * p, 2 * p - 1 - r);
  return s;
}

/// The zigzag order of `n` tokens over `p` ranks: element i is the natural (global) index of the
/// token at zigzag position i (chunks 0, 2p-1, 1, 2p-2, ...).
inline std::vector<index_t> zigzag_order(index_t n, int p) {
  std::vector<index_t> out;
  out.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < p; ++r)
    for (int c : {r, 2 * p - 1 - r}) {
      const index_t lo = balanced_offset(n, 2 * p, c), len = balanced_size(n, 2 * p, c);
      for (index_t i = 0; i < len; ++i) out.push_back(lo + i);
    }
  return out;
}

namespace detail {

/// What attention decided from the specs (the same on every rank): which variant of the schedule
/// runs, over which ring, with which mask.
struct AttentionPlan {
  enum class Variant { ring, q_replicated, kv_replicated, local };
  Variant variant = Variant::local;
  std::vector<int> ring_dims;  ///< mesh dims sharding a token dim (q's or k's)
  int token_dim = -1;          ///< causal: the one sharded token dim (-1: none)
  double scale = 1;
  bool causal = false, zigzag = false;
  index_t B = 0, H = 0, D = 0, Dv = 0;
};

/// The mesh dims that shard a token dim (1 .. R-3) of `s`.
std::vector<int> token_sharding_dims(const DistSpec& s);

/// Validates q, k, v (spec algebra only: throws the same error on every rank) and plans.
/// `heads_sharded`: H may be sharded (ulysses' local step), identically for q, k and v.
AttentionPlan plan_attention(const DistSpec& qs, const DistSpec& ks, const DistSpec& vs, double scale, bool causal,
                             bool zigzag, const char* op, bool heads_sharded = false);

/// The attention schedule, forward (src/nn/attention.cpp): q, k, v are this rank's contiguous
/// [B, S..., H, D(v)] blocks under qs, ks, vs; writes out (q's block shape with Dv) and lse
/// (contiguous, B * H * local tokens elements of the accumulation type: f64 for f64, else f32).
void attention_forward(const AttentionPlan& p, const DistSpec& qs, const DistSpec& ks, const DistSpec& vs,
                       const Block& q, const Block& k, const Block& v, const Block& out, const Block& lse,
                       ExecContext& ctx);

/// Gradients of this rank's k and v blocks (empty Blocks when not asked for): the block's whole
/// gradient (ring, q_replicated) or this rank's contribution (kv_replicated, local).
struct AttentionKVGrad {
  Block dk, dv;
};

/// The attention schedule, backward, from the forward's out and lse and the output gradient dout
/// (contiguous, out's shape): overwrites *dq (when non-null; q's block shape) and returns dK/dV
/// when `need_dkv`.
AttentionKVGrad attention_backward(const AttentionPlan& p, const DistSpec& qs, const DistSpec& ks, const DistSpec& vs,
                                   const Block& q, const Block& k, const Block& v, const Block& out, const Block& lse,
                                   const Block& dout, const Block* dq, bool need_dkv, ExecContext& ctx);

/// Attention on validated inputs with a plan (ring_attention, and ulysses_attention's local step
/// on head-sharded operands): runs the schedule and records the tape node.
template <class T, int R>
Var<T, R> attention_planned(const Var<T, R>& q, const Var<T, R>& k, const Var<T, R>& v, const AttentionPlan& p,
                            const char* op) {
  const DistSpec qs = q.value().spec(), ks = k.value().spec(), vs = v.value().spec();
  const Device dev = q.value().device();
  const auto ql = q.local().contiguous(), kl = k.local().contiguous(), vl = v.local().contiguous();
  auto og = qs.global_shape();
  og[static_cast<std::size_t>(R - 1)] = p.Dv;
  const DistSpec out_spec = derived_spec(qs, qs.placements(), og);
  Shape<R> oshape = ql.shape();
  oshape[R - 1] = p.Dv;
  auto out = Tensor<T, R>::empty(oshape, dev);
  index_t nlse = ql.size(0) * ql.size(R - 2);
  for (int d = 1; d <= R - 3; ++d) nlse *= ql.size(d);
  const DType acc = dtype_of<T> == DType::f64 ? DType::f64 : DType::f32;
  const Block lse = Block::allocate(acc, dev, &nlse, 1);
  attention_forward(p, qs, ks, vs, as_block(ql), as_block(kl), as_block(vl), as_block(out), lse, current_context(dev));
  return make_var_n<T, R>(
      DistTensor<T, R>(out_spec, out), op, {q.ref(), k.ref(), v.ref()},
      [q, k, v, p, qs, ks, vs, ql, kl, vl, out, lse, out_spec](const DistTensor<T, R>& gin) {
        const auto g = autograd::gradient_as(out_spec, gin, autograd::PartialGrad::resolve).local().contiguous();
        const bool need_dq = q.requires_grad(), need_dkv = k.requires_grad() || v.requires_grad();
        Tensor<T, R> dq;
        if (need_dq) dq = Tensor<T, R>::empty(ql.shape(), ql.device());
        const Block dqb = need_dq ? as_block(dq) : Block{};
        const AttentionKVGrad gkv =
            attention_backward(p, qs, ks, vs, as_block(ql), as_block(kl), as_block(vl), as_block(out), lse,
                               as_block(g), need_dq ? &dqb : nullptr, need_dkv, current_context(ql.device()));
        if (need_dq) q.accumulate_grad(DistTensor<T, R>(qs, dq));
        if (!need_dkv) return;
        DistSpec kgs = ks, vgs = vs;
        if (p.variant == AttentionPlan::Variant::kv_replicated) {  // per-rank contributions
          auto pl = with_partial(ks.placements(), p.ring_dims, ReduceOp::sum);
          kgs = ks.with_placements(pl, ks.sizes());
          vgs = vs.with_placements(pl, vs.sizes());
        }
        if (k.requires_grad()) k.accumulate_grad(DistTensor<T, R>(kgs, tensor_of<T, R>(gkv.dk)));
        if (v.requires_grad()) v.accumulate_grad(DistTensor<T, R>(vgs, tensor_of<T, R>(gkv.dv)));
      });
}

template <class T, int R>
void check_attention_devices(const Var<T, R>& q, const Var<T, R>& k, const Var<T, R>& v, const char* op) {
  SHARD_CHECK(q.value().device() == k.value().device() && q.value().device() == v.value().device(), op,
              "operands on different devices: q on {}, k on {}, v on {}", q.value().device(), k.value().device(),
              v.value().device());
}

/// Ulysses' layout of x: Shard(heads) on the mesh dims `dims` that shard the tokens (the tokens
/// on them become whole), every other mesh dim as x has it.
inline std::vector<Placement> heads_sharded_placements(const DistSpec& x, const std::vector<int>& dims) {
  auto pl = x.placements();
  for (int m : dims) pl[static_cast<std::size_t>(m)] = Shard(x.ndim() - 2);
  return pl;
}

}  // namespace detail

/// Ring attention of q, k, v [B, S..., H, Dh] sharded along their tokens (see the file comment).
template <class T, int R>
Var<T, R> ring_attention(const Var<T, R>& q, const Var<T, R>& k, const Var<T, R>& v,
                         const RingAttentionOptions& opts = {}) {
  static_assert(R >= 4, "ring_attention: q, k, v are [B, S..., H, Dh] (rank >= 4)");
  static_assert(is_float_type<T>, "ring_attention supports float, double, bf16 and f16");
  if (auto y = detail::autocast([](const auto&... a) { return ring_attention(a...); }, q, k, v, opts)) return *y;
  const char* op = "ring_attention";
  detail::check_attention_devices(q, k, v, op);
  const auto p = detail::plan_attention(q.value().spec(), k.value().spec(), v.value().spec(), opts.scale, opts.causal,
                                        opts.zigzag, op);
  return detail::attention_planned(q, k, v, p, op);
}

/// All-to-all (Ulysses) attention: tokens -> heads redistribute, local attention, heads -> tokens
/// (see the file comment).
template <class T, int R>
Var<T, R> ulysses_attention(const Var<T, R>& q, const Var<T, R>& k, const Var<T, R>& v,
                            const UlyssesOptions& opts = {}) {
  static_assert(R >= 4, "ulysses_attention: q, k, v are [B, S..., H, Dh] (rank >= 4)");
  static_assert(is_float_type<T>, "ulysses_attention supports float, double, bf16 and f16");
  if (auto y = detail::autocast([](const auto&... a) { return ulysses_attention(a...); }, q, k, v, opts)) return *y;
  const char* op = "ulysses_attention";
  detail::check_attention_devices(q, k, v, op);
  const DistSpec& qs = q.value().spec();
  // validates everything on the input specs (same error on every rank, before any collective)
  const auto p0 = detail::plan_attention(qs, k.value().spec(), v.value().spec(), opts.scale, false, false, op);
  // the mesh dims that shard a token dim of q, k or v: they shard the heads in between
  std::vector<int> u = detail::token_sharding_dims(qs);
  for (const DistSpec* s : {&k.value().spec(), &v.value().spec()})
    for (int m : detail::token_sharding_dims(*s))
      if (std::find(u.begin(), u.end(), m) == u.end()) u.push_back(m);
  if (u.empty()) {  // nothing to redistribute: local attention
    const auto p = detail::plan_attention(qs, k.value().spec(), v.value().spec(), p0.scale, opts.causal, false, op,
                                          /*heads_sharded=*/true);
    return detail::attention_planned(q, k, v, p, op);
  }
  auto tokens_to_heads = [&](const Var<T, R>& x) {
    return autograd::redistribute(x, detail::heads_sharded_placements(x.value().spec(), u));
  };
  const Var<T, R> qh = tokens_to_heads(q), kh = tokens_to_heads(k), vh = tokens_to_heads(v);
  const auto p = detail::plan_attention(qh.value().spec(), kh.value().spec(), vh.value().spec(), p0.scale,
                                        opts.causal, false, op, /*heads_sharded=*/true);
  auto oh = detail::attention_planned(qh, kh, vh, p, op);
  // heads -> tokens: back onto q's layout (with v's head dim)
  auto og = qs.global_shape();
  og[static_cast<std::size_t>(R - 1)] = p.Dv;
  return autograd::redistribute(oh, detail::derived_spec(qs, qs.placements(), og));
}

}  // namespace shard::nn::functional
