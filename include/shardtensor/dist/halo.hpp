#pragma once
/// \file halo.hpp
/// Halo (ghost-layer) exchange of a DistTensor's local block and its adjoint.
///
/// `halo_exchange(x, halo)` returns this rank's block of `x` extended by `halo.lo[d]` ghost
/// layers below and `halo.hi[d]` above along every tensor dim d: shape `local[d] + lo[d] + hi[d]`.
/// Ghost cells hold the global tensor's values at the neighbouring global indices; beyond the
/// global domain edge they follow the dim's `Boundary` mode (zero; periodic = wrap-around from
/// the last rank to the first; reflect = PyTorch 'reflect', edge not repeated; replicate = edge
/// value repeated). The extended block equals the box [offset - lo, offset + local + hi) of the
/// full tensor padded with the same modes (padding is separable: one index map per dim).
///
/// How it works (DESIGN.md §4):
///  - Dim by dim (sharded dims first, then unsharded ones, ascending): each later dim's slabs
///    include the ghost layers already received, so corners of 2-D/3-D decompositions come free.
///  - Along a dim split over P parts, every ghost index is mapped to its source global index and
///    that index's owner part; a rank exchanges point-to-point (isend/irecv, one message per peer
///    and dim, tag kHaloTag*) with exactly the owners of its ghost cells on the dim's
///    communicator (`mesh.dim_comm(m)`, or `mesh.dims_comm(ms)` when several mesh dims shard the
///    dim). Halos wider than a neighbour's shard are gathered from further ranks (multi-hop),
///    periodic wrap and reflect/replicate at the global edges included; empty shards work.
///    Dims that are not sharded are padded locally.
///  - The extended buffer is allocated once and the interior copied in once; ghosts arrive in
///    contiguous staging buffers and are unpacked.
///  - Split phase: `auto h = halo_exchange_start(x, halo)` copies the interior and posts the
///    first sharded dim's messages; compute what needs no halo; `Tensor ext = h.finish()`.
///    Later dims (which need the earlier dims' ghosts for the corners) run inside finish().
///  - Widths must be >= 0 and at most the global extent (zero, periodic, replicate) or the extent
///    minus 1 (reflect). The checks depend only on (spec, halo), which every rank passes alike,
///    so every rank throws the same shard::Error before any communication.
///  - Partial placements are fine: the exchange is linear and runs per partial summand.
///
/// `halo_exchange_adjoint(x_spec, grad_ext, halo)` is the transpose: each ghost cell's gradient
/// is sent back to the owner of the cell it was copied from and added there (periodic: wrapped
/// back; reflect/replicate: added to the mirrored / edge cell; zero: dropped), dim by dim in
/// reverse order. Test identity: <H x, g> == <x, H^T g> with sums over all ranks.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "shardtensor/dist/boundary.hpp"
#include "shardtensor/dist/dist_tensor.hpp"
#include "shardtensor/tensor/tensor_block.hpp"

namespace shard {

/// Ghost widths below (`lo`) and above (`hi`) and the boundary mode of every tensor dim. Dims
/// that need no halo have widths 0 (their mode is ignored).
struct HaloSpec {
  std::vector<index_t> lo, hi;
  std::vector<Boundary> modes;

  /// Width w[d] on both sides of each dim d, one mode for every dim.
  static HaloSpec symmetric(std::vector<index_t> widths, Boundary mode) {
    HaloSpec h;
    h.lo = widths;
    h.hi = std::move(widths);
    h.modes.assign(h.lo.size(), mode);
    return h;
  }
  /// Width w[d] on both sides of each dim d, a mode per dim.
  static HaloSpec symmetric(std::vector<index_t> widths, std::vector<Boundary> modes) {
    HaloSpec h;
    h.lo = widths;
    h.hi = std::move(widths);
    h.modes = std::move(modes);
    return h;
  }
  /// Number of tensor dims described.
  int ndim() const { return static_cast<int>(lo.size()); }
  /// True if every width is zero (the exchange is a plain copy).
  bool empty() const {
    for (std::size_t d = 0; d < lo.size(); ++d)
      if (lo[d] != 0 || (d < hi.size() && hi[d] != 0)) return false;
    return true;
  }
  friend bool operator==(const HaloSpec&, const HaloSpec&) = default;
};

/// Message tags of the halo exchange on a dim communicator: forward kHaloTagForward + dim,
/// adjoint kHaloTagAdjoint + dim (so halos never match other point-to-point traffic).
inline constexpr int kHaloTagForward = 0x4A10;
inline constexpr int kHaloTagAdjoint = 0x4A30;

namespace detail {

/// Throws shard::Error (deterministically, identically on every rank) unless `halo` fits `spec`:
/// one entry per tensor dim, widths >= 0, width <= extent (extent - 1 for reflect).
void validate_halo(const DistSpec& spec, const HaloSpec& halo, const char* op);

/// Shape of this rank's extended block: local[d] + lo[d] + hi[d].
std::vector<index_t> halo_extended_shape(const DistSpec& spec, const HaloSpec& halo);

/// The cheap check of a halo call (folded into a collective it makes anyway): the hash of the
/// dtype, layout (global shape, placements, shard sizes, mesh) and halo, and its text for the
/// message when ranks disagree.
std::uint64_t halo_call_key(const char* op, DType dt, const DistSpec& spec, const HaloSpec& halo);
std::string halo_call_text(DType dt, const DistSpec& spec, const HaloSpec& halo);

}  // namespace detail

/// The type-erased halo exchange on Blocks: one split-phase exchange (forward) or its adjoint.
/// This is the public plan object that type-erased schedules (src/nn/*.cpp) use; the typed
/// functions below wrap it.
/// Construction validates, allocates the working buffer, copies the input in and posts the first
/// sharded dim's messages; finish() completes every dim and returns the result. The destructor
/// completes an unfinished transfer (so peers are never left waiting).
class HaloTransfer {
 public:
  enum class Direction : std::uint8_t { forward, adjoint };
  /// forward: `in` is the local block (shape spec.local_box()); the result is the extended block.
  /// adjoint: `in` is the extended block's gradient; the result is the local block's gradient
  /// (the shape check is collective over the mesh, so a wrong shape throws on every rank).
  /// `consume_input` (adjoint only): `in` may be overwritten and used as the working buffer
  /// when it is contiguous, which saves a copy of the whole extended block.
  /// `out` (forward only): the extended buffer to fill in place instead of a new one (its
  /// interior is copied from `in` unless it already is `in`); shape and device checked by the caller.
  HaloTransfer(DType dt, const DistSpec& spec, const HaloSpec& halo, Direction dir, const Block& in,
               bool consume_input = false, const Block* out = nullptr);
  ~HaloTransfer();
  HaloTransfer(const HaloTransfer&) = delete;
  HaloTransfer& operator=(const HaloTransfer&) = delete;
  /// Completes the exchange (idempotent) and returns the result block (contiguous, on the
  /// input's device).
  const Block& finish();
  /// The working buffer of extended shape (forward: the result under construction, whose
  /// interior is valid from the start).
  const Block& buffer() const;
  bool finished() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace detail {
using shard::HaloTransfer;  ///< the former name
}  // namespace detail

/// A halo exchange (or adjoint) in flight. finish() returns the result; it may be called more
/// than once. Dropping an unfinished handle completes the exchange first.
template <class T, int Rank>
class HaloExchange {
 public:
  HaloExchange() = default;
  HaloExchange(std::shared_ptr<HaloTransfer> t, const HaloSpec& halo, Device dev)
      : t_(std::move(t)), dev_(dev) {
    for (int d = 0; d < Rank; ++d) {
      lo_[d] = halo.lo[static_cast<std::size_t>(d)];
      hi_[d] = halo.hi[static_cast<std::size_t>(d)];
    }
  }

  /// Waits for the ghosts (and runs the remaining dims) and returns the result tensor: the
  /// extended block (forward) or the local block's gradient (adjoint), on the input's device.
  Tensor<T, Rank> finish() {
    SHARD_CHECK(t_ != nullptr, "HaloExchange::finish", "empty handle");
    if (!have_) {
      result_ = tensor_of<T, Rank>(t_->finish());  // on the input's device (no host round-trip)
      have_ = true;
    }
    return result_;
  }
  /// Forward only: view of the interior of the extended buffer, valid right after start
  /// (the same values as the input's local block).
  Tensor<T, Rank> interior() const {
    auto buf = tensor_of<T, Rank>(t_->buffer());
    Shape<Rank> len{};
    for (int d = 0; d < Rank; ++d) len[d] = buf.size(d) - lo_[d] - hi_[d];
    return buf.slice(lo_, len);
  }
  bool finished() const { return t_ && t_->finished(); }
  /// The device the exchange runs on (the input's).
  Device device() const { return dev_; }

 private:
  std::shared_ptr<HaloTransfer> t_;
  Device dev_{};
  Shape<Rank> lo_{}, hi_{};
  bool have_ = false;
  Tensor<T, Rank> result_;
};

/// Starts the halo exchange of `x` (split phase): validates, copies the interior into the
/// extended buffer and posts the first sharded dim's messages. Collective over the dims' communicators.
template <class T, int Rank>
HaloExchange<T, Rank> halo_exchange_start(const DistTensor<T, Rank>& x, const HaloSpec& halo) {
  const auto& l = x.local();
  // Runs on the block's own device: buffers, packing and messages stay there.
  auto t = std::make_shared<HaloTransfer>(dtype_of<T>, x.spec(), halo, HaloTransfer::Direction::forward,
                                                  as_block(l));
  return HaloExchange<T, Rank>(std::move(t), halo, l.device());
}

/// This rank's block of `x` extended by the ghost layers of `halo` (see the file comment).
template <class T, int Rank>
Tensor<T, Rank> halo_exchange(const DistTensor<T, Rank>& x, const HaloSpec& halo) {
  return halo_exchange_start(x, halo).finish();
}

/// Starts the adjoint of the halo exchange (split phase): `grad_ext` is the gradient of the
/// extended block of a tensor laid out by `x_spec`.
/// With `overwrite_grad_ext`, the (contiguous) `grad_ext` is used as the working buffer and
/// its contents are destroyed: one copy of the extended block fewer (the stencil halo plan does this).
template <class T, int Rank>
HaloExchange<T, Rank> halo_exchange_adjoint_start(const DistSpec& x_spec, const Tensor<T, Rank>& grad_ext,
                                                   const HaloSpec& halo, bool overwrite_grad_ext = false) {
  // Runs on grad_ext's own device: buffers, packing and messages stay there.
  auto t = std::make_shared<HaloTransfer>(dtype_of<T>, x_spec, halo, HaloTransfer::Direction::adjoint,
                                                  as_block(grad_ext), overwrite_grad_ext);
  return HaloExchange<T, Rank>(std::move(t), halo, grad_ext.device());
}

/// The gradient of this rank's local block given the gradient of its extended block: every
/// ghost cell's gradient is added to the cell it was copied from, on that cell's owner.
/// `overwrite_grad_ext`: see halo_exchange_adjoint_start.
template <class T, int Rank>
Tensor<T, Rank> halo_exchange_adjoint(const DistSpec& x_spec, const Tensor<T, Rank>& grad_ext, const HaloSpec& halo,
                                      bool overwrite_grad_ext = false) {
  return halo_exchange_adjoint_start(x_spec, grad_ext, halo, overwrite_grad_ext).finish();
}

/// Fills the ghost cells of a user's ghosted array in place: the library's halo exchange as a
/// simulation's own exchange. `ghosted` is this rank's array with its ghost layers, of shape
/// `local[d] + halo.lo[d] + halo.hi[d]` (strided views allowed), whose interior box
/// [lo, lo + local) holds this rank's block of `x` (typically `x` = from_local of exactly that
/// interior view, zero-copy). Afterwards every ghost cell holds what halo_exchange(x, halo) gives
/// it: neighbours' data (multi-hop and corners of 2-D/3-D decompositions included), and beyond
/// the global domain edge the dim's Boundary (zero, periodic, reflect, replicate). The interior
/// is not written (nor copied when it is x's local block). Collective over the mesh; a wrong
/// shape, device or dtype is a shard::Error on every rank before any message.
template <class T, int Rank>
void fill_ghosts(const DistTensor<T, Rank>& x, const Tensor<T, Rank>& ghosted, const HaloSpec& halo) {
  const DistSpec& spec = x.spec();
  detail::validate_halo(spec, halo, "fill_ghosts");
  const auto want = detail::halo_extended_shape(spec, halo);
  const bool shape_ok = std::equal(ghosted.shape().begin(), ghosted.shape().end(), want.begin(), want.end());
  const bool dev_ok = ghosted.device() == x.local().device();
  spec.mesh().comm()->check_all(
      shape_ok && dev_ok, "fill_ghosts",
      shape_ok ? (dev_ok ? std::string()
                         : fmt::format("ghosted array on {} but the tensor's block on {}", ghosted.device(),
                                       x.local().device()))
               : fmt::format("ghosted array of shape {} but {} with {} needs {} on this rank", ghosted.shape(), spec,
                             halo, want),
      detail::halo_call_key("fill_ghosts", dtype_of<T>, spec, halo),
      [&] { return detail::halo_call_text(dtype_of<T>, spec, halo); });
  const Block out = as_block(ghosted);
  HaloTransfer t(dtype_of<T>, spec, halo, HaloTransfer::Direction::forward, as_block(x.local()),
                         false, &out);
  t.finish();
  ghosted.bump_version();  // an in-place write shardtensor made (saved-tensor safety)
  // x's declared ghost layers live in `ghosted` (same memory, same strides) and are covered by
  // `halo` (widths and edge modes): they are valid again (dist/ghosts.hpp).
  if (const GhostLayers* g = x.ghost_layers()) {
    const auto& l = x.local();
    bool same = ghosted.strides() == l.strides();
    index_t off = 0;
    for (int d = 0; d < Rank && same; ++d) {
      const auto u = static_cast<std::size_t>(d);
      off += halo.lo[u] * l.strides()[u];
      const bool edge_ok = !g->edge[u] || *g->edge[u] == halo.modes[u] || (g->lo[u] == 0 && g->hi[u] == 0);
      same = g->lo[u] <= halo.lo[u] && g->hi[u] <= halo.hi[u] && edge_ok;
    }
    if (same && ghosted.data() + off == l.data()) x.mark_ghosts_valid();
  }
}

/// True if an op that needs `halo` around x's block may read x's declared ghost layers
/// (dist/ghosts.hpp) instead of exchanging: on every dim with a halo, the declared widths are at
/// least the halo's and the declared edge mode is the halo's mode (or the mode is zero and
/// `zero_edge_unread`: the op never reads a ghost cell beyond the domain edge for zero padding,
/// as conv and pooling clip their windows to the domain), and the ghosts are current on EVERY
/// rank. The geometric part depends only on (declaration, halo), the same on every rank (from_local
/// checks the declaration's agreement); when it holds, the ranks' local "current" verdicts are
/// combined by one allreduce (min of one integer) over the mesh, so every rank returns the same.
/// No communication when x declares no ghosts or they are too narrow.
template <class T, int Rank>
bool use_declared_ghosts(const DistTensor<T, Rank>& x, const HaloSpec& halo, bool zero_edge_unread) {
  const GhostLayers* g = x.ghost_layers();
  if (!g || halo.ndim() != Rank || halo.empty()) return false;
  for (int d = 0; d < Rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (halo.lo[u] == 0 && halo.hi[u] == 0) continue;
    if (g->lo[u] < halo.lo[u] || g->hi[u] < halo.hi[u]) return false;
    const bool edge_ok = (halo.modes[u] == Boundary::zero && zero_edge_unread) || g->edge[u] == halo.modes[u];
    if (!edge_ok) return false;
  }
  std::int64_t ok = x.ghosts_current() ? 1 : 0, all = 0;
  x.mesh().comm()->allreduce(&ok, &all, 1, DType::i64, ReduceOp::min);
  return all == 1;
}

/// x's extended block (x's block with `halo` around it) viewed zero-copy in the user's memory
/// when an op that needs `halo` may read x's declared ghost layers instead of exchanging
/// (use_declared_ghosts: the same verdict on every rank), else an empty Block. The halo plan of
/// a stencil op reads it in place (StencilHaloForward(user_ext), dist/halo_transport.hpp).
template <class T, int Rank>
Block declared_ghost_block(const DistTensor<T, Rank>& x, const HaloSpec& halo, bool zero_edge_unread) {
  if (!use_declared_ghosts(x, halo, zero_edge_unread)) return Block{};
  return as_block(x.ghosted_local(halo.lo, halo.hi));
}

namespace detail {
using shard::use_declared_ghosts;  ///< the former name (kept for callers not yet moved)
}  // namespace detail

/// fill_ghosts with `width` ghost layers on both sides of every dim listed in `dims` (the
/// sharded dims of a simulation array) and one boundary mode.
template <class T, int Rank>
void fill_ghosts(const DistTensor<T, Rank>& x, const Tensor<T, Rank>& ghosted, index_t width, Boundary boundary,
                 const std::vector<int>& dims) {
  std::vector<index_t> w(Rank, 0);
  for (int d : dims) {
    SHARD_CHECK(d >= 0 && d < Rank, "fill_ghosts", "dim {} outside a rank-{} tensor", d, Rank);
    w[static_cast<std::size_t>(d)] = width;
  }
  fill_ghosts(x, ghosted, HaloSpec::symmetric(std::move(w), boundary));
}

}  // namespace shard

template <> struct fmt::formatter<shard::HaloSpec> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  template <class Ctx> auto format(const shard::HaloSpec& h, Ctx& ctx) const {
    auto out = fmt::format_to(ctx.out(), "HaloSpec(lo={}, hi={}, modes=[", h.lo, h.hi);
    for (std::size_t i = 0; i < h.modes.size(); ++i)
      out = fmt::format_to(out, "{}{}", i ? ", " : "", shard::boundary_name(h.modes[i]));
    return fmt::format_to(out, "])");
  }
};
