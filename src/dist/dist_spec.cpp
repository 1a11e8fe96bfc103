#include "shardtensor/dist/dist_spec.hpp"

#include <algorithm>
#include <array>
#include <functional>

namespace shard {

Box Box::intersect(const Box& a, const Box& b) {
  Box r;
  r.lo.resize(a.lo.size());
  r.len.resize(a.lo.size());
  for (std::size_t d = 0; d < a.lo.size(); ++d) {
    const index_t lo = std::max(a.lo[d], b.lo[d]);
    const index_t hi = std::min(a.lo[d] + a.len[d], b.lo[d] + b.len[d]);
    r.lo[d] = lo;
    r.len[d] = std::max<index_t>(0, hi - lo);
  }
  return r;
}

bool Box::contains(const Box& inner) const {
  if (inner.numel() == 0) return true;
  for (std::size_t d = 0; d < lo.size(); ++d)
    if (inner.lo[d] < lo[d] || inner.lo[d] + inner.len[d] > lo[d] + len[d]) return false;
  return true;
}

namespace {

void mix(std::size_t& h, std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); }

// The explicit sizes given for dim d ("balanced" when none).
const std::vector<index_t>* given_sizes(const ShardSizes& s, std::size_t d) {
  return s.empty() || s[d].empty() ? nullptr : &s[d];
}

std::size_t key_of(const void* mesh, const std::vector<Placement>& pl, const std::vector<index_t>& g,
                   const ShardSizes& sizes) {
  std::size_t h = std::hash<const void*>{}(mesh);
  for (const auto& p : pl) mix(h, (static_cast<std::size_t>(p.kind) << 40) ^ (static_cast<std::size_t>(p.op) << 32) ^
                                      static_cast<std::size_t>(static_cast<unsigned>(p.dim)));
  mix(h, g.size());
  for (auto e : g) mix(h, static_cast<std::size_t>(e));
  if (sizes.size() == g.size())
    for (std::size_t d = 0; d < g.size(); ++d)
      if (const auto* s = given_sizes(sizes, d))
        for (auto e : *s) mix(h, static_cast<std::size_t>(e) + d);
  return h;
}

}  // namespace

const DistSpec::Impl& DistSpec::empty_impl() {
  static const Impl e;
  return e;
}

// Per-thread cache of recently built descriptions, held weakly (it never keeps a mesh or its
// communicators alive). A spec built from the same mesh, placements, global shape and explicit
// sizes as a live one shares that one's description.
namespace {
struct SpecCacheEntry {
  std::size_t key = 0;
  std::weak_ptr<const void> impl;
  ShardSizes given;  // the explicit sizes it was built from (normalised: empty when none)
};
}  // namespace

DistSpec::DistSpec(DeviceMesh mesh, std::vector<Placement> placements, std::vector<index_t> global_shape,
                   const ShardSizes& sizes) {
  const int nd = static_cast<int>(global_shape.size());
  SHARD_CHECK(sizes.empty() || static_cast<int>(sizes.size()) == nd, "DistSpec",
              "explicit sizes given for {} dims of a rank-{} tensor", sizes.size(), nd);
  const std::size_t key = key_of(mesh.id(), placements, global_shape, sizes);
  static constexpr std::size_t cache_slots = 16;
  thread_local std::array<SpecCacheEntry, cache_slots> cache;
  thread_local std::size_t next_slot = 0;
  for (auto& e : cache) {
    if (e.key != key) continue;
    auto sp = e.impl.lock();
    if (!sp) continue;
    const auto* hit = static_cast<const Impl*>(sp.get());
    if (!(*hit->mesh == mesh) || hit->placements != placements || hit->global != global_shape) continue;
    bool same = true;
    for (std::size_t d = 0; same && d < global_shape.size(); ++d) {
      const auto* a = given_sizes(sizes, d);
      const auto* b = given_sizes(e.given, d);
      same = (a == nullptr) == (b == nullptr) && (a == nullptr || *a == *b);
    }
    if (!same) continue;
    impl_ = std::shared_ptr<const Impl>(sp, hit);
    return;
  }

  auto im = std::make_shared<Impl>();
  im->mesh.emplace(std::move(mesh));
  im->placements = std::move(placements);
  im->global = std::move(global_shape);
  im->key = key;
  const DeviceMesh& m = *im->mesh;
  SHARD_CHECK(static_cast<int>(im->placements.size()) == m.ndim(), "DistSpec",
              "{} placements for a {}-D mesh {} (need one per mesh dim)", im->placements.size(), m.ndim(), m.shape());
  for (auto e : im->global) SHARD_CHECK(e >= 0, "DistSpec", "negative extent in global shape {}", im->global);
  // 16 bytes: the widest element (c128), so any tensor of this spec has a byte count that fits.
  SHARD_CHECK(numel_fits(im->global, 16), "DistSpec", "global shape {} overflows a 64-bit element/byte count",
              im->global);
  for (int md = 0; md < m.ndim(); ++md) {
    const auto& p = im->placements[static_cast<std::size_t>(md)];
    SHARD_CHECK(!p.is_shard() || (p.dim >= 0 && p.dim < nd), "DistSpec",
                "placement {} on mesh dim {} names tensor dim {}, outside a rank-{} tensor of shape {}", p, md, p.dim,
                nd, im->global);
    im->partial = im->partial || p.is_partial();
  }
  im->layouts.resize(static_cast<std::size_t>(nd));
  im->sharding.resize(static_cast<std::size_t>(nd));
  im->sizes.resize(static_cast<std::size_t>(nd));
  for (int d = 0; d < nd; ++d) {
    const auto du = static_cast<std::size_t>(d);
    for (int md = 0; md < m.ndim(); ++md)
      if (im->placements[static_cast<std::size_t>(md)].is_shard(d)) im->sharding[du].push_back(md);
    index_t parts = 1;
    for (int md : im->sharding[du]) parts *= m.size(md);
    if (const auto* s = given_sizes(sizes, du)) {
      SHARD_CHECK(static_cast<index_t>(s->size()) == parts, "DistSpec",
                  "tensor dim {} is split over {} parts but {} sizes were given ({})", d, parts, s->size(), *s);
      im->layouts[du] = ShardLayout::from_sizes(*s, im->global[du]);
      im->balanced = im->balanced && im->layouts[du].is_balanced();
    } else {
      im->layouts[du] = ShardLayout::balanced(im->global[du], parts);
    }
    if (parts > 1) im->sizes[du] = im->layouts[du].sizes();
  }
  impl_ = im;
  im->local = compute_box(m.coords());

  auto& slot = cache[next_slot];
  next_slot = (next_slot + 1) % cache_slots;
  slot.key = key;
  slot.impl = std::shared_ptr<const void>(impl_, impl_.get());
  slot.given.clear();
  if (!sizes.empty())
    for (std::size_t d = 0; d < sizes.size(); ++d)
      if (!sizes[d].empty()) {
        slot.given.resize(sizes.size());
        slot.given[d] = sizes[d];
      }
}

DistSpec DistSpec::with_placements(std::vector<Placement> placements, const ShardSizes& sizes) const {
  const Impl& i = im();
  if (impl_ && placements == i.placements && (sizes.empty() ? i.balanced : sizes == i.sizes)) return *this;
  return DistSpec(*i.mesh, std::move(placements), i.global, sizes);
}

index_t DistSpec::part_of(int d, const std::vector<int>& coords) const {
  index_t part = 0;
  for (int m : sharding_mesh_dims(d)) part = part * mesh().size(m) + coords[static_cast<std::size_t>(m)];
  return part;
}

Box DistSpec::compute_box(const std::vector<int>& c) const {
  Box b;
  b.lo.resize(global_shape().size());
  b.len.resize(global_shape().size());
  for (int d = 0; d < ndim(); ++d) {
    const auto part = part_of(d, c);
    b.lo[static_cast<std::size_t>(d)] = layout(d).offset(part);
    b.len[static_cast<std::size_t>(d)] = layout(d).size(part);
  }
  return b;
}

const Box& DistSpec::box_of(int r) const {
  SHARD_CHECK(impl_ != nullptr, "DistSpec::box_of", "empty spec");
  const auto& m = mesh();
  SHARD_CHECK(r >= 0 && r < m.size(), "DistSpec::box_of", "rank {} out of range for {} ranks", r, m.size());
  if (r == m.rank()) return impl_->local;
  std::call_once(impl_->boxes_once, [&] {
    impl_->boxes.resize(static_cast<std::size_t>(m.size()));
    for (int q = 0; q < m.size(); ++q) impl_->boxes[static_cast<std::size_t>(q)] = compute_box(m.coords_of(q));
  });
  return impl_->boxes[static_cast<std::size_t>(r)];
}

DistSpec derived_spec(const DistSpec& like, std::vector<Placement> placements, std::vector<index_t> global) {
  ShardSizes sizes(global.size());
  DistSpec probe(like.mesh(), placements, global);
  bool any = false;
  for (int d = 0; d < static_cast<int>(global.size()); ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (d >= like.ndim() || probe.sharding_mesh_dims(d).empty()) continue;
    if (probe.sharding_mesh_dims(d) == like.sharding_mesh_dims(d) && like.global_shape()[u] == global[u]) {
      sizes[u] = like.layout(d).sizes();
      any = true;
    }
  }
  if (!any) return probe;
  return DistSpec(like.mesh(), std::move(placements), std::move(global), sizes);
}

}  // namespace shard
