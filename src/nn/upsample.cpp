// Schedule of domain-parallel resampling (see include/shardtensor/nn/functional/upsample.hpp):
// the stencil halo plan extends the block by the (replicate-edge) halo linear (<= 1 cell) or
// cubic (<= 2 cells) interpolation reads, the resize kernel family interpolates; backward runs the resize adjoint
// onto the extended block and the plan's halo adjoint returns the ghost cells' gradients.
#include "shardtensor/nn/functional/upsample.hpp"

#include <algorithm>

#include "shardtensor/dist/halo_transport.hpp"
#include "shardtensor/exec/box.hpp"

namespace shard::nn::functional::detail {
namespace {

/// What the halo plan needs to know about a resampling: linear reads two taps per dim (ghost
/// width <= 1), cubic four (ghost width <= 2): twice the widest ghost width, at least 2.
StencilHaloShape halo_shape(const HaloSpec& halo) {
  StencilHaloShape s;
  s.op = "upsample";
  s.reach.assign(static_cast<std::size_t>(halo.ndim()), 0);
  for (int d = 2; d < halo.ndim(); ++d) {
    const auto u = static_cast<std::size_t>(d);
    s.reach[u] = std::max<index_t>(2, 2 * std::max(halo.lo[u], halo.hi[u]));
    s.slice_dims.push_back(d);
  }
  return s;
}

}  // namespace

void upsample_forward(const exec::ResizeGeometry& g, const DistSpec& xs, const HaloSpec& halo, bool exchange,
                      bool compute, const Block& x, const Block& y, ExecContext& ctx) {
  Block base = x;
  if (exchange) {
    StencilHaloForward h(x.dtype, xs, halo, x, halo_shape(halo), ctx);  // collective: every rank
    if (compute) {
      base = Block::allocate(x.dtype, ctx.device(), shard::detail::halo_extended_shape(xs, halo));
      h.read(std::vector<index_t>(static_cast<std::size_t>(x.rank), 0), base);
    }
  }
  if (compute) exec::resize_forward(g, base, y, ctx);
  else exec::box_zero(y, ctx);
}

Block upsample_backward(const exec::ResizeGeometry& g, const DistSpec& xs, const HaloSpec& halo, bool exchange,
                        bool compute, DType dt, const Block& gy, ExecContext& ctx) {
  std::vector<index_t> shape = xs.local_box().len;
  for (int d = 2; d < static_cast<int>(shape.size()); ++d) {
    const auto u = static_cast<std::size_t>(d);
    shape[u] += halo.lo[u] + halo.hi[u];
  }
  Block gb = Block::allocate(dt, ctx.device(), shape);
  if (compute) exec::resize_backward(g, gy, gb, ctx);
  else exec::box_zero(gb, ctx);
  if (!exchange) return gb;
  return stencil_halo_adjoint_of_box(dt, xs, halo, halo_shape(halo), gb,
                                     std::vector<index_t>(shape.size(), 0), ctx);
}

}  // namespace shard::nn::functional::detail
