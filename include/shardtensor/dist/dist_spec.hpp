#pragma once
/// \file dist_spec.hpp
/// DistSpec: the type-erased description of how a global tensor lies on a DeviceMesh — global
/// shape, one Placement per mesh dim, and one ShardLayout per tensor dim. Pure algebra (no data).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <optional>
#include <vector>

#include "shardtensor/mesh/device_mesh.hpp"
#include "shardtensor/mesh/placement.hpp"
#include "shardtensor/mesh/shard_layout.hpp"

namespace shard {

/// Explicit per-part sizes per tensor dim; an empty entry means "balanced rule".
using ShardSizes = std::vector<std::vector<index_t>>;

/// A box [lo, lo+len) in global index space (dynamic rank).
struct Box {
  std::vector<index_t> lo, len;
  index_t numel() const {
    index_t n = 1;
    for (auto l : len) n *= l;
    return n;
  }
  /// Intersection of two boxes (len 0 where they do not overlap).
  static Box intersect(const Box& a, const Box& b);
  /// True if `inner` lies entirely inside this box (empty boxes are inside anything).
  bool contains(const Box& inner) const;
  friend bool operator==(const Box&, const Box&) = default;
};

/// Placement of a global tensor on a mesh. When several mesh dims shard the same tensor dim,
/// that dim is split over the product of their sizes with one layout, parts numbered row-major
/// over those mesh dims in ascending order.
class DistSpec {
 public:
  DistSpec() = default;
  /// Validates (locally) and builds the layouts: balanced unless `sizes[d]` is non-empty.
  DistSpec(DeviceMesh mesh, std::vector<Placement> placements, std::vector<index_t> global_shape,
           const ShardSizes& sizes = {});

  const DeviceMesh& mesh() const { return *mesh_; }
  const std::vector<Placement>& placements() const { return placements_; }
  const Placement& placement(int m) const { return placements_[static_cast<std::size_t>(m)]; }
  const std::vector<index_t>& global_shape() const { return global_; }
  int ndim() const { return static_cast<int>(global_.size()); }
  /// Layout of tensor dim d (1 part if no mesh dim shards it).
  const ShardLayout& layout(int d) const { return layouts_[static_cast<std::size_t>(d)]; }
  const std::vector<ShardLayout>& layouts() const { return layouts_; }
  /// Mesh dims that shard tensor dim d, ascending.
  std::vector<int> sharding_mesh_dims(int d) const;
  /// Part index along tensor dim d of the rank at mesh coordinates `coords`.
  index_t part_of(int d, const std::vector<int>& coords) const;
  /// Global box held by mesh rank r.
  Box box_of(int r) const;
  /// Global box held by this rank.
  Box local_box() const { return box_of(mesh_->rank()); }
  /// True if any placement is Partial.
  bool has_partial() const;
  /// The explicit sizes of every sharded dim (balanced dims included, as their sizes).
  ShardSizes sizes() const;
  /// Same mesh and global shape, other placements; layouts balanced unless `sizes` given.
  DistSpec with_placements(std::vector<Placement> placements, const ShardSizes& sizes = {}) const {
    return DistSpec(*mesh_, std::move(placements), global_, sizes);
  }
  /// Equal placements and layouts on the same mesh.
  friend bool operator==(const DistSpec& a, const DistSpec& b) {
    return a.placements_ == b.placements_ && a.global_ == b.global_ && a.layouts_ == b.layouts_;
  }

 private:
  std::optional<DeviceMesh> mesh_;
  std::vector<Placement> placements_;
  std::vector<index_t> global_;
  std::vector<ShardLayout> layouts_;
};

}  // namespace shard

template <> struct fmt::formatter<shard::DistSpec> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx> auto format(const shard::DistSpec& s, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "DistSpec(global={}, mesh={}, placements=[", s.global_shape(),
                              s.mesh().shape());
    for (std::size_t i = 0; i < s.placements().size(); ++i)
      out = fmt::format_to(out, "{}{}", i ? ", " : "", s.placements()[i]);
    return fmt::format_to(out, "])");
  }
};
