#pragma once
/// \file ring_attention.hpp
/// Domain-parallel scaled dot-product attention over sharded tokens, forward and backward on the
/// tape, on the attention kernel family (exec/attention.hpp) of the operands' device.
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
/// same causal work). `zigzag_sizes` gives the shard sizes and `zigzag_order` the global
/// permutation (a data loader, or a test, applies it once to the token dim).
///
/// ulysses_attention: redistributes q, k, v from token-sharded to head-sharded (Shard on the H dim
/// over the same mesh dims, balanced: head counts that do not divide work, some ranks may hold
/// none), runs local attention on whole sequences, and redistributes the output back to q's
/// layout; gradients flow through the differentiable redistributes (autograd/comm_ops.hpp).
///
/// Errors (shard::Error on every rank, before any communication): mismatched batch, heads or head
/// dims; different meshes or devices; Partial inputs; sharded H/Dh; k and v laid out differently;
/// placements that disagree on a non-token mesh dim or shard q's and k's tokens over different
/// mesh dims; causal on a multi-dim ring; zigzag without causal or with a layout that is not the
/// zigzag one; an empty sequence.
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "shardtensor/autograd/comm_ops.hpp"
#include "shardtensor/dist/ring.hpp"
#include "shardtensor/exec/attention.hpp"
#include "shardtensor/nn/functional/common.hpp"

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

/// A run of local tokens with contiguous global positions: rows [row0, row0 + n) of the local
/// block, global position of its first token pos0.
struct TokenRun {
  index_t row0 = 0, n = 0, pos0 = 0;
};

/// What ring_attention decided from the specs (the same on every rank).
struct RingAttnPlan {
  enum class Variant { ring, q_replicated, kv_replicated, local };
  Variant variant = Variant::local;
  std::vector<int> ring_dims;  ///< mesh dims sharding a token dim (q's or k's)
  int token_dim = -1;          ///< causal: the one sharded token dim (-1: none)
  double scale = 1;
  bool causal = false, zigzag = false;
  index_t B = 0, H = 0, D = 0, Dv = 0;
};

inline std::vector<int> token_sharding_dims(const DistSpec& s) {
  const int R = s.ndim();
  return mesh_dims_sharding(s, [R](int d) { return d >= 1 && d <= R - 3; });
}

/// True when every rank's tokens of `s` are one contiguous range of the global row-major order:
/// at most one token dim is sharded and every token dim before it has extent 1. Sets `dim` to the
/// sharded token dim (or -1).
inline bool tokens_contiguous(const DistSpec& s, int& dim) {
  const int R = s.ndim();
  dim = -1;
  for (int d = 1; d <= R - 3; ++d) {
    if (s.sharding_mesh_dims(d).empty()) continue;
    if (dim >= 0) return false;
    dim = d;
  }
  for (int d = 1; d < dim; ++d)
    if (s.global_shape()[static_cast<std::size_t>(d)] != 1) return false;
  return true;
}

/// Validates q, k, v (spec algebra only: throws the same error on every rank) and plans.
/// `heads_sharded`: H may be sharded (ulysses' local step), identically for q, k and v.
inline RingAttnPlan plan_ring_attention(const DistSpec& qs, const DistSpec& ks, const DistSpec& vs, double scale,
                                        bool causal, bool zigzag, const char* op, bool heads_sharded = false) {
  const int R = qs.ndim();
  RingAttnPlan p;
  SHARD_CHECK(qs.mesh() == ks.mesh() && qs.mesh() == vs.mesh(), op, "q, k and v live on different meshes: {}",
              mesh_mismatch(qs.mesh(), qs.mesh() == ks.mesh() ? vs.mesh() : ks.mesh()));
  for (const DistSpec* s : {&qs, &ks, &vs}) {
    check_no_partial(*s, op, "an input");
    if (!heads_sharded) check_unsharded(*s, R - 2, op, "q, k and v (heads)");
    check_unsharded(*s, R - 1, op, "q, k and v (head dim)");
  }
  const auto& qg = qs.global_shape();
  const auto& kg = ks.global_shape();
  const auto& vg = vs.global_shape();
  const auto H = static_cast<std::size_t>(R - 2), Dd = static_cast<std::size_t>(R - 1);
  SHARD_CHECK(qg[0] == kg[0] && qg[0] == vg[0], op, "batch sizes differ: q {}, k {}, v {}", qg, kg, vg);
  SHARD_CHECK(qg[H] == kg[H] && qg[H] == vg[H], op, "head counts differ: q {}, k {}, v {} (dim {})", qg, kg, vg,
              R - 2);
  SHARD_CHECK(qg[Dd] == kg[Dd], op, "q and k head dims differ: q {} vs k {}", qg, kg);
  for (int d = 0; d < R - 1; ++d)
    SHARD_CHECK(kg[static_cast<std::size_t>(d)] == vg[static_cast<std::size_t>(d)], op,
                "k {} and v {} must agree on every dim but the head dim", kg, vg);
  SHARD_CHECK(ks.placements() == vs.placements(), op, "k and v must be laid out alike: {} vs {}", ks, vs);
  for (int d = 0; d < R - 1; ++d)
    SHARD_CHECK(ks.layout(d).sizes() == vs.layout(d).sizes(), op, "k and v shard dim {} differently: {} vs {}", d,
                ks.layout(d).sizes(), vs.layout(d).sizes());
  index_t nq = 1, nk = 1;
  for (int d = 1; d <= R - 3; ++d) {
    nq *= qg[static_cast<std::size_t>(d)];
    nk *= kg[static_cast<std::size_t>(d)];
  }
  SHARD_CHECK(nq > 0 && nk > 0, op, "empty sequence: q {} and k {} have {} and {} tokens", qg, kg, nq, nk);
  SHARD_CHECK(qg[H] > 0 && qg[Dd] > 0 && vg[Dd] > 0, op, "empty heads or head dims: q {}, v {}", qg, vg);
  const auto qring = token_sharding_dims(qs), kring = token_sharding_dims(ks);
  for (int m = 0; m < qs.mesh().ndim(); ++m) {
    const bool in_ring = std::find(qring.begin(), qring.end(), m) != qring.end() ||
                         std::find(kring.begin(), kring.end(), m) != kring.end();
    if (in_ring) continue;
    SHARD_CHECK(qs.placement(m) == ks.placement(m), op,
                "q and k/v disagree on mesh dim {} (not a token dim): {} vs {}", m, qs, ks);
  }
  SHARD_CHECK(qs.layout(0).sizes() == ks.layout(0).sizes(), op, "q and k/v shard the batch differently: {} vs {}",
              qs.layout(0).sizes(), ks.layout(0).sizes());
  SHARD_CHECK(qs.layout(R - 2).sizes() == ks.layout(R - 2).sizes(), op,
              "q and k/v shard the heads differently: {} vs {}", qs.layout(R - 2).sizes(), ks.layout(R - 2).sizes());
  const std::vector<int>& ring_dims = qring.empty() ? kring : qring;
  for (int m : ring_dims)
    for (const DistSpec* s : {&qs, &ks}) {
      const Placement& pl = s->placement(m);
      SHARD_CHECK(pl.is_replicate() || (pl.dim >= 1 && pl.dim <= R - 3), op,
                  "mesh dim {} shards tokens, so q and k/v must be token-sharded or Replicate on it: q {}, k {}", m,
                  qs, ks);
    }
  using V = RingAttnPlan::Variant;
  if (!qring.empty() && !kring.empty()) {
    SHARD_CHECK(qring == kring, op,
                "q's tokens are sharded over mesh dims {} but k/v's over {}: incompatible placements ({} vs {})",
                qring, kring, qs, ks);
    p.variant = V::ring;
    p.ring_dims = qring;
  } else if (!kring.empty()) {
    p.variant = V::q_replicated;
    p.ring_dims = kring;
  } else if (!qring.empty()) {
    p.variant = V::kv_replicated;
    p.ring_dims = qring;
  }
  p.causal = causal;
  p.zigzag = zigzag;
  if (causal) {
    int qd = -1, kd = -1;
    const bool ok = tokens_contiguous(qs, qd) && tokens_contiguous(ks, kd);
    SHARD_CHECK(ok, op,
                "causal attention needs each rank's tokens contiguous in global row-major order (one token dim "
                "sharded, every token dim before it of extent 1); a multi-dim spatial ring is not supported: "
                "q {}, k {}",
                qs, ks);
    p.token_dim = qd >= 0 ? qd : kd;
  }
  if (zigzag) {
    SHARD_CHECK(causal, op, "zigzag is a load balancing of causal attention; set causal too");
    SHARD_CHECK(p.variant == V::ring && p.token_dim >= 0 && R == 4, op,
                "zigzag needs q and k/v sharded along their one token dim ([B, S, H, D]); got q {}, k {}", qs, ks);
    int P = 1;
    for (int m : p.ring_dims) P *= qs.mesh().size(m);
    for (const DistSpec* s : {&qs, &ks})
      SHARD_CHECK(s->layout(1).sizes() == zigzag_sizes(s->global_shape()[1], P), op,
                  "zigzag: shard sizes of the token dim must be {} (chunks r and 2P-1-r of 2P); got {}",
                  zigzag_sizes(s->global_shape()[1], P), s->layout(1).sizes());
  }
  p.B = qg[0];
  p.H = qg[H];
  p.D = qg[Dd];
  p.Dv = vg[Dd];
  p.scale = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(p.D));
  return p;
}

/// The token runs of the block of `s` that mesh rank `rank` holds (one run, or two with zigzag).
inline std::vector<TokenRun> token_runs(const RingAttnPlan& p, const DistSpec& s, int rank, int ring_index,
                                        int ring_size) {
  const Box& b = s.box_of(rank);
  const int R = s.ndim();
  index_t n = 1;
  for (int d = 1; d <= R - 3; ++d) n *= b.len[static_cast<std::size_t>(d)];
  if (!p.causal) return {TokenRun{0, n, 0}};
  if (p.zigzag) {
    const index_t N = s.global_shape()[1];
    const int P2 = 2 * ring_size;
    const index_t n0 = balanced_size(N, P2, ring_index), n1 = balanced_size(N, P2, P2 - 1 - ring_index);
    return {TokenRun{0, n0, balanced_offset(N, P2, ring_index)},
            TokenRun{n0, n1, balanced_offset(N, P2, P2 - 1 - ring_index)}};
  }
  index_t pos = 0;  // row-major linear index of the box's first token
  for (int d = 1; d <= R - 3; ++d) pos = pos * s.global_shape()[static_cast<std::size_t>(d)] + b.lo[static_cast<std::size_t>(d)];
  return {TokenRun{0, n, pos}};
}

/// [B, H, N, D] view of rows [row0, ...) of a contiguous token-major block [B, N, H, D].
template <class T>
exec::AttnIn attn_in(const T* p, index_t N, index_t H, index_t D, index_t row0) {
  return exec::AttnIn{p + row0 * H * D, N * H * D, D, H * D};
}
template <class T>
exec::AttnOut attn_out(T* p, index_t N, index_t H, index_t D, index_t row0) {
  return exec::AttnOut{p + row0 * H * D, N * H * D, D, H * D};
}

/// True when the pair (query run, key run) has at least one unmasked score.
inline bool runs_interact(const RingAttnPlan& p, const TokenRun& q, const TokenRun& k) {
  if (q.n == 0 || k.n == 0) return false;
  return !p.causal || k.pos0 <= q.pos0 + q.n - 1;
}

/// Local token count and batch of a contiguous [B, S..., H, D] block.
template <class T, int R>
index_t local_tokens(const Tensor<T, R>& t) {
  index_t n = 1;
  for (int d = 1; d <= R - 3; ++d) n *= t.size(d);
  return n;
}

template <class T>
using attn_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Starts the ring shift of a pair of blocks (K and V, or their dK/dV accumulators) to the next
/// rank on channel `tag`, receiving ring position `from`'s pair into `na`, `nb` (allocated here
/// with that position's block shapes under `ks`, `vs`). Finish the returned transfer before
/// reading `na`, `nb` or reusing `a`, `b`.
template <class T, int R>
RingShift::Transfer start_pair_shift(const RingShift& ring, const DistSpec& ks, const DistSpec& vs, int from,
                                     const Tensor<T, R>& a, const Tensor<T, R>& b, Tensor<T, R>& na,
                                     Tensor<T, R>& nb, ExecContext& ctx, int tag) {
  const Device dev = a.device();
  na = Tensor<T, R>::empty(ring_block_shape<R>(ks, ring, from), dev);
  nb = Tensor<T, R>::empty(ring_block_shape<R>(vs, ring, from), dev);
  const RingSegment seg[2] = {{a.data(), a.numel(), na.data(), na.numel()}, {b.data(), b.numel(), nb.data(), nb.numel()}};
  return ring.start(seg, dtype_of<T>, RingDirection::forward, &ctx, tag);
}

/// Step `s` of `steps` of a K/V ring loop: starts the shift that brings step s+1's K/V block
/// (into `nk`, `nv`) while step s computes on `ck`, `cv`; an empty transfer at the last step.
template <class T, int R>
RingShift::Transfer start_kv_shift(const RingShift& ring, const DistSpec& ks, const DistSpec& vs, int s, int steps,
                                   const Tensor<T, R>& ck, const Tensor<T, R>& cv, Tensor<T, R>& nk, Tensor<T, R>& nv,
                                   ExecContext& ctx) {
  if (s + 1 >= steps) return {};
  return start_pair_shift(ring, ks, vs, ring.neighbor(-(s + 1)), ck, cv, nk, nv, ctx, 0);
}

/// The ring attention schedule (forward), on contiguous local blocks.
template <class T, int R>
void ring_attention_forward(const RingAttnPlan& p, const RingShift& ring, const DistSpec& qs, const DistSpec& ks,
                            const DistSpec& vs, const Tensor<T, R>& q, const Tensor<T, R>& k, const Tensor<T, R>& v,
                            const Tensor<T, R>& out, const Tensor<attn_acc_t<T>, 1>& lse) {
  using A = attn_acc_t<T>;
  const DType dt = dtype_of<T>;
  const Device dev = q.device();
  ExecContext& ctx = current_context(dev);
  const index_t B = q.size(0), H = q.size(R - 2), D = p.D, Dv = p.Dv, Nq = local_tokens(q);
  const bool travels = p.variant == RingAttnPlan::Variant::ring || p.variant == RingAttnPlan::Variant::q_replicated;
  const int steps = travels ? ring.size() : 1;
  const auto qruns = token_runs(p, qs, qs.mesh().rank(), ring.index(), ring.size());
  lse.fill(-std::numeric_limits<A>::infinity());
  out.fill(T(0));
  auto tmp = Tensor<T, R>::empty(out.shape(), dev);
  auto tmp_lse = Tensor<A, 1>::empty(lse.shape(), dev);
  Tensor<T, R> ck = k, cv = v;
  for (int s = 0; s < steps; ++s) {
    const int j = ring.neighbor(-s);  // ring position whose K/V block this rank holds now
    Tensor<T, R> nk, nv;
    RingShift::Transfer tr = start_kv_shift(ring, ks, vs, s, steps, ck, cv, nk, nv, ctx);
    const int owner = travels ? ring.mesh_rank_of(j) : ks.mesh().rank();
    const auto kruns = token_runs(p, ks, owner, j, ring.size());
    const index_t Nk = local_tokens(ck);
    for (const auto& qr : qruns)
      for (const auto& kr : kruns) {
        if (!runs_interact(p, qr, kr) || B == 0) continue;
        const exec::AttnGeom g{B, H, qr.n, kr.n, D, Dv};
        exec::AttnMask m;
        m.scale = p.scale;
        m.causal = p.causal;
        m.q_pos0 = qr.pos0;
        m.k_pos0 = kr.pos0;
        A* tl = tmp_lse.data() + B * H * qr.row0;
        exec::attention_forward(dt, g, attn_in(q.data(), Nq, H, D, qr.row0), attn_in(ck.data(), Nk, H, D, kr.row0),
                                attn_in(cv.data(), Nk, H, Dv, kr.row0), m, attn_out(tmp.data(), Nq, H, Dv, qr.row0),
                                tl, dev, ctx);
        exec::attention_merge(dt, g, attn_out(out.data(), Nq, H, Dv, qr.row0), lse.data() + B * H * qr.row0,
                              attn_in(static_cast<const T*>(tmp.data()), Nq, H, Dv, qr.row0), tl, dev, ctx);
      }
    tr.finish();
    if (s + 1 < steps) {
      ck = nk;
      cv = nv;
    }
  }
}

/// The ring attention schedule (backward): dq (zeroed here) gets every block's contribution;
/// dk/dv (zeroed here; may be empty tensors when not needed) end as this rank's block gradient
/// (ring, q_replicated) or its local contribution (kv_replicated, local).
template <class T, int R>
void ring_attention_backward(const RingAttnPlan& p, const RingShift& ring, const DistSpec& qs, const DistSpec& ks,
                             const DistSpec& vs, const Tensor<T, R>& q, const Tensor<T, R>& k, const Tensor<T, R>& v,
                             const Tensor<T, R>& out, const Tensor<attn_acc_t<T>, 1>& lse, const Tensor<T, R>& dout,
                             const Tensor<T, R>& dq, Tensor<T, R>& dk, Tensor<T, R>& dv, bool need_dq, bool need_dkv) {
  using V = RingAttnPlan::Variant;
  const DType dt = dtype_of<T>;
  const Device dev = q.device();
  ExecContext& ctx = current_context(dev);
  const index_t B = q.size(0), H = q.size(R - 2), D = p.D, Dv = p.Dv, Nq = local_tokens(q);
  const bool travels = p.variant == V::ring || p.variant == V::q_replicated;
  // dK/dV accumulators travel only when every rank's queries touch every block (the ring).
  const bool acc_travels = p.variant == V::ring && need_dkv;
  const int steps = (travels && (need_dq || acc_travels)) ? ring.size() : 1;
  const auto qruns = token_runs(p, qs, qs.mesh().rank(), ring.index(), ring.size());
  if (need_dq) dq.fill(T(0));
  Tensor<T, R> ck = k, cv = v;
  Tensor<T, R> acc_k, acc_v;  // accumulators of the block held now (ring), in flight between steps
  Tensor<T, R> in_k, in_v;    // accumulators arriving
  RingShift::Transfer acc_tr;
  for (int s = 0; s < steps; ++s) {
    const int j = ring.neighbor(-s);
    Tensor<T, R> nk, nv;
    RingShift::Transfer tr = start_kv_shift(ring, ks, vs, s, steps, ck, cv, nk, nv, ctx);
    const int owner = travels ? ring.mesh_rank_of(j) : ks.mesh().rank();
    const auto kruns = token_runs(p, ks, owner, j, ring.size());
    const index_t Nk = local_tokens(ck);
    // this step's dK/dV contribution: own block at step 0 (every variant), every block on the ring
    const bool dkv_now = need_dkv && (s == 0 || acc_travels);
    Tensor<T, R> tk, tv;
    if (dkv_now) {
      tk = Tensor<T, R>::zeros(ck.shape(), dev);
      tv = Tensor<T, R>::zeros(cv.shape(), dev);
    }
    for (const auto& qr : qruns)
      for (const auto& kr : kruns) {
        if (!runs_interact(p, qr, kr) || B == 0 || (!need_dq && !dkv_now)) continue;
        const exec::AttnGeom g{B, H, qr.n, kr.n, D, Dv};
        exec::AttnMask m;
        m.scale = p.scale;
        m.causal = p.causal;
        m.q_pos0 = qr.pos0;
        m.k_pos0 = kr.pos0;
        exec::AttnOut odq{}, odk{}, odv{};
        if (need_dq) odq = attn_out(dq.data(), Nq, H, D, qr.row0);
        if (dkv_now) {
          odk = attn_out(tk.data(), Nk, H, D, kr.row0);
          odv = attn_out(tv.data(), Nk, H, Dv, kr.row0);
        }
        exec::attention_backward(dt, g, attn_in(q.data(), Nq, H, D, qr.row0), attn_in(ck.data(), Nk, H, D, kr.row0),
                                 attn_in(cv.data(), Nk, H, Dv, kr.row0), attn_in(out.data(), Nq, H, Dv, qr.row0),
                                 attn_in(dout.data(), Nq, H, Dv, qr.row0), lse.data() + B * H * qr.row0, m, odq, odk,
                                 odv, dev, ctx);
      }
    if (dkv_now) {
      if (s == 0) {
        acc_k = tk;
        acc_v = tv;
      } else {  // the accumulator of block j arrived from the previous rank: add this rank's part
        acc_tr.finish();
        axpy(T(1), tk, in_k);
        axpy(T(1), tv, in_v);
        acc_k = in_k;
        acc_v = in_v;
      }
      if (acc_travels && ring.size() > 1) {  // pass it on (after the last step: back to its owner)
        acc_tr = start_pair_shift(ring, ks, vs, ring.neighbor(-(s + 1)), acc_k, acc_v, in_k, in_v, ctx, 1);
      }
    }
    tr.finish();
    if (s + 1 < steps) {
      ck = nk;
      cv = nv;
    }
  }
  if (!need_dkv) return;
  if (acc_travels && ring.size() > 1) {
    acc_tr.finish();
    dk = in_k;
    dv = in_v;
  } else {
    dk = acc_k;
    dv = acc_v;
  }
}

/// ring_attention on validated inputs with a plan (shared with ulysses_attention's local step).
template <class T, int R>
Var<T, R> ring_attention_planned(const Var<T, R>& q, const Var<T, R>& k, const Var<T, R>& v, const RingAttnPlan& p,
                                 const char* op) {
  using A = attn_acc_t<T>;
  const DistSpec qs = q.value().spec(), ks = k.value().spec(), vs = v.value().spec();
  const Device dev = q.value().device();
  RingShift ring(qs.mesh(), p.ring_dims);
  const auto ql = q.local().contiguous(), kl = k.local().contiguous(), vl = v.local().contiguous();
  auto og = qs.global_shape();
  og[static_cast<std::size_t>(R - 1)] = p.Dv;
  const DistSpec out_spec = derived_spec(qs, qs.placements(), og);
  Shape<R> oshape = ql.shape();
  oshape[R - 1] = p.Dv;
  auto out = Tensor<T, R>::empty(oshape, dev);
  auto lse = Tensor<A, 1>::empty({ql.size(0) * ql.size(R - 2) * local_tokens(ql)}, dev);
  ring_attention_forward<T, R>(p, ring, qs, ks, vs, ql, kl, vl, out, lse);
  return make_var_n<T, R>(
      DistTensor<T, R>(out_spec, out), op, {q.ref(), k.ref(), v.ref()},
      [q, k, v, p, ring, qs, ks, vs, ql, kl, vl, out, lse, out_spec](const DistTensor<T, R>& gin) {
        const auto g = align_grad(gin, out_spec).local().contiguous();
        const bool need_dq = q.requires_grad(), need_dkv = k.requires_grad() || v.requires_grad();
        Tensor<T, R> dq, dk, dv;
        if (need_dq) dq = Tensor<T, R>::empty(ql.shape(), ql.device());
        ring_attention_backward<T, R>(p, ring, qs, ks, vs, ql, kl, vl, out, lse, g, dq, dk, dv, need_dq, need_dkv);
        if (need_dq) q.accumulate_grad(DistTensor<T, R>(qs, dq));
        if (!need_dkv) return;
        DistSpec kgs = ks, vgs = vs;
        if (p.variant == RingAttnPlan::Variant::kv_replicated) {  // per-rank contributions
          auto pl = with_partial(ks.placements(), p.ring_dims, ReduceOp::sum);
          kgs = ks.with_placements(pl, ks.sizes());
          vgs = vs.with_placements(pl, vs.sizes());
        }
        if (k.requires_grad()) k.accumulate_grad(DistTensor<T, R>(kgs, dk));
        if (v.requires_grad()) v.accumulate_grad(DistTensor<T, R>(vgs, dv));
      });
}

template <class T, int R>
void check_attention_devices(const Var<T, R>& q, const Var<T, R>& k, const Var<T, R>& v, const char* op) {
  SHARD_CHECK(q.value().device() == k.value().device() && q.value().device() == v.value().device(), op,
              "operands on different devices: q on {}, k on {}, v on {}", q.value().device(), k.value().device(),
              v.value().device());
}

}  // namespace detail

/// Ring attention of q, k, v [B, S..., H, Dh] sharded along their tokens (see the file comment).
template <class T, int R>
Var<T, R> ring_attention(const Var<T, R>& q, const Var<T, R>& k, const Var<T, R>& v,
                         const RingAttentionOptions& opts = {}) {
  static_assert(R >= 4, "ring_attention: q, k, v are [B, S..., H, Dh] (rank >= 4)");
  static_assert(is_compute_type<T>, "ring_attention supports float and double");
  const char* op = "ring_attention";
  detail::check_attention_devices(q, k, v, op);
  const auto p = detail::plan_ring_attention(q.value().spec(), k.value().spec(), v.value().spec(), opts.scale,
                                             opts.causal, opts.zigzag, op);
  return detail::ring_attention_planned(q, k, v, p, op);
}

/// All-to-all (Ulysses) attention: tokens -> heads redistribute, local attention, heads -> tokens
/// (see the file comment).
template <class T, int R>
Var<T, R> ulysses_attention(const Var<T, R>& q, const Var<T, R>& k, const Var<T, R>& v,
                            const UlyssesOptions& opts = {}) {
  static_assert(R >= 4, "ulysses_attention: q, k, v are [B, S..., H, Dh] (rank >= 4)");
  static_assert(is_compute_type<T>, "ulysses_attention supports float and double");
  const char* op = "ulysses_attention";
  detail::check_attention_devices(q, k, v, op);
  const DistSpec& qs = q.value().spec();
  // validates everything on the input specs (same error on every rank, before any collective)
  const auto p0 = detail::plan_ring_attention(qs, k.value().spec(), v.value().spec(), opts.scale, false, false, op);
  std::vector<int> u = detail::token_sharding_dims(qs);
  for (const DistSpec* s : {&k.value().spec(), &v.value().spec()})
    for (int m : detail::token_sharding_dims(*s))
      if (std::find(u.begin(), u.end(), m) == u.end()) u.push_back(m);
  auto heads = [&](const Var<T, R>& x) {
    auto pl = x.value().spec().placements();
    for (int m : u) pl[static_cast<std::size_t>(m)] = Shard(R - 2);
    return u.empty() ? x : autograd::redistribute(x, pl);
  };
  const Var<T, R> qh = heads(q), kh = heads(k), vh = heads(v);
  const auto p = detail::plan_ring_attention(qh.value().spec(), kh.value().spec(), vh.value().spec(), p0.scale,
                                             opts.causal, false, op, /*heads_sharded=*/true);
  auto oh = detail::ring_attention_planned(qh, kh, vh, p, op);
  if (u.empty()) return oh;
  auto og = qs.global_shape();
  og[static_cast<std::size_t>(R - 1)] = p.Dv;
  return autograd::redistribute(oh, detail::derived_spec(qs, qs.placements(), og));
}

}  // namespace shard::nn::functional
