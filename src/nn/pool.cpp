// Schedule of domain-parallel pooling (see include/shardtensor/nn/functional/pool.hpp): the
// stencil halo plan brings the ghost cells (or the user's declared ghosts are read in place), the
// pool kernel family pools this rank's box; backward runs the local adjoint on the box and the
// plan's halo adjoint returns the ghost cells' gradients to their owners.
#include "shardtensor/nn/functional/pool.hpp"

#include <optional>

#include "shardtensor/dist/halo_transport.hpp"
#include "shardtensor/exec/box.hpp"

namespace shard::nn::functional::detail {
namespace {

/// What the halo plan needs to know about a pooling: the window spans along the spatial dims.
StencilHaloShape halo_shape(const PoolRun& r) {
  StencilHaloShape s;
  s.op = "pool";
  s.reach.assign(2, 0);
  for (int d = 0; d < r.plan.spatial(); ++d) {
    const auto u = static_cast<std::size_t>(d);
    s.reach.push_back(r.plan.dims[u].span());
    s.slice_dims.push_back(d + 2);
  }
  return s;
}

/// This rank's box in extended-block coordinates (N, C, spatial...) and its shape.
void box_in_ext(const PoolRun& r, const DistSpec& xs, std::vector<index_t>& lo, std::vector<index_t>& len) {
  const Box xb = xs.local_box();
  lo.assign(2, 0);
  len = {xb.len[0], xb.len[1]};
  for (int d = 0; d < r.plan.spatial(); ++d) {
    const auto u = static_cast<std::size_t>(d);
    const Range base = r.plan.exchange ? r.plan.ext_range(d) : r.plan.in_block[u];
    lo.push_back(r.box[u].lo - base.lo);
    len.push_back(r.box[u].len);
  }
}

}  // namespace

void pool_forward(PoolKind kind, const PoolRun& r, const DistSpec& xs, const Block& x, const Block& user_ext,
                  const Block& y, const Block* idx, ExecContext& ctx) {
  std::vector<index_t> lo, len;
  box_in_ext(r, xs, lo, len);
  // The exchange (or the user's ghosts) whenever the plan needs one: collective, so every rank
  // takes part even when it computes nothing.
  std::optional<StencilHaloForward> halo;
  if (r.plan.exchange) {
    if (user_ext.data != nullptr) halo.emplace(user_ext);
    else halo.emplace(x.dtype, xs, r.plan.halo, x, halo_shape(r), ctx);
  }
  if (!r.compute) return;
  Block in;
  if (halo) {
    in = Block::allocate(x.dtype, ctx.device(), len);
    halo->read(lo, in);
  } else {
    in = exec::sub_box(x, lo, len);
    if (!in.is_contiguous()) {  // a strided view (user memory): one contiguous copy of the box
      Block c = Block::allocate(x.dtype, ctx.device(), len);
      exec::box_copy(c, in, ctx);
      in = c;
    }
  }
  if (kind == PoolKind::avg) exec::avg_pool_forward(r.geom, in, y, ctx);
  else exec::max_pool_forward(r.geom, in, y, *idx, ctx);
}

Block pool_backward(PoolKind kind, const PoolRun& r, const DistSpec& xs, DType dt, const Block& gy, const Block* idx,
                    ExecContext& ctx) {
  std::vector<index_t> lo, len;
  box_in_ext(r, xs, lo, len);
  Block gbox;
  if (r.compute) {
    gbox = Block::allocate(dt, ctx.device(), len);
    if (kind == PoolKind::avg) exec::avg_pool_backward(r.geom, gy, gbox, ctx);
    else exec::max_pool_backward(r.geom, gy, *idx, gbox, ctx);
  }
  if (r.plan.exchange) return stencil_halo_adjoint_of_box(dt, xs, r.plan.halo, halo_shape(r), gbox, lo, ctx);
  // No halo: the box lies in the block; the block's gradient is the box's, zero elsewhere.
  const auto blk = xs.local_box().len;
  bool whole = r.compute;
  for (std::size_t d = 0; d < blk.size() && whole; ++d) whole = lo[d] == 0 && len[d] == blk[d];
  if (whole) return gbox;
  Block gx = Block::allocate(dt, ctx.device(), blk);
  exec::box_zero(gx, ctx);
  if (r.compute) exec::box_copy(exec::sub_box(gx, lo, len), gbox, ctx);
  return gx;
}

}  // namespace shard::nn::functional::detail
