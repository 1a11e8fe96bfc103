#pragma once
/// \file dist_spec.hpp
/// DistSpec: the type-erased description of how a global tensor lies on a DeviceMesh — global
/// shape, one Placement per mesh dim, and one ShardLayout per tensor dim. Pure algebra (no data).
///
/// A DistSpec is a handle to a shared immutable description: the layouts, this rank's box, every
/// rank's box (on first use), the sharding mesh dims of each tensor dim and the shard sizes are
/// computed once. Copies share it (one reference-count increment), equality short-circuits on the
/// same description, and building a spec equal to a recently built one that is still alive reuses
/// its description (a small per-thread cache), so spec algebra repeated op after op is cheap.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <memory>
#include <mutex>
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

  const DeviceMesh& mesh() const { return *im().mesh; }
  const std::vector<Placement>& placements() const { return im().placements; }
  const Placement& placement(int m) const { return im().placements[static_cast<std::size_t>(m)]; }
  const std::vector<index_t>& global_shape() const { return im().global; }
  int ndim() const { return static_cast<int>(im().global.size()); }
  /// Layout of tensor dim d (1 part if no mesh dim shards it).
  const ShardLayout& layout(int d) const { return im().layouts[static_cast<std::size_t>(d)]; }
  const std::vector<ShardLayout>& layouts() const { return im().layouts; }
  /// Mesh dims that shard tensor dim d, ascending (cached).
  const std::vector<int>& sharding_mesh_dims(int d) const { return im().sharding[static_cast<std::size_t>(d)]; }
  /// Part index along tensor dim d of the rank at mesh coordinates `coords`.
  index_t part_of(int d, const std::vector<int>& coords) const;
  /// Global box held by mesh rank r (every rank's box is computed once, on first use).
  const Box& box_of(int r) const;
  /// Global box held by this rank (computed with the spec).
  const Box& local_box() const { return im().local; }
  /// True if any placement is Partial.
  bool has_partial() const { return im().partial; }
  /// The explicit sizes of every sharded dim (balanced dims included, as their sizes; empty
  /// entries for dims split into one part).
  const ShardSizes& sizes() const { return im().sizes; }
  /// Same mesh and global shape, other placements; layouts balanced unless `sizes` given.
  /// Returns this spec itself when nothing changes.
  DistSpec with_placements(std::vector<Placement> placements, const ShardSizes& sizes = {}) const;
  /// Equal placements and layouts on the same mesh (immediate for two handles of one description).
  friend bool operator==(const DistSpec& a, const DistSpec& b) {
    if (a.impl_ == b.impl_) return true;
    const Impl& x = a.im();
    const Impl& y = b.im();
    return x.placements == y.placements && x.global == y.global && x.layouts == y.layouts;
  }

 private:
  /// The shared immutable description.
  struct Impl {
    std::optional<DeviceMesh> mesh;
    std::vector<Placement> placements;
    std::vector<index_t> global;
    std::vector<ShardLayout> layouts;
    std::vector<std::vector<int>> sharding;  ///< sharding_mesh_dims per tensor dim
    ShardSizes sizes;                        ///< sizes() (parts > 1 only)
    Box local;                               ///< this rank's box
    bool partial = false;                    ///< any Partial placement
    bool balanced = true;                    ///< every layout follows the balanced rule
    std::size_t key = 0;                     ///< hash of (mesh, placements, global, normalised sizes)
    mutable std::once_flag boxes_once;
    mutable std::vector<Box> boxes;  ///< every rank's box, filled on the first box_of
  };
  static const Impl& empty_impl();
  const Impl& im() const { return impl_ ? *impl_ : empty_impl(); }
  Box compute_box(const std::vector<int>& coords) const;
  std::shared_ptr<const Impl> impl_;
};

/// A spec on `like`'s mesh with `placements` and `global`, keeping `like`'s explicit shard sizes
/// for every tensor dim that stays sharded by the same mesh dims with the same extent (balanced
/// elsewhere): the layout an op's output inherits from its input.
DistSpec derived_spec(const DistSpec& like, std::vector<Placement> placements, std::vector<index_t> global);

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
