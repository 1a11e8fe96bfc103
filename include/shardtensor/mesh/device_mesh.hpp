#pragma once
/// \file device_mesh.hpp
/// DeviceMesh: an N-D grid of ranks over a communicator, with a sub-communicator per mesh dim
/// and per set of mesh dims. Ranks are laid out row-major over the mesh shape.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardtensor/comm/communicator.hpp"

namespace shard {

/// N-D grid of ranks. Copies share the communicators (cheap to pass by value).
class DeviceMesh {
 public:
  /// Mesh of shape `shape` over `comm` (prod(shape) must equal comm->size(); checked on every
  /// rank, and the shape must agree across ranks). Empty shape = 1-D mesh of all ranks.
  /// Collective: creates one sub-communicator per mesh dim.
  DeviceMesh(CommPtr comm, std::vector<int> shape = {}, std::vector<std::string> dim_names = {});
  /// Mesh over default_comm() (a duplicate of MPI_COMM_WORLD, or a SelfComm without MPI).
  static DeviceMesh world(std::vector<int> shape = {}, std::vector<std::string> dim_names = {});

  int ndim() const { return static_cast<int>(impl_->shape.size()); }
  /// Number of ranks along mesh dim m.
  int size(int m) const { return impl_->shape[static_cast<std::size_t>(m)]; }
  /// Total number of ranks.
  int size() const { return impl_->comm->size(); }
  const std::vector<int>& shape() const { return impl_->shape; }
  const std::vector<std::string>& dim_names() const { return impl_->names; }
  /// Index of the mesh dim called `name` (throws if none).
  int dim_index(const std::string& name) const;
  /// This rank in the mesh communicator.
  int rank() const { return impl_->comm->rank(); }
  /// This rank's coordinate along mesh dim m.
  int coord(int m) const { return impl_->coords[static_cast<std::size_t>(m)]; }
  const std::vector<int>& coords() const { return impl_->coords; }
  /// Coordinates of mesh rank r.
  std::vector<int> coords_of(int r) const;
  /// Mesh rank at `coords`.
  int rank_of(const std::vector<int>& coords) const;

  /// The whole mesh's communicator.
  const CommPtr& comm() const { return impl_->comm; }
  /// Ranks that share every coordinate but m's, ordered by coordinate m.
  const CommPtr& dim_comm(int m) const { return impl_->dim_comms[static_cast<std::size_t>(m)]; }
  /// Ranks that share every coordinate outside `dims`, ordered row-major over `dims` (ascending
  /// mesh dim order). Collective on first use for a given set (every rank must make that first
  /// call, in the same order as its other collectives); cached afterwards. Thread-safe: the cache
  /// is locked, so threads may look up sets concurrently (a first use still runs one split,
  /// under the lock).
  CommPtr dims_comm(std::vector<int> dims) const;

  friend bool operator==(const DeviceMesh& a, const DeviceMesh& b) { return a.impl_ == b.impl_; }
  /// Identity of the shared mesh state (equal for copies of one mesh; a hash/cache key).
  const void* id() const noexcept { return impl_.get(); }

 private:
  struct Impl {
    CommPtr comm;
    std::vector<int> shape;
    std::vector<std::string> names;
    std::vector<int> coords;
    std::vector<CommPtr> dim_comms;
    mutable std::mutex set_comms_mutex;                     ///< guards set_comms
    mutable std::map<std::vector<int>, CommPtr> set_comms;  ///< key: sorted mesh dims (any count)
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace shard

template <> struct fmt::formatter<shard::DeviceMesh> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx> auto format(const shard::DeviceMesh& m, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "DeviceMesh(shape={}, names={}, rank={}, coords={})", m.shape(), m.dim_names(),
                          m.rank(), m.coords());
  }
};
