#include "shardtensor/dist/dist_spec.hpp"

#include <algorithm>

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

DistSpec::DistSpec(DeviceMesh mesh, std::vector<Placement> placements, std::vector<index_t> global_shape,
                   const ShardSizes& sizes)
    : mesh_(std::move(mesh)), placements_(std::move(placements)), global_(std::move(global_shape)) {
  const int nd = ndim();
  SHARD_CHECK(static_cast<int>(placements_.size()) == mesh_->ndim(), "DistSpec",
              "{} placements for a {}-D mesh {} (need one per mesh dim)", placements_.size(), mesh_->ndim(),
              mesh_->shape());
  for (auto e : global_) SHARD_CHECK(e >= 0, "DistSpec", "negative extent in global shape {}", global_);
  for (int m = 0; m < mesh_->ndim(); ++m) {
    const auto& p = placements_[static_cast<std::size_t>(m)];
    SHARD_CHECK(!p.is_shard() || (p.dim >= 0 && p.dim < nd), "DistSpec",
                "placement {} on mesh dim {} names tensor dim {}, outside a rank-{} tensor of shape {}", p, m, p.dim,
                nd, global_);
  }
  SHARD_CHECK(sizes.empty() || static_cast<int>(sizes.size()) == nd, "DistSpec",
              "explicit sizes given for {} dims of a rank-{} tensor", sizes.size(), nd);
  layouts_.resize(static_cast<std::size_t>(nd));
  for (int d = 0; d < nd; ++d) {
    index_t parts = 1;
    for (int m : sharding_mesh_dims(d)) parts *= mesh_->size(m);
    const bool explicit_sizes = !sizes.empty() && !sizes[static_cast<std::size_t>(d)].empty();
    if (explicit_sizes) {
      const auto& s = sizes[static_cast<std::size_t>(d)];
      SHARD_CHECK(static_cast<index_t>(s.size()) == parts, "DistSpec",
                  "tensor dim {} is split over {} parts but {} sizes were given ({})", d, parts, s.size(), s);
      layouts_[static_cast<std::size_t>(d)] = ShardLayout::from_sizes(s, global_[static_cast<std::size_t>(d)]);
    } else {
      layouts_[static_cast<std::size_t>(d)] = ShardLayout::balanced(global_[static_cast<std::size_t>(d)], parts);
    }
  }
}

std::vector<int> DistSpec::sharding_mesh_dims(int d) const {
  std::vector<int> out;
  for (int m = 0; m < static_cast<int>(placements_.size()); ++m)
    if (placements_[static_cast<std::size_t>(m)].is_shard(d)) out.push_back(m);
  return out;
}

index_t DistSpec::part_of(int d, const std::vector<int>& coords) const {
  index_t part = 0;
  for (int m : sharding_mesh_dims(d)) part = part * mesh_->size(m) + coords[static_cast<std::size_t>(m)];
  return part;
}

Box DistSpec::box_of(int r) const {
  const auto c = mesh_->coords_of(r);
  Box b;
  b.lo.resize(global_.size());
  b.len.resize(global_.size());
  for (int d = 0; d < ndim(); ++d) {
    const auto part = part_of(d, c);
    b.lo[static_cast<std::size_t>(d)] = layout(d).offset(part);
    b.len[static_cast<std::size_t>(d)] = layout(d).size(part);
  }
  return b;
}

bool DistSpec::has_partial() const {
  return std::any_of(placements_.begin(), placements_.end(), [](const Placement& p) { return p.is_partial(); });
}

ShardSizes DistSpec::sizes() const {
  ShardSizes s(static_cast<std::size_t>(ndim()));
  for (int d = 0; d < ndim(); ++d)
    if (layout(d).parts() > 1) s[static_cast<std::size_t>(d)] = layout(d).sizes();
  return s;
}

}  // namespace shard
