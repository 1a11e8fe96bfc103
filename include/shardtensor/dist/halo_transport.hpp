#pragma once
/// \file halo_transport.hpp
/// Transports of a stencil op's halo exchange: options of the (cached, persistent-buffer) halo
/// plan for ops that compute from their own block first and read ghost cells only in the
/// boundary boxes near the block faces (conv today; pooling, upsampling and later stencils can
/// take the same objects). The op keeps its schedule (what to compute while the transfer is in
/// flight); the transport decides which cells travel and how.
///
/// Forward (`StencilHaloForward`), chosen by `HaloTransport` (exec/context.hpp settings):
///  - thin faces: when exactly one tensor dim d needs ghosts, the exchange runs on the tensor T
///    made of every part's first and last `edge` cells along d (the whole block when thinner),
///    edge = max(max(lo, hi) + 1, reach[d]). T holds every cell any rank's ghosts copy from
///    (every boundary mode, multi-hop included) and every block cell a boundary box reads, in
///    global order, so the exchange on T with the same widths and modes delivers exactly the
///    real ghost cells, and the block's interior is never copied;
///  - whole extended block: the ordinary halo exchange (dist/halo.hpp);
///  - user ghosts: the ghost layers a simulation declared valid (dist/ghosts.hpp) are read in
///    place from its memory, and nothing is exchanged (the op decides, the same on every rank).
///  Either way `read(lo, dst)` returns any box of the (virtual) extended block.
///
/// Backward (`GhostHaloAdjoint`): the op computes its block's own input gradient from the block
/// alone and supplies the ghost cells' gradients (boxes in extended-block coordinates, zero
/// inside the block); the adjoint sends them to their owners, who add them to their gradient:
///  - thin faces: one adjoint on T's extended block;
///  - sliced: along an unsharded dim without ghosts (`slice_dims`), slice by slice on one reused
///    zero buffer when the block is larger than `chunk_bytes` per rank, so that the memory beyond
///    the gradient is one slice;
///  - otherwise (`whole_block` from choose_halo_adjoint) the op runs the ordinary
///    halo_exchange_adjoint on its extended block's gradient.
/// The choice depends only on (spec, halo, options), which every rank passes alike, so every
/// rank takes the same transport (each transfer is collective).
#include <memory>
#include <vector>

#include "shardtensor/dist/halo.hpp"
#include "shardtensor/exec/context.hpp"

namespace shard::detail {

/// The thin-face geometry of (spec, halo): see the file comment. `ok` is false unless exactly
/// one tensor dim needs ghost cells.
struct ThinHalo {
  bool ok = false;
  int d = -1;                 ///< the tensor dim with ghosts
  index_t edge = 0;           ///< face depth kept per part
  index_t t = 0;              ///< this rank's T extent along d: min(n, 2 edge)
  index_t n = 0;              ///< this rank's block extent along d
  index_t lo = 0, hi = 0;     ///< ghost widths along d
  DistSpec spec;              ///< the layout of T
  /// Block-local row of T-local row j along d.
  index_t block_row(index_t j) const { return n <= 2 * edge || j < edge ? j : n - t + j; }
};

/// Thin-face geometry for an op whose boundary boxes read up to `reach[d]` block cells along
/// tensor dim d (a window's span; entries may be omitted = 0).
ThinHalo make_thin_halo(const DistSpec& spec, const HaloSpec& halo, const std::vector<index_t>& reach);

/// Options of a stencil op's halo transports.
struct StencilHaloOptions {
  HaloTransport transport = HaloTransport::automatic;  ///< thin faces when possible, else whole block
  std::vector<index_t> reach;                          ///< per tensor dim: block cells a boundary box reads
  std::vector<int> slice_dims;                         ///< dims the sliced adjoint may slice (first fit)
  std::size_t chunk_bytes = std::size_t{2} << 20;      ///< bytes per slice of the sliced adjoint
  const char* op = "halo_exchange";                    ///< the op named in errors
};

/// The forward halo of a stencil op, split phase: construction validates (collectively the same
/// on every rank) and posts the first messages; finish() completes; read() copies boxes of the
/// extended block.
class StencilHaloForward {
 public:
  StencilHaloForward(DType dt, const DistSpec& spec, const HaloSpec& halo, const Block& local,
                     const StencilHaloOptions& opt);
  /// The user's ghosts as the source (dist/ghosts.hpp): no exchange at all; read() copies from
  /// `user_ext`, the extended block viewed in the user's memory (strided; the caller checked,
  /// collectively, that the declared ghosts cover the halo: detail::use_declared_ghosts).
  explicit StencilHaloForward(const Block& user_ext);
  ~StencilHaloForward();
  StencilHaloForward(const StencilHaloForward&) = delete;
  StencilHaloForward& operator=(const StencilHaloForward&) = delete;
  /// Waits for the ghost cells (idempotent).
  void finish();
  /// dst = the box at `lo` (extended-block coordinates, one entry per tensor dim) of shape
  /// dst's shape. Calls finish() first.
  void read(const std::vector<index_t>& lo, const Block& dst);
  /// True if the thin-face transport runs.
  bool thin() const { return th_.ok; }

 private:
  ThinHalo th_;
  Block local_, ext_;
  std::unique_ptr<HaloTransfer> tr_;
};

/// How a stencil op's backward sends its ghost gradients home.
enum class HaloAdjointKind : unsigned char { whole_block, thin, sliced };

/// The adjoint transport for (spec, halo, opt) with elements of `dt` (the same on every rank).
HaloAdjointKind choose_halo_adjoint(DType dt, const DistSpec& spec, const HaloSpec& halo,
                                    const StencilHaloOptions& opt);

/// Gradient of the ghost cells a boundary box read: its box starts at `lo` (extended-block
/// coordinates) and has g's shape; g is zero at the block's own cells.
struct GhostGradient {
  std::vector<index_t> lo;
  Block g;
};

/// The ghost-only adjoint (thin or sliced), split phase: construction posts the first transfer;
/// the op computes its block's gradient gx meanwhile, then calls progress(gx) (lands every
/// transfer but the last, posting the next; overlap the last with more work) and finish(gx),
/// which adds what arrived to gx. gx must be this rank's local block gradient (contiguous).
class GhostHaloAdjoint {
 public:
  GhostHaloAdjoint(DType dt, const DistSpec& spec, const HaloSpec& halo, Device dev, HaloAdjointKind kind,
                   std::vector<GhostGradient> ghosts, const StencilHaloOptions& opt);
  ~GhostHaloAdjoint();
  GhostHaloAdjoint(const GhostHaloAdjoint&) = delete;
  GhostHaloAdjoint& operator=(const GhostHaloAdjoint&) = delete;
  void progress(const Block& gx);
  void finish(const Block& gx);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shard::detail
