// The domain-parallel neighbourhood attention (nn/functional/neighborhood_attention.hpp): its spec
// algebra (option and operand checks, the k/v halo and the local kernel's geometry on this rank;
// pure: no communication, every check depends on specs alone) and its schedule (the k/v halo
// exchanges of dist/halo.hpp, the nbhd_attention kernels of exec/neighborhood.hpp, the halo
// adjoint overlapping the dq kernel). Type-erased: Blocks, specs, the plan, the context.
#include "shardtensor/nn/functional/neighborhood_attention.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "shardtensor/exec/box.hpp"

namespace shard::nn::functional::detail {

void check_nbhd_options(const char* op, int spatial, const NeighborhoodOptions& o) {
  const auto n = static_cast<std::size_t>(spatial);
  SHARD_CHECK(o.window.size() == n, op, "window has {} entries, the operands have {} spatial dims", o.window.size(),
              spatial);
  SHARD_CHECK(o.dilation.empty() || o.dilation.size() == n, op,
              "dilation has {} entries, the operands have {} spatial dims (or give none)", o.dilation.size(), spatial);
  SHARD_CHECK(o.periodic.empty() || o.periodic.size() == n, op,
              "periodic has {} entries, the operands have {} spatial dims (or give none)", o.periodic.size(), spatial);
  for (std::size_t d = 0; d < n; ++d) {
    SHARD_CHECK(o.window[d] >= 1, op, "window {} must be >= 1 in every spatial dim", o.window);
    SHARD_CHECK(o.dilation.empty() || o.dilation[d] >= 1, op, "dilation {} must be >= 1 in every spatial dim",
                o.dilation);
  }
  SHARD_CHECK(std::isfinite(o.scale) && o.scale >= 0, op, "scale {} must be finite and >= 0 (0: 1/sqrt(Dh))",
              o.scale);
}

NbhdPlan make_nbhd_plan(const char* op, const DistSpec& qs, const DistSpec& ks, const DistSpec& vs,
                        const NeighborhoodOptions& o) {
  const int R = qs.ndim();
  const int S = R - 3;
  check_nbhd_options(op, S, o);
  // Operands: one mesh, one placement list, one layout of every dim but v's head dim.
  SHARD_CHECK(qs.mesh() == ks.mesh() && qs.mesh() == vs.mesh(), op, "q, k, v live on different meshes: {}",
              mesh_mismatch(qs.mesh(), qs.mesh() == ks.mesh() ? vs.mesh() : ks.mesh()));
  SHARD_CHECK(qs.placements() == ks.placements() && qs.placements() == vs.placements(), op,
              "q, k, v must have the same placements: q {} k {} v {}", qs, ks, vs);
  SHARD_CHECK(qs.global_shape() == ks.global_shape(), op,
              "q and k must have the same shape [B, S..., H, Dh]: q {} k {} (heads or head dims differ?)",
              qs.global_shape(), ks.global_shape());
  for (int d = 0; d < R - 1; ++d)
    SHARD_CHECK(vs.global_shape()[static_cast<std::size_t>(d)] == qs.global_shape()[static_cast<std::size_t>(d)], op,
                "v {} must match q {} in every dim but the head dim", vs.global_shape(), qs.global_shape());
  for (int d = 0; d < R; ++d) {
    SHARD_CHECK(qs.layout(d) == ks.layout(d) && (d == R - 1 || qs.layout(d) == vs.layout(d)), op,
                "q, k, v must be split alike along dim {}: q {} k {} v {}", d, qs.layout(d).sizes(),
                ks.layout(d).sizes(), vs.layout(d).sizes());
  }
  check_unsharded(qs, R - 2, op, "q/k/v (heads)");
  check_unsharded(qs, R - 1, op, "q/k/v (head dim)");
  check_unsharded(vs, R - 1, op, "v (head dim)");
  check_no_partial(qs, op, "q");

  NbhdPlan p;
  const auto& gl = qs.global_shape();
  const Box qb = qs.local_box();
  p.halo.lo.assign(static_cast<std::size_t>(R), 0);
  p.halo.hi.assign(static_cast<std::size_t>(R), 0);
  p.halo.modes.assign(static_cast<std::size_t>(R), Boundary::zero);
  auto& g = p.geom;
  g.B = qb.len[0];
  g.H = gl[static_cast<std::size_t>(R - 2)];
  g.D = gl[static_cast<std::size_t>(R - 1)];
  g.Dv = vs.global_shape()[static_cast<std::size_t>(R - 1)];
  g.scale = o.scale > 0 ? o.scale : (g.D > 0 ? 1.0 / std::sqrt(static_cast<double>(g.D)) : 1.0);
  for (int d = 0; d < S; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const int td = 1 + d, kd = 3 - S + d;
    const auto tu = static_cast<std::size_t>(td);
    const index_t n = gl[tu], w = o.window[u], dil = o.dilation.empty() ? 1 : o.dilation[u];
    const bool per = !o.periodic.empty() && o.periodic[u];
    if (per)
      SHARD_CHECK(dil * (w - 1) < n, op,
                  "periodic window {} with dilation {} spans {} sites along spatial dim {} of extent {}: a periodic "
                  "window must fit in the domain (dilation * (window - 1) < extent)",
                  w, dil, dil * (w - 1) + 1, d, n);
    else
      SHARD_CHECK(w <= n, op, "window {} is larger than the domain along spatial dim {} (extent {})", w, d, n);
    g.window[kd] = w;
    g.dilation[kd] = dil;
    const index_t a = qb.lo[tu], len = qb.len[tu];
    g.nq[kd] = len;
    if (!qs.sharding_mesh_dims(td).empty()) {
      const index_t rl = dil * exec::nbhd_reach_lo(w), rh = dil * exec::nbhd_reach_hi(w);
      const index_t lo = per ? rl : std::min(rl, n), hi = per ? rh : std::min(rh, n);
      p.halo.lo[tu] = lo;
      p.halo.hi[tu] = hi;
      p.halo.modes[tu] = per ? Boundary::periodic : Boundary::zero;
      g.nk[kd] = len + lo + hi;
      g.qoff[kd] = lo;
      const index_t g0 = a - lo;  // global index of key block cell 0 (unwrapped)
      g.valid_lo[kd] = per ? 0 : std::clamp<index_t>(-g0, 0, g.nk[kd]);
      g.valid_hi[kd] = per ? g.nk[kd] : std::clamp<index_t>(n - g0, 0, g.nk[kd]);
      p.exchange = p.exchange || lo > 0 || hi > 0;
    } else {
      g.nk[kd] = n;
      g.qoff[kd] = 0;
      g.valid_lo[kd] = 0;
      g.valid_hi[kd] = n;
      g.wrap[kd] = per;
    }
  }
  std::vector<index_t> og = gl;
  og[static_cast<std::size_t>(R - 1)] = g.Dv;
  p.out_spec = derived_spec(qs, qs.placements(), og);
  return p;
}

namespace {

using shard::HaloTransfer;

/// t as the kernels read it: as it is when its head-feature dim has unit stride (any other
/// strides: e.g. the interior of a user's halo-padded array, read in place on every device),
/// else one contiguous copy on its device.
Block kernel_operand(const Block& t, ExecContext& ctx) {
  const auto last = static_cast<std::size_t>(t.rank - 1);
  if (t.strides[last] == 1 || t.shape[last] <= 1) return t;
  Block c = Block::allocate(t.dtype, t.device, t.shape.data(), t.rank);
  exec::box_copy(c, t, ctx);
  return c;
}

Block nbhd_empty_like(const Block& b) { return Block::allocate(b.dtype, b.device, b.shape.data(), b.rank); }

}  // namespace

NbhdSaved neighborhood_attention_forward(const NbhdPlan& p, const DistSpec& ks, const DistSpec& vs, const Block& q,
                                         const Block& k, const Block& v, const Block& out, const Block& lse,
                                         ExecContext& ctx) {
  NbhdSaved s;
  if (p.exchange) {
    // Both exchanges are in flight together (every rank posts k's messages before v's, so the
    // equal tags of the two transfers match in order).
    HaloTransfer hk(k.dtype, ks, p.halo, HaloTransfer::Direction::forward, k);
    HaloTransfer hv(v.dtype, vs, p.halo, HaloTransfer::Direction::forward, v);
    s.kx = hk.finish();
    s.vx = hv.finish();
  } else {
    s.kx = kernel_operand(k, ctx);
    s.vx = kernel_operand(v, ctx);
  }
  s.q = kernel_operand(q, ctx);
  exec::nbhd_attention_forward(p.geom, s.q, s.kx, s.vx, out, lse, ctx);
  return s;
}

NbhdGrads neighborhood_attention_backward(const NbhdPlan& p, const DistSpec& ks, const DistSpec& vs,
                                          const NbhdSaved& saved, const Block& out, const Block& lse, const Block& dout,
                                          bool need_dq, bool need_dk, bool need_dv, ExecContext& ctx) {
  NbhdGrads d;
  if (need_dq) d.dq = nbhd_empty_like(saved.q);
  if (need_dk) d.dk = nbhd_empty_like(saved.kx);
  if (need_dv) {
    d.dv = nbhd_empty_like(saved.vx);
  }
  auto kernel = [&](const Block* a, const Block* b, const Block* c) {
    exec::nbhd_attention_backward(p.geom, saved.q, saved.kx, saved.vx, out, dout, lse, a, b, c, ctx);
  };
  const Block* dq = need_dq ? &d.dq : nullptr;
  const Block* dk = need_dk ? &d.dk : nullptr;
  const Block* dv = need_dv ? &d.dv : nullptr;
  const bool overlap = p.exchange && (need_dk || need_dv);
  // With halos: dk and dv first, then their adjoints (both in flight together, posted in the
  // same order on every rank) overlap the dq kernel.
  kernel(overlap ? nullptr : dq, dk, dv);
  std::optional<HaloTransfer> ak, av;
  if (p.exchange && need_dk) ak.emplace(d.dk.dtype, ks, p.halo, HaloTransfer::Direction::adjoint, d.dk, true);
  if (p.exchange && need_dv) av.emplace(d.dv.dtype, vs, p.halo, HaloTransfer::Direction::adjoint, d.dv, true);
  if (overlap && need_dq) kernel(dq, nullptr, nullptr);
  if (ak) d.dk = ak->finish();
  if (av) d.dv = av->finish();
  return d;
}

}  // namespace shard::nn::functional::detail
