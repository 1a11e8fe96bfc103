// The schedule of the domain-parallel convolution (nn/functional/conv.hpp), type-erased and
// written once for every device: which halo plan runs (dist/halo_transport.hpp: the plan picks
// its transport from the context's ExecSettings) and which conv-family kernels run
// (exec/conv.hpp), in what order. Forward: the halo exchange overlapped by the computation on the
// rank's own block, then the boundary boxes. Backward: the input gradient through the halo
// adjoint, overlapped by the weight gradient.
#include <algorithm>
#include <optional>

#include "shardtensor/dist/halo_transport.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/nn/functional/conv.hpp"

namespace shard::nn::functional::detail {

namespace {

/// Geometry of the conv producing global outputs `out` from an input block holding global cells
/// `in` (zeros outside it), per spatial dim.
ConvGeometry geometry(const WindowPlan& p, const ConvChannels& ch, const std::vector<Range>& in,
                      const std::vector<Range>& out) {
  ConvGeometry g;
  g.spatial_dims = p.spatial();
  g.batch = ch.batch;
  g.in_channels = ch.in;
  g.out_channels = ch.out;
  g.groups = ch.groups;
  const int S = p.spatial();
  for (int d = 0; d < S; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const int e = 3 - S + d;
    const WindowDim& w = p.dims[u];
    g.in[e] = in[u].len;
    g.out[e] = out[u].len;
    g.kernel[e] = w.kernel;
    g.stride[e] = w.stride;
    g.dilation[e] = w.dilation;
    g.pad_lo[e] = in[u].lo - (out[u].lo * w.stride - w.pad_lo);
  }
  return g;
}

std::vector<index_t> block_shape(index_t batch, index_t channels, const std::vector<Range>& r) {
  std::vector<index_t> s{batch, channels};
  for (const auto& x : r) s.push_back(x.len);
  return s;
}

std::vector<Range> ext_ranges(const WindowPlan& p) {
  std::vector<Range> r;
  for (int d = 0; d < p.spatial(); ++d) r.push_back(p.ext_range(d));
  return r;
}

/// Local start (N, C, spatial) of the global box `r` inside a block whose spatial ranges are `base`.
std::vector<index_t> local_start(const std::vector<Range>& r, const std::vector<Range>& base) {
  std::vector<index_t> s{0, 0};
  for (std::size_t d = 0; d < r.size(); ++d) s.push_back(r[d].lo - base[d].lo);
  return s;
}

index_t numel_of(const std::vector<index_t>& s) {
  index_t n = 1;
  for (auto e : s) n *= e;
  return n;
}

/// `b` (contiguous) viewed with `shape` (same element count).
Block reshaped(const Block& b, const std::vector<index_t>& shape) {
  Block v = Block::view(b.dtype, b.device, b.data, shape.data(), static_cast<int>(shape.size()));
  v.owner = b.owner;
  return v;
}

/// Zeros the box [lo, lo + len) of b.
void zero_box(const Block& b, const std::vector<index_t>& lo, const std::vector<index_t>& len, ExecContext& ctx) {
  exec::box_zero(exec::sub_box(b, lo, len), ctx);
}

/// dst[dst_lo + i] = src[src_lo + i] over the box `len`.
void copy_box(const Block& src, const std::vector<index_t>& slo, const Block& dst, const std::vector<index_t>& dlo,
              const std::vector<index_t>& len, ExecContext& ctx) {
  exec::box_copy(exec::sub_box(dst, dlo, len), exec::sub_box(src, slo, len), ctx);
}

Block zeros(DType dt, const std::vector<index_t>& shape, ExecContext& ctx) {
  Block b = Block::allocate(dt, ctx.device(), shape);
  exec::box_zero(b, ctx);
  return b;
}

/// What the halo plan needs to know about this conv: the window spans (block cells a boundary
/// box reads) and the spatial dims its adjoint may slice.
StencilHaloShape halo_shape(const WindowPlan& plan) {
  StencilHaloShape s;
  s.op = "conv";
  s.reach.assign(2, 0);
  for (int d = 0; d < plan.spatial(); ++d) {
    s.reach.push_back(plan.dims[static_cast<std::size_t>(d)].span());
    s.slice_dims.push_back(d + 2);
  }
  return s;
}

/// Input range of a boundary box along each spatial dim; false if it reads zero padding only
/// along some dim (the block pass was exact there).
bool box_reads(const WindowPlan& plan, const std::vector<Range>& ob, std::vector<Range>& in) {
  in.clear();
  bool reads = true;
  for (int d = 0; d < plan.spatial(); ++d) {
    const auto u = static_cast<std::size_t>(d);
    in.push_back(plan.read_range(d, ob[u].lo, ob[u].hi()));
    reads = reads && in.back().len > 0;
  }
  return reads;
}

/// Zeros the cells of `b` (a box over the global input range `in`) that lie in this rank's own
/// block: those are counted by the block's own pass.
void zero_own_cells(const WindowPlan& plan, const ConvChannels& ch, const std::vector<Range>& in, const Block& b,
                    ExecContext& ctx) {
  std::vector<index_t> lo{0, 0}, len{ch.batch, ch.in};
  bool overlap = true;
  for (int d = 0; d < plan.spatial(); ++d) {
    const auto u = static_cast<std::size_t>(d);
    const index_t a = std::max(in[u].lo, plan.in_block[u].lo), e = std::min(in[u].hi(), plan.in_block[u].hi());
    overlap = overlap && e > a;
    lo.push_back(a - in[u].lo);
    len.push_back(std::max<index_t>(0, e - a));
  }
  if (overlap) zero_box(b, lo, len, ctx);
}

/// Ghost-cell gradients of every boundary box: the part of the extended block's gradient that
/// the block's own input-gradient pass does not produce. Each is a box in extended-block
/// coordinates, zero at the block's own cells.
std::vector<GhostGradient> ghost_input_grads(const WindowPlan& plan, const ConvChannels& ch, const Block& gyb,
                                             const Block& w, bool compute, ExecContext& ctx) {
  std::vector<GhostGradient> ghost_grads;
  if (!compute) return ghost_grads;
  const DType dt = w.dtype;
  std::vector<Range> in;
  for (const auto& ob : plan.boundary_boxes) {
    if (!box_reads(plan, ob, in)) continue;
    const auto gshape = block_shape(ch.batch, ch.out, ob);
    Block gyo = Block::allocate(dt, ctx.device(), gshape);
    copy_box(gyb, local_start(ob, plan.out_block), gyo, std::vector<index_t>(gshape.size(), 0), gshape, ctx);
    Block gin = Block::allocate(dt, ctx.device(), block_shape(ch.batch, ch.in, in));
    exec::conv_backward_input(geometry(plan, ch, in, ob), gyo, w, nullptr, gin, ctx);
    zero_own_cells(plan, ch, in, gin, ctx);
    ghost_grads.push_back({local_start(in, ext_ranges(plan)), std::move(gin)});
  }
  return ghost_grads;
}

}  // namespace

void conv_forward(const WindowPlan& plan, const DistSpec& in_spec, const ConvChannels& ch, const Block& x,
                  const Block& w, const Block* bias, const Block& y, ConvGhosts* saved, const Block* user_ext,
                  ExecContext& ctx) {
  const auto xshape = block_shape(ch.batch, ch.in, plan.in_block);
  SHARD_CHECK(x.shape_vec() == xshape || (x.is_contiguous() && x.numel() == numel_of(xshape)), "conv",
              "local block of shape {} where {} is expected", x.shape_vec(), xshape);
  const bool compute = !plan.empty_output() && ch.batch > 0;
  if (saved) saved->boxes.clear();
  // x as an N, C, spatial block: strided views are read in place by tables that take strides.
  const Block xb = x.shape_vec() == xshape ? x : reshaped(x, xshape);
  const Block yb = reshaped(y, block_shape(ch.batch, ch.out, plan.out_block));
  if (!plan.exchange) {
    if (compute) exec::conv_forward(geometry(plan, ch, plan.in_block, plan.out_block), xb, w, bias, yb, ctx);
    return;
  }
  // Post the exchange (its transport is the halo plan's choice), then compute every local output
  // from the block alone (cells outside it read as zero): right for the outputs whose windows stay
  // in the block or in zero padding, which is all but the boundary boxes. Those are recomputed
  // from the ghost cells once they have arrived. The ghost cells come from the exchange, or from
  // the user's declared ghosts (no communication).
  std::optional<StencilHaloForward> halo_src;
  if (user_ext) halo_src.emplace(*user_ext);
  else halo_src.emplace(w.dtype, in_spec, plan.halo, xb, halo_shape(plan), ctx);
  auto& halo = *halo_src;
  if (compute) exec::conv_forward(geometry(plan, ch, plan.in_block, plan.out_block), xb, w, bias, yb, ctx);
  halo.finish();
  if (!compute) return;
  const auto ext_r = ext_ranges(plan);
  std::vector<Range> in;
  for (const auto& ob : plan.boundary_boxes) {
    if (!box_reads(plan, ob, in)) continue;
    const auto in_shape = block_shape(ch.batch, ch.in, in);
    Block xin = Block::allocate(w.dtype, ctx.device(), in_shape);
    halo.read(local_start(in, ext_r), xin);
    const auto out_shape = block_shape(ch.batch, ch.out, ob);
    Block yo = Block::allocate(w.dtype, ctx.device(), out_shape);
    exec::conv_forward(geometry(plan, ch, in, ob), xin, w, bias, yo, ctx);
    copy_box(yo, std::vector<index_t>(out_shape.size(), 0), yb, local_start(ob, plan.out_block), out_shape, ctx);
    if (saved) {
      // Keep only the ghost cells: the block's own cells are in x, which backward reads anyway.
      zero_own_cells(plan, ch, in, xin, ctx);
      saved->boxes.push_back({ob, in, std::move(xin)});
    }
  }
}

Block conv_backward(const WindowPlan& plan, const DistSpec& in_spec, const ConvChannels& ch, const Block& x,
                    const ConvGhosts& ghosts, const Block& gy, const Block& w, bool input_grad, const Block* gw,
                    ExecContext& ctx) {
  const DType dt = w.dtype;
  const bool compute = !plan.empty_output() && ch.batch > 0;
  const auto shape = block_shape(ch.batch, ch.in, plan.in_block);
  const Block gyb = reshaped(gy, block_shape(ch.batch, ch.out, plan.out_block));
  auto compute_gw = [&] {
    if (!gw) return;
    if (!compute) {
      exec::box_zero(*gw, ctx);
      return;
    }
    const Block xb = x.shape_vec() == shape ? x : reshaped(x, shape);
    exec::conv_backward_weight(geometry(plan, ch, plan.in_block, plan.out_block), xb, gyb, *gw, ctx);
    // Boundary outputs also read ghost cells, which the block pass took as zeros: add their part.
    Block tmp = Block::allocate(dt, ctx.device(), gw->shape_vec());
    for (const auto& b : ghosts.boxes) {
      const auto out_shape = block_shape(ch.batch, ch.out, b.out);
      Block gyo = Block::allocate(dt, ctx.device(), out_shape);
      copy_box(gyb, local_start(b.out, plan.out_block), gyo, std::vector<index_t>(out_shape.size(), 0), out_shape,
               ctx);
      exec::conv_backward_weight(geometry(plan, ch, b.in, b.out), b.ghost, gyo, tmp, ctx);
      exec::box_add(*gw, tmp, ctx);
    }
  };
  /// The block's own input gradient: every local output's contribution to the block's cells.
  auto block_grad = [&] {
    if (!compute) return zeros(dt, shape, ctx);
    Block g = Block::allocate(dt, ctx.device(), shape);
    exec::conv_backward_input(geometry(plan, ch, plan.in_block, plan.out_block), gyb, w, nullptr, g, ctx);
    return g;
  };
  if (!input_grad) {
    compute_gw();
    return Block{};
  }
  if (!plan.exchange) {
    Block gx = block_grad();
    compute_gw();
    return gx;
  }
  // The halo plan says which gradient it sends home (its transport is its own choice).
  StencilHaloAdjoint adj(dt, in_spec, plan.halo, halo_shape(plan), ctx);
  if (adj.wants_extended_gradient()) {
    // The gradient of the extended block, whose halo adjoint sends the ghost cells' gradients to
    // their owners while the weight gradient is computed.
    const auto ext_r = ext_ranges(plan);
    const auto ext_shape = block_shape(ch.batch, ch.in, ext_r);
    Block g = compute ? Block::allocate(dt, ctx.device(), ext_shape) : zeros(dt, ext_shape, ctx);
    if (compute) exec::conv_backward_input(geometry(plan, ch, ext_r, plan.out_block), gyb, w, nullptr, g, ctx);
    adj.start(g);
    g = Block{};
    compute_gw();
    return adj.finish();
  }
  // Thin or sliced: the block's gradient from one kernel call on the block; the ghost cells'
  // gradients from the boundary boxes only (small), in flight meanwhile.
  adj.start(ghost_input_grads(plan, ch, gyb, w, compute, ctx));
  Block gx = block_grad();
  adj.progress(gx);
  compute_gw();  // while the last transfer is in flight
  return adj.finish(gx);
}

}  // namespace shard::nn::functional::detail
