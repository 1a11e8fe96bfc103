#pragma once
/// \file window.hpp
/// Layout algebra of the domain-parallel window ops (conv, conv_transpose, avg/max pooling):
/// which rank owns which output point (the *anchor rule*), the halo widths that follows from it,
/// and F::redistribute_like, which aligns two activations before they are combined.
///
/// ## The anchor rule (one spatial dim; global input extent G)
/// A window op with kernel k, stride s, dilation dl, padding (pl, ph) and span = dl * (k - 1)
/// has Gout = floor((G + pl + ph - span - 1) / s) + 1 outputs (an error if < 1: the kernel is
/// larger than the padded extent); output o reads the padded input [o*s - pl, o*s - pl + span].
/// With the fixed anchor c = clamp(pl, 0, span), output o belongs to the part that owns input
///     anchor(o) = clamp(o*s - pl + c, 0, G - 1),
/// so part p, holding input [off_p, off_p + n_p), owns outputs [B(off_p), B(off_p + n_p)) with
///     B(0) = 0,  B(G) = Gout,  B(g) = clamp(ceil((g + pl - c) / s), 0, Gout) otherwise.
/// Consequences: a stride-1 'same' op (pl = c: odd kernels with pl = ph = span/2, even kernels
/// with pl = span/2 rounded down) keeps the input layout exactly; stride-s pooling with pl = 0
/// maps part boundaries g to ceil(g / s); empty input parts own no outputs; the output layout
/// is computed locally from the input DistSpec (no communication) and is the same on every rank.
/// The output DistSpec has the input's placements and explicit ShardSizes on the sharded dims.
///
/// ## Halo widths
/// Part p reads the global input range R_p = [B_lo*s - pl, (B_hi - 1)*s - pl + span + 1) for its
/// outputs [B_lo, B_hi). With zero padding (Boundary::zero) R_p is intersected with [0, G): the
/// local kernels add the zeros themselves, so unsharded zero-padded dims need no halo at all.
/// Other modes (periodic, reflect, replicate) read ghost cells beyond the domain from the halo.
/// The ghost widths are lo = max_p(off_p - R_p.lo), hi = max_p(R_p.hi - off_p - n_p) (>= 0) over
/// the parts with outputs, identical on every rank; in the regular case lo = c, hi = span - c.
/// A halo wider than the domain is refused by the halo exchange (on every rank).
///
/// ## Combining activations (U-Net skips)
/// Ops that combine two activations (F::add, F::concat, ...) require equal specs on every dim
/// but the combined one; e.g. upsample(max_pool(x)) and x have different layouts at 3 ranks
/// (extent 10: x is 4,3,3; a 2x2 pool maps the boundaries 4, 7 to 2, 4 (ceil of g / 2): 2,2,1;
/// upsampled by 2: 4,4,2). F::redistribute_like(a, b.spec()) moves `a` onto `b`'s layout.
#include <utility>
#include <vector>

#include "shardtensor/autograd/comm_ops.hpp"
#include "shardtensor/dist/halo.hpp"
#include "shardtensor/nn/functional/common.hpp"

namespace shard::nn::functional {

/// One spatial dim of a window op: kernel, stride, dilation, padding per side and padding mode.
/// Largest kernel extent, stride, dilation, padding or scale factor a window op accepts (2^31 - 1).
/// Global extents are below 2^59 (DistSpec: element count times 16 bytes fits int64), so with
/// parameters in this range the derived extents (padded extent, span, anchors) cannot overflow;
/// the few products that still could (transposed and upsampled extents) are checked where formed.
inline constexpr index_t kMaxWindowParam = (index_t(1) << 31) - 1;

struct WindowDim {
  index_t kernel = 1, stride = 1, dilation = 1, pad_lo = 0, pad_hi = 0;
  Boundary mode = Boundary::zero;  ///< zero: out-of-domain cells are padding (clipped, see file comment)
  /// Distance between the first and the last tap: dilation * (kernel - 1).
  index_t span() const { return dilation * (kernel - 1); }
};

namespace detail {

/// A half-open global index range [lo, lo + len).
struct Range {
  index_t lo = 0, len = 0;
  index_t hi() const { return lo + len; }
  friend bool operator==(const Range&, const Range&) = default;
};

/// Number of outputs of a window op along a dim of global extent G; throws shard::Error naming
/// `op` and the spatial dim when the padded extent is shorter than the dilated kernel.
index_t window_output_extent(const char* op, index_t G, const WindowDim& w, int spatial_dim);

/// Output part sizes of the anchor rule for input layout `in` (see the file comment).
std::vector<index_t> anchor_output_sizes(const ShardLayout& in, const WindowDim& w, index_t global_out);

/// Part sizes of a transposed conv's output (extent `global_y`) for an input layout `x`: the
/// inverse of the anchor rule, so that the conv y -> x with the same parameters maps the result
/// back onto x's layout. Part p starts at clamp(off_p*s - pl + c, 0, Gy) (0 for off_p = 0, Gy
/// for off_p = G).
std::vector<index_t> transpose_output_sizes(const ShardLayout& x, const WindowDim& w, index_t global_y);

/// Spec of a window op's output: x's mesh and placements, global [N, C_out, out...], N's layout
/// (and C's when C_out equals x's C) kept, spatial dims split by `spatial_sizes[d]` where sharded.
DistSpec window_output_spec(const DistSpec& x, index_t out_channels, const std::vector<index_t>& out_extents,
                            const std::vector<std::vector<index_t>>& spatial_sizes);

/// Output spec of a window op on x under the anchor rule (computes extents and sizes).
DistSpec anchor_output_spec(const char* op, const DistSpec& x, index_t out_channels, const std::vector<WindowDim>& dims);

/// This rank's part of a window op that maps an input laid out by `in` onto an output laid out
/// by `out` (same mesh and placements; tensor dims 2.. are the spatial dims).
struct WindowPlan {
  std::vector<WindowDim> dims;                 ///< per spatial dim
  std::vector<index_t> in_global, out_global;  ///< global spatial extents
  std::vector<Range> in_block, out_block;      ///< global ranges this rank holds / computes
  std::vector<index_t> halo_lo, halo_hi;       ///< ghost widths per spatial dim (same on every rank)
  HaloSpec halo;                               ///< the same widths for the whole N, C, spatial tensor
  bool exchange = false;                       ///< some ghost width is > 0
  /// Output boxes (global ranges per spatial dim) whose windows read cells outside this rank's
  /// block other than zero padding; disjoint; their union is every such output.
  std::vector<std::vector<Range>> boundary_boxes;

  int spatial() const { return static_cast<int>(dims.size()); }
  /// Global input range read by outputs [o0, o1) along spatial dim d (intersected with [0, G)
  /// for zero padding); len 0 when they read padding only.
  Range read_range(int d, index_t o0, index_t o1) const;
  /// Global range of this rank's extended (halo) block along spatial dim d.
  Range ext_range(int d) const {
    const auto u = static_cast<std::size_t>(d);
    return {in_block[u].lo - halo_lo[u], in_block[u].len + halo_lo[u] + halo_hi[u]};
  }
  /// True if this rank computes no output point.
  bool empty_output() const;
};

/// Builds this rank's WindowPlan (local; no communication). `in` and `out` must split their
/// spatial dims over the same mesh dims.
WindowPlan make_window_plan(const char* op, const DistSpec& in, const DistSpec& out, std::vector<WindowDim> dims);

/// Gradient spec of a window op's input x given the op's output spec and upstream gradient
/// (shared by conv, pool and upsample).
inline DistSpec window_input_grad_spec(const DistSpec& xs, const DistSpec& out, const DistSpec& grad_out) {
  return xs.with_placements(
      autograd::local_op_input_grad_placements(xs.placements(), out.placements(), grad_out.placements()), xs.sizes());
}

}  // namespace detail

/// `a` laid out like `target`: target's placements, and target's layout on every tensor dim
/// whose global extent equals a's (a dim whose extent differs, e.g. the channels of a skip
/// connection, must not be sharded by target). Differentiable (the gradient goes back to a's
/// layout). Returns `a` itself when nothing changes. Collective over the mesh when data moves.
/// Use it before F::add / F::concat of activations whose layouts differ (see the file comment).
template <class T, int R>
Var<T, R> redistribute_like(const Var<T, R>& a, const DistSpec& target) {
  const char* op = "redistribute_like";
  const DistSpec& as = a.value().spec();
  SHARD_CHECK(as.mesh() == target.mesh(), op, "input {} and target {} live on different meshes: {}", as, target,
              mesh_mismatch(as.mesh(), target.mesh()));
  SHARD_CHECK(target.ndim() == R, op, "target {} has rank {} but the input has rank {}", target, target.ndim(), R);
  ShardSizes sizes(static_cast<std::size_t>(R));
  for (int d = 0; d < R; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const bool same_extent = as.global_shape()[u] == target.global_shape()[u];
    SHARD_CHECK(same_extent || target.sharding_mesh_dims(d).empty(), op,
                "target {} shards tensor dim {} of extent {}, but the input {} has extent {} there", target, d,
                target.global_shape()[u], as, as.global_shape()[u]);
    if (same_extent && target.layout(d).parts() > 1) sizes[u] = target.layout(d).sizes();
  }
  DistSpec want = as.with_placements(target.placements(), sizes);
  if (want == as) return a;
  return autograd::redistribute(a, want);
}

}  // namespace shard::nn::functional
