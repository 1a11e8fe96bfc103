#pragma once
/// \file ghosts.hpp
/// Ghost layers of a user's halo-padded array, declared to shardtensor so that ops read them
/// instead of running their own halo exchange (issue 8, "ghost reuse").
///
/// A simulation holds its field in an array with ghost layers that its own exchange (or
/// shard::fill_ghosts) has just filled. `DistTensor::from_local(interior_view, mesh, placements,
/// sizes, GhostLayers{...})` (sizes `{}`: gathered) views the interior (zero-copy, as from_local always does) and
/// records that the memory around it holds valid ghost cells. The contract:
///  - **Widths.** `lo[d]` / `hi[d]` cells below / above the interior along tensor dim d, at the
///    view's own strides: the cell at local index i (i < 0 or i >= extent along d) is at
///    `data() + i * stride[d]`. Every rank declares the same widths and edge modes (checked
///    collectively by from_local: shard::Error on every rank otherwise, never a hang); widths
///    are >= 0; a dim with ghosts needs a positive stride (a broadcast dim cannot have ghosts).
///    That this memory exists (lies inside the user's allocation) is the user's promise: it
///    cannot be checked.
///  - **Values.** A ghost cell holds the value of the global tensor at its global index (the
///    neighbour's cell, several ranks away when the ghosts are wider than a neighbour's part, and
///    the corners of 2-D/3-D decompositions), exactly what halo_exchange gives. Beyond the global
///    domain edge it holds the dim's `edge` mode (zero, periodic, reflect, replicate), or, when
///    `edge[d]` is empty, nothing valid: then only the ghosts between ranks may be read.
///  - **Validity and versions.** The ghosts are valid at the storage version of the view when
///    they are declared (Tensor::version(), docs/embedding.md "Versions"). A write the library
///    sees, or one the user declares with shard::mark_modified / bump_version(), makes them stale
///    until `DistTensor::mark_ghosts_valid()` (after the simulation's next exchange) or
///    shard::fill_ghosts into the same array declares them valid again. An untracked view
///    (Tensor::view not declared stable) has no version: the user promises that its ghosts match
///    its interior whenever an op runs. `mark_ghosts_stale()` withdraws them.
///  - **Use.** An op that needs ghost widths <= the declared ones reads the user's ghost cells
///    and runs no exchange when, on every halo dim, the op's boundary mode is the declared edge
///    mode (or the op reads no ghost cell beyond the domain edge: conv and pooling with zero
///    padding). The decision is the same on every rank: the widths and modes are agreed at
///    declaration, and the local "current" verdict is agreed by one allreduce of one integer;
///    if any rank's ghosts are stale, every rank runs the exchange (the same result).
///    Otherwise (wider halo, another mode) the op runs its exchange. Backward is unchanged: the
///    ghost cells' gradients go home through the halo adjoint, so gradients are exact; what
///    backward needs of the ghost cells is copied by the forward, never read later from user
///    memory.
///  - **Lifetime.** The declaration travels with copies of the DistTensor handle (shared: marking
///    one copy valid or stale marks them all) and is dropped by every op that makes a new tensor
///    (redistribute, to(), arithmetic, ...). A snapshot of the view (Var, the default policy for
///    user views in grad mode) copies the current ghost cells with the interior, so ops still
///    find them.
#include <cstdint>
#include <optional>
#include <vector>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/dist/boundary.hpp"

namespace shard {

/// Ghost layers around a from_local view (see the file comment): widths per tensor dim and what
/// the ghosts beyond the global domain edge hold.
struct GhostLayers {
  std::vector<index_t> lo, hi;               ///< per tensor dim: cells below / above the interior
  std::vector<std::optional<Boundary>> edge;  ///< per tensor dim: the domain-edge mode, or none valid there

  /// `width` cells on both sides of each dim in `dims` (0 elsewhere), one edge mode for all.
  static GhostLayers uniform(int rank, index_t width, const std::vector<int>& dims,
                             std::optional<Boundary> edge = std::nullopt) {
    GhostLayers g;
    g.lo.assign(static_cast<std::size_t>(rank), 0);
    g.hi.assign(static_cast<std::size_t>(rank), 0);
    g.edge.assign(static_cast<std::size_t>(rank), edge);
    for (int d : dims)
      if (d >= 0 && d < rank) g.lo[static_cast<std::size_t>(d)] = g.hi[static_cast<std::size_t>(d)] = width;
      else g.lo.clear();  // an out-of-range dim: refused by from_local (entries missing)
    return g;
  }
  /// Number of tensor dims described.
  int ndim() const { return static_cast<int>(lo.size()); }
  friend bool operator==(const GhostLayers&, const GhostLayers&) = default;
};

namespace detail {

/// The declared ghost layers a DistTensor carries, shared by its copies: the declaration and
/// whether / at which storage version the ghost cells are valid.
struct GhostState {
  GhostLayers layers;
  bool valid = true;
  std::uint64_t version = 0;
};

}  // namespace detail

}  // namespace shard
