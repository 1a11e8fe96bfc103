// Broadcasting rules of the pointwise ops (nn/functional/pointwise.hpp): the result spec and the
// gradient spec of each operand, computed from specs alone (identical on every rank).
#include "shardtensor/nn/functional/pointwise.hpp"

namespace shard::nn::functional::detail {
namespace {

index_t aligned_extent(const DistSpec& s, int R, int od) {
  const int d = od - (R - s.ndim());
  return d < 0 ? 1 : s.global_shape()[static_cast<std::size_t>(d)];
}

// Output dim sharded by placement p of an operand of rank rx (-1 if p is not Shard).
int aligned_dim(const Placement& p, int R, int rx) { return p.is_shard() ? p.dim + (R - rx) : -1; }

// Mesh dims sharding operand dim (od - (R - rx)) of s, or none if od is a leading missing dim.
std::vector<int> aligned_sharding(const DistSpec& s, int R, int od) {
  const int d = od - (R - s.ndim());
  return d < 0 ? std::vector<int>{} : s.sharding_mesh_dims(d);
}

}  // namespace

DistSpec broadcast_spec(const DistSpec& a, const DistSpec& b, const char* op) {
  const int R = std::max(a.ndim(), b.ndim());
  SHARD_CHECK(a.mesh() == b.mesh(), op, "operands live on different meshes: {}", mesh_mismatch(a.mesh(), b.mesh()));
  if (a == b) return a;  // same shape, placements and layouts: the result is laid out like both
  std::vector<index_t> g(static_cast<std::size_t>(R));
  for (int od = 0; od < R; ++od) {
    const index_t ea = aligned_extent(a, R, od), eb = aligned_extent(b, R, od);
    SHARD_CHECK(ea == eb || ea == 1 || eb == 1, op,
                "global shapes {} and {} do not broadcast (dim {} of the result: {} vs {})", a.global_shape(),
                b.global_shape(), od, ea, eb);
    g[static_cast<std::size_t>(od)] = std::max(ea, eb);
  }
  const auto& mesh = a.mesh();
  std::vector<Placement> pl(static_cast<std::size_t>(mesh.ndim()), Replicate());
  for (int m = 0; m < mesh.ndim(); ++m) {
    const Placement pa = a.placement(m), pb = b.placement(m);
    if (pa.is_partial() || pb.is_partial()) {  // identical specs only (checked by the caller)
      pl[static_cast<std::size_t>(m)] = pa;
      continue;
    }
    const int oa = aligned_dim(pa, R, a.ndim()), ob = aligned_dim(pb, R, b.ndim());
    SHARD_CHECK(oa < 0 || ob < 0 || oa == ob, op,
                "mesh dim {} shards different result dims of the operands ({} of {} vs {} of {})", m, pa, a, pb, b);
    const int od = std::max(oa, ob);
    if (od < 0) continue;
    const auto gd = g[static_cast<std::size_t>(od)];
    SHARD_CHECK(oa < 0 || aligned_extent(a, R, od) == gd, op,
                "lhs {} is sharded along a dim it broadcasts (extent 1 against {}) on mesh dim {}", a, gd, m);
    SHARD_CHECK(ob < 0 || aligned_extent(b, R, od) == gd, op,
                "rhs {} is sharded along a dim it broadcasts (extent 1 against {}) on mesh dim {}", b, gd, m);
    pl[static_cast<std::size_t>(m)] = Shard(od);
  }
  // Layouts of the result's sharded dims come from an operand sharding that dim by the same mesh dims.
  ShardSizes sizes(static_cast<std::size_t>(R));
  {
    DistSpec probe(mesh, pl, g);
    for (int od = 0; od < R; ++od) {
      const auto mo = probe.sharding_mesh_dims(od);
      if (mo.empty()) continue;
      const DistSpec* src = nullptr;
      for (const DistSpec* s : {&a, &b}) {
        if (src || aligned_sharding(*s, R, od) != mo) continue;
        src = s;
      }
      SHARD_CHECK(src != nullptr, op,
                  "result dim {} would be sharded by mesh dims {} but neither operand is sharded exactly so ({} vs {})",
                  od, mo, a, b);
      sizes[static_cast<std::size_t>(od)] = src->layout(od - (R - src->ndim())).sizes();
    }
  }
  DistSpec out(mesh, pl, g, sizes);
  // Every rank's result box must lie inside each operand's block on the dims it does not broadcast.
  for (int r = 0; r < mesh.size(); ++r) {
    const Box ob = out.box_of(r);
    if (ob.numel() == 0) continue;
    for (const DistSpec* s : {&a, &b}) {
      const Box xb = s->box_of(r);
      for (int od = 0; od < R; ++od) {
        if (is_broadcast_dim(*s, s->ndim(), out, od)) continue;
        const int d = od - (R - s->ndim());
        const auto lo = ob.lo[static_cast<std::size_t>(od)], hi = lo + ob.len[static_cast<std::size_t>(od)];
        const auto xlo = xb.lo[static_cast<std::size_t>(d)], xhi = xlo + xb.len[static_cast<std::size_t>(d)];
        SHARD_CHECK(xlo <= lo && hi <= xhi, op,
                    "operand {} (sizes {}) does not hold rank {}'s part [{}, {}) of result dim {} (it holds [{}, {})); "
                    "operands sharded along one dim need equal layouts",
                    *s, s->sizes(), r, lo, hi, od, xlo, xhi);
      }
    }
  }
  return out;
}

DistSpec operand_grad_spec(const DistSpec& xs, const DistSpec& out) {
  bool same = true;  // fast path: nothing changes (no allocation)
  for (int m = 0; m < xs.mesh().ndim() && same; ++m) {
    const auto& x = xs.placement(m);
    same = x.is_shard() || (x.is_replicate() && !out.placement(m).is_shard());
  }
  if (same) return xs;
  auto p = xs.placements();
  for (int m = 0; m < xs.mesh().ndim(); ++m) {
    auto& x = p[static_cast<std::size_t>(m)];
    if (x.is_shard()) continue;
    x = out.placement(m).is_shard() ? Partial(ReduceOp::sum) : Replicate();
  }
  return xs.with_placements(p, xs.sizes());
}

}  // namespace shard::nn::functional::detail
