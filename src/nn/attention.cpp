// The schedule of domain-parallel attention (nn/functional/attention.hpp): the spec algebra that
// picks the variant (ring, replicated q, replicated k/v, local) and the causal / zigzag token
// runs, the K/V ring of the forward (split-phase shifts, dist/ring.hpp, overlapping each step's
// block attention; partials combined with the log-sum-exp merge) and the backward ring that sends
// the dK/dV accumulators around with K/V. Type-erased: Blocks, DistSpecs, the plan and the
// execution context of the operands' device; the local kernels are the attention family's fronts
// (exec/attention.hpp).
#include <cmath>
#include <limits>

#include "shardtensor/dist/ring.hpp"
#include "shardtensor/exec/attention.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/nn/functional/attention.hpp"

namespace shard::nn::functional::detail {

namespace {

/// A run of local tokens with contiguous global positions: rows [row0, row0 + n) of the local
/// block, global position of its first token pos0.
struct TokenRun {
  index_t row0 = 0, n = 0, pos0 = 0;
};

/// True when every rank's tokens of `s` are one contiguous range of the global row-major order:
/// at most one token dim is sharded and every token dim before it has extent 1. Sets `dim` to the
/// sharded token dim (or -1).
bool tokens_contiguous(const DistSpec& s, int& dim) {
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

/// The token runs of the block of `s` that mesh rank `rank` holds (one run, or two with zigzag).
std::vector<TokenRun> token_runs(const AttentionPlan& p, const DistSpec& s, int rank, int ring_index, int ring_size) {
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
  for (int d = 1; d <= R - 3; ++d)
    pos = pos * s.global_shape()[static_cast<std::size_t>(d)] + b.lo[static_cast<std::size_t>(d)];
  return {TokenRun{0, n, pos}};
}

/// True when the pair (query run, key run) has at least one unmasked score.
bool runs_interact(const AttentionPlan& p, const TokenRun& q, const TokenRun& k) {
  if (q.n == 0 || k.n == 0) return false;
  return !p.causal || k.pos0 <= q.pos0 + q.n - 1;
}

/// Local token count of a contiguous [B, S..., H, D] block.
index_t local_tokens(const Block& t) {
  index_t n = 1;
  for (int d = 1; d <= t.rank - 3; ++d) n *= t.shape[static_cast<std::size_t>(d)];
  return n;
}

char* elem(const Block& b, index_t i) {
  return static_cast<char*>(b.data) + i * static_cast<index_t>(b.element_bytes());
}

/// [B, H, n, D] view of the n rows [row0, row0 + n) of a contiguous token-major block [B, N, H, D].
Block heads_view(const Block& t, index_t N, index_t H, index_t D, index_t row0, index_t n) {
  return exec::attention_view(t.dtype, t.device, elem(t, row0 * H * D), t.shape[0], H, n, D, N * H * D, D, H * D);
}

/// The contiguous [B, H, n] log-sum-exps of the query run starting at row0 (runs are stored one
/// after the other).
Block lse_view(const Block& lse, index_t B, index_t H, index_t row0, index_t n) {
  const index_t len = B * H * n;
  return Block::view(lse.dtype, lse.device, elem(lse, B * H * row0), &len, 1);
}

/// Contiguous block of `s`'s block shape at ring position `from` (what a shift delivers).
Block ring_block(const DistSpec& s, const RingShift& ring, int from, DType dt, Device dev) {
  const Box& b = s.box_of(ring.mesh_rank_of(from));
  return Block::allocate(dt, dev, b.len);
}

/// Starts the ring shift of a pair of blocks (K and V, or their dK/dV accumulators) to the next
/// rank on channel `tag`, receiving ring position `from`'s pair into `na`, `nb` (allocated here
/// with that position's block shapes under `ks`, `vs`). Finish the returned transfer before
/// reading `na`, `nb` or reusing `a`, `b`.
RingShift::Transfer start_pair_shift(const RingShift& ring, const DistSpec& ks, const DistSpec& vs, int from,
                                     const Block& a, const Block& b, Block& na, Block& nb, ExecContext& ctx,
                                     int tag) {
  na = ring_block(ks, ring, from, a.dtype, a.device);
  nb = ring_block(vs, ring, from, b.dtype, b.device);
  const RingSegment seg[2] = {{a.data, a.numel(), na.data, na.numel()}, {b.data, b.numel(), nb.data, nb.numel()}};
  return ring.start(seg, a.dtype, RingDirection::forward, &ctx, tag);
}

/// Step `s` of `steps` of a K/V ring loop: starts the shift that brings step s+1's K/V block
/// (into `nk`, `nv`) while step s computes on `ck`, `cv`; an empty transfer at the last step.
RingShift::Transfer start_kv_shift(const RingShift& ring, const DistSpec& ks, const DistSpec& vs, int s, int steps,
                                   const Block& ck, const Block& cv, Block& nk, Block& nv, ExecContext& ctx) {
  if (s + 1 >= steps) return {};
  return start_pair_shift(ring, ks, vs, ring.neighbor(-(s + 1)), ck, cv, nk, nv, ctx, 0);
}

exec::AttnMask mask_of(const AttentionPlan& p, const TokenRun& qr, const TokenRun& kr) {
  exec::AttnMask m;
  m.scale = p.scale;
  m.causal = p.causal;
  m.q_pos0 = qr.pos0;
  m.k_pos0 = kr.pos0;
  return m;
}

/// A new contiguous block of b's dtype, device and shape (uninitialised).
Block empty_like(const Block& b) { return Block::allocate(b.dtype, b.device, b.shape.data(), b.rank); }

}  // namespace

std::vector<int> token_sharding_dims(const DistSpec& s) {
  const int R = s.ndim();
  return mesh_dims_sharding(s, [R](int d) { return d >= 1 && d <= R - 3; });
}

AttentionPlan plan_attention(const DistSpec& qs, const DistSpec& ks, const DistSpec& vs, double scale, bool causal,
                             bool zigzag, const char* op, bool heads_sharded) {
  const int R = qs.ndim();
  AttentionPlan p;
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
  using V = AttentionPlan::Variant;
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
  if (zigzag && causal && p.variant == V::local) {
    // Every token on every rank (nothing shards them): the zigzag order of a one-rank ring is the
    // identity (chunks 0 and 1 of 2, in order), so this is plain causal attention. A model written
    // with zigzag for P ranks then runs unsharded too (a 1-rank run, a CPU reference).
    p.zigzag = false;
  } else if (zigzag) {
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

void attention_forward(const AttentionPlan& p, const DistSpec& qs, const DistSpec& ks, const DistSpec& vs,
                       const Block& q, const Block& k, const Block& v, const Block& out, const Block& lse,
                       ExecContext& ctx) {
  const int R = q.rank;
  const RingShift ring(qs.mesh(), p.ring_dims);
  const index_t B = q.shape[0], H = q.shape[static_cast<std::size_t>(R - 2)], D = p.D, Dv = p.Dv,
                Nq = local_tokens(q);
  const bool travels =
      p.variant == AttentionPlan::Variant::ring || p.variant == AttentionPlan::Variant::q_replicated;
  const int steps = travels ? ring.size() : 1;
  const auto qruns = token_runs(p, qs, qs.mesh().rank(), ring.index(), ring.size());
  if (lse.dtype == DType::f64) {
    const double ninf = -std::numeric_limits<double>::infinity();
    exec::box_fill(lse, &ninf, ctx);
  } else {
    const float ninf = -std::numeric_limits<float>::infinity();
    exec::box_fill(lse, &ninf, ctx);
  }
  exec::box_zero(out, ctx);
  const Block tmp = empty_like(out);
  const Block tmp_lse = empty_like(lse);
  Block ck = k, cv = v;
  for (int s = 0; s < steps; ++s) {
    const int j = ring.neighbor(-s);  // ring position whose K/V block this rank holds now
    Block nk, nv;
    RingShift::Transfer tr = start_kv_shift(ring, ks, vs, s, steps, ck, cv, nk, nv, ctx);
    const int owner = travels ? ring.mesh_rank_of(j) : ks.mesh().rank();
    const auto kruns = token_runs(p, ks, owner, j, ring.size());
    const index_t Nk = local_tokens(ck);
    for (const auto& qr : qruns)
      for (const auto& kr : kruns) {
        if (!runs_interact(p, qr, kr) || B == 0) continue;
        const exec::AttnGeom g{B, H, qr.n, kr.n, D, Dv};
        const Block tl = lse_view(tmp_lse, B, H, qr.row0, qr.n);
        const Block tout = heads_view(tmp, Nq, H, Dv, qr.row0, qr.n);
        exec::attention_forward(g, mask_of(p, qr, kr), heads_view(q, Nq, H, D, qr.row0, qr.n),
                                heads_view(ck, Nk, H, D, kr.row0, kr.n), heads_view(cv, Nk, H, Dv, kr.row0, kr.n),
                                nullptr, tout, tl, ctx);
        exec::attention_merge(g, heads_view(out, Nq, H, Dv, qr.row0, qr.n), lse_view(lse, B, H, qr.row0, qr.n), tout,
                              tl, ctx);
      }
    tr.finish();
    if (s + 1 < steps) {
      ck = nk;
      cv = nv;
    }
  }
}

AttentionKVGrad attention_backward(const AttentionPlan& p, const DistSpec& qs, const DistSpec& ks, const DistSpec& vs,
                                   const Block& q, const Block& k, const Block& v, const Block& out, const Block& lse,
                                   const Block& dout, const Block* dq, bool need_dkv, ExecContext& ctx) {
  using V = AttentionPlan::Variant;
  const int R = q.rank;
  const RingShift ring(qs.mesh(), p.ring_dims);
  const bool need_dq = dq != nullptr;
  const index_t B = q.shape[0], H = q.shape[static_cast<std::size_t>(R - 2)], D = p.D, Dv = p.Dv,
                Nq = local_tokens(q);
  const bool travels = p.variant == V::ring || p.variant == V::q_replicated;
  // dK/dV accumulators travel only when every rank's queries touch every block (the ring).
  const bool acc_travels = p.variant == V::ring && need_dkv;
  const int steps = (travels && (need_dq || acc_travels)) ? ring.size() : 1;
  const auto qruns = token_runs(p, qs, qs.mesh().rank(), ring.index(), ring.size());
  if (need_dq) exec::box_zero(*dq, ctx);
  Block ck = k, cv = v;
  Block acc_k, acc_v;  // accumulators of the block held now (ring), in flight between steps
  Block in_k, in_v;    // accumulators arriving
  RingShift::Transfer acc_tr;
  for (int s = 0; s < steps; ++s) {
    const int j = ring.neighbor(-s);
    Block nk, nv;
    RingShift::Transfer tr = start_kv_shift(ring, ks, vs, s, steps, ck, cv, nk, nv, ctx);
    const int owner = travels ? ring.mesh_rank_of(j) : ks.mesh().rank();
    const auto kruns = token_runs(p, ks, owner, j, ring.size());
    const index_t Nk = local_tokens(ck);
    // this step's dK/dV contribution: own block at step 0 (every variant), every block on the ring
    const bool dkv_now = need_dkv && (s == 0 || acc_travels);
    Block tk, tv;
    if (dkv_now) {
      tk = empty_like(ck);
      tv = empty_like(cv);
      exec::box_zero(tk, ctx);
      exec::box_zero(tv, ctx);
    }
    for (const auto& qr : qruns)
      for (const auto& kr : kruns) {
        if (!runs_interact(p, qr, kr) || B == 0 || (!need_dq && !dkv_now)) continue;
        const exec::AttnGeom g{B, H, qr.n, kr.n, D, Dv};
        Block odq, odk, odv;
        if (need_dq) odq = heads_view(*dq, Nq, H, D, qr.row0, qr.n);
        if (dkv_now) {
          odk = heads_view(tk, Nk, H, D, kr.row0, kr.n);
          odv = heads_view(tv, Nk, H, Dv, kr.row0, kr.n);
        }
        exec::attention_backward(g, mask_of(p, qr, kr), heads_view(q, Nq, H, D, qr.row0, qr.n),
                                 heads_view(ck, Nk, H, D, kr.row0, kr.n), heads_view(cv, Nk, H, Dv, kr.row0, kr.n),
                                 nullptr, heads_view(out, Nq, H, Dv, qr.row0, qr.n),
                                 heads_view(dout, Nq, H, Dv, qr.row0, qr.n), lse_view(lse, B, H, qr.row0, qr.n),
                                 need_dq ? &odq : nullptr, dkv_now ? &odk : nullptr, dkv_now ? &odv : nullptr, ctx);
      }
    if (dkv_now) {
      if (s == 0) {
        acc_k = tk;
        acc_v = tv;
      } else {  // the accumulator of block j arrived from the previous rank: add this rank's part
        acc_tr.finish();
        exec::box_add(in_k, tk, ctx);
        exec::box_add(in_v, tv, ctx);
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
  if (!need_dkv) return {};
  if (acc_travels && ring.size() > 1) {
    acc_tr.finish();
    return {in_k, in_v};
  }
  return {acc_k, acc_v};
}

}  // namespace shard::nn::functional::detail
