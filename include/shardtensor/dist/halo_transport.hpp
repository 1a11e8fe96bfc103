#pragma once
/// \file halo_transport.hpp
/// The halo plan of a stencil op (conv today; pooling, upsampling and later stencils can take the
/// same objects): ops that compute from their own block first and read ghost cells only in the
/// boundary boxes near the block faces. The op keeps its schedule (what to compute while a
/// transfer is in flight) and says what it reads (StencilHaloShape: geometry, never a policy);
/// the plan decides which cells travel and how, from the execution context's ExecSettings
/// (halo_transport, halo_chunk_bytes, overlap_halo), the same way on every rank.
///
/// Forward (`StencilHaloForward`), transport chosen by ExecSettings::halo_transport:
///  - thin faces (automatic when possible, or forced by `thin`): when exactly one tensor dim d
///    needs ghosts, the exchange runs on the tensor T made of every part's first and last `edge`
///    cells along d (the whole block when thinner), edge = max(max(lo, hi) + 1, reach[d]). T holds
///    every cell any rank's ghosts copy from (every boundary mode, multi-hop included) and every
///    block cell a boundary box reads, in global order, so the exchange on T with the same widths
///    and modes delivers exactly the real ghost cells, and the block's interior is never copied;
///  - whole extended block: the ordinary halo exchange (dist/halo.hpp);
///  - user ghosts: the ghost layers a simulation declared valid (dist/ghosts.hpp,
///    `declared_ghost_block`) are read in place from its memory, and nothing is exchanged.
///  Either way `read(lo, dst)` returns any box of the (virtual) extended block. With
///  ExecSettings::overlap_halo false the exchange completes at construction (benchmarks).
///
/// Backward (`StencilHaloAdjoint`): the plan says which gradient the op supplies
/// (`wants_extended_gradient()`):
///  - the extended block's gradient (`whole_block`): the ordinary halo adjoint on it;
///  - or the op computes its block's own input gradient from the block alone and supplies the
///    ghost cells' gradients (boxes in extended-block coordinates, zero inside the block), which
///    go to their owners and are added to their gradient: `thin` (one adjoint on T's extended
///    block) or `sliced` (along an unsharded dim without ghosts, StencilHaloShape::slice_dims,
///    slice by slice of ExecSettings::halo_chunk_bytes on one reused zero buffer, so the memory
///    beyond the gradient is one slice).
/// The choice depends only on (spec, halo, shape, settings), which every rank passes alike, so
/// every rank takes the same transport (each transfer is collective).
#include <memory>
#include <vector>

#include "shardtensor/dist/halo.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard {

namespace detail {

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

}  // namespace detail

/// What the halo plan needs to know about a stencil op (its geometry, never a transport policy).
struct StencilHaloShape {
  std::vector<index_t> reach;     ///< per tensor dim: block cells a boundary box reads (missing = 0)
  std::vector<int> slice_dims;    ///< dims the sliced adjoint may slice (first fit)
  const char* op = "halo_exchange";  ///< the op named in errors
};

/// The forward halo of a stencil op, split phase: construction validates (collectively the same
/// on every rank) and posts the first messages; finish() completes; read() copies boxes of the
/// extended block.
class StencilHaloForward {
 public:
  /// The exchange of this rank's block `local` (on ctx.device()); transport and overlap from
  /// ctx.settings().
  StencilHaloForward(DType dt, const DistSpec& spec, const HaloSpec& halo, const Block& local,
                     const StencilHaloShape& shape, ExecContext& ctx);
  /// The user's ghosts as the source (dist/ghosts.hpp): no exchange at all; read() copies from
  /// `user_ext`, the extended block viewed in the user's memory (declared_ghost_block).
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
  detail::ThinHalo th_;
  Block local_, ext_;
  std::unique_ptr<HaloTransfer> tr_;
};

/// How a stencil op's backward sends its ghost gradients home.
enum class HaloAdjointKind : unsigned char { whole_block, thin, sliced };

/// The adjoint transport the plan takes for (spec, halo, shape) with elements of `dt` under
/// `settings` (the same on every rank; what StencilHaloAdjoint::kind() returns).
HaloAdjointKind stencil_halo_adjoint_kind(DType dt, const DistSpec& spec, const HaloSpec& halo,
                                          const StencilHaloShape& shape, const ExecSettings& settings);

/// Gradient of the ghost cells a boundary box read: its box starts at `lo` (extended-block
/// coordinates) and has g's shape; g is zero at the block's own cells.
struct GhostGradient {
  std::vector<index_t> lo;
  Block g;
};

/// The halo adjoint of a stencil op, split phase. Construction picks the transport from
/// (spec, halo, shape, ctx.settings()). If wants_extended_gradient(), the op computes its
/// extended block's gradient and calls start(grad_ext) (the buffer is consumed), then finish()
/// returns the block's gradient. Otherwise the op calls start(ghosts) with its ghost cells'
/// gradients, computes its block's gradient gx meanwhile, calls progress(gx) (lands every
/// transfer but the last, posting the next; overlap the last with more work) and finish(gx),
/// which adds what arrived to gx and returns it. With ExecSettings::overlap_halo false every
/// transfer completes as early as possible (start / progress).
class StencilHaloAdjoint {
 public:
  StencilHaloAdjoint(DType dt, const DistSpec& spec, const HaloSpec& halo, const StencilHaloShape& shape,
                     ExecContext& ctx);
  ~StencilHaloAdjoint();
  StencilHaloAdjoint(const StencilHaloAdjoint&) = delete;
  StencilHaloAdjoint& operator=(const StencilHaloAdjoint&) = delete;
  /// The transport in use.
  HaloAdjointKind kind() const;
  /// True when the op must supply its extended block's gradient (start(const Block&)).
  bool wants_extended_gradient() const { return kind() == HaloAdjointKind::whole_block; }
  /// whole_block: posts the adjoint of the extended block's gradient (contiguous; overwritten).
  void start(const Block& grad_ext);
  /// thin / sliced: posts the first transfer of the ghost cells' gradients.
  void start(std::vector<GhostGradient> ghosts);
  /// thin / sliced: lands every transfer but the last into gx, posting the next.
  void progress(const Block& gx);
  /// Completes: whole_block returns the block's gradient (gx unused); thin / sliced add what
  /// arrived to gx (this rank's contiguous block gradient) and return it.
  Block finish(const Block& gx = Block{});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};


/// The halo adjoint of a stencil op whose backward yields the gradient of ONE box of its extended
/// block (pooling, upsampling): `gbox` is that gradient (contiguous; overwritten), at `lo`
/// (extended-block coordinates, one entry per tensor dim), or an empty Block when this rank has
/// none (it still takes part). Returns this rank's block gradient; every ghost cell's gradient is
/// added on its owner. The transport is the plan's (StencilHaloAdjoint, from ctx.settings()).
/// Collective over the dims' communicators.
Block stencil_halo_adjoint_of_box(DType dt, const DistSpec& spec, const HaloSpec& halo, const StencilHaloShape& shape,
                                  const Block& gbox, const std::vector<index_t>& lo, ExecContext& ctx);

}  // namespace shard
