// The type-erased core of the domain-parallel convolution (nn/functional/conv.hpp): forward with
// the halo exchange overlapped by the computation on the rank's own block, and backward (input
// gradient through the halo adjoint, overlapped by the weight gradient). Only the conv schedule
// lives here; the halo transports (thin faces, whole block, sliced adjoint) are the halo plan's
// options in dist/halo_transport.hpp.
#include <algorithm>
#include <cstring>
#include <optional>

#include "shardtensor/nn/functional/conv.hpp"
#include "shardtensor/dist/halo_transport.hpp"
#include "shardtensor/exec/box.hpp"

namespace shard::nn::functional {

namespace {
/// Overlap of the halo exchanges with compute: ExecSettings::overlap_halo of the calling thread's
/// current CPU context (a benchmark switch; results are identical).
bool conv_overlap(Device dev) { return current_context(dev).settings().overlap_halo; }
/// Slice size of the sliced halo adjoint: ExecSettings::halo_chunk_bytes (at least 1).
std::size_t conv_backward_chunk_bytes(Device dev) {
  return std::max<std::size_t>(current_context(dev).settings().halo_chunk_bytes, 1);
}
}  // namespace

}  // namespace shard::nn::functional

namespace shard::nn::functional::detail {

namespace {

using shard::detail::ConvGeometry;
using shard::Block;


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

/// A contiguous block of `shape` at `data` on `dev`.
Block view(DType dt, Device dev, const void* data, const std::vector<index_t>& shape) {
  return Block::view(dt, dev, const_cast<void*>(data), shape.data(), static_cast<int>(shape.size()));
}

index_t vol3(const std::array<index_t, 3>& e) { return e[0] * e[1] * e[2]; }

index_t numel_of(const std::vector<index_t>& s) {
  index_t n = 1;
  for (auto e : s) n *= e;
  return n;
}

/// A contiguous 1-d block of n elements at `data` on `dev` (the conv family checks element counts).
Block flat(DType dt, Device dev, const void* data, index_t n) {
  return Block::view(dt, dev, const_cast<void*>(data), &n, 1);
}

/// The conv family's kernels on contiguous operands at raw pointers on `dev` (shapes from g).
void conv_fwd(DType dt, Device dev, const ConvGeometry& g, const void* x, const void* w, const void* bias, void* y) {
  const index_t wn = g.out_channels * (g.in_channels / g.groups) * vol3(g.kernel);
  const Block bb = bias ? flat(dt, dev, bias, g.out_channels) : Block{};
  exec::conv_forward(g, flat(dt, dev, x, g.batch * g.in_channels * vol3(g.in)), flat(dt, dev, w, wn),
                     bias ? &bb : nullptr, flat(dt, dev, y, g.batch * g.out_channels * vol3(g.out)),
                     current_context(dev));
}
void conv_bwd_data(DType dt, Device dev, const ConvGeometry& g, const void* gy, const void* w, void* gx) {
  const index_t wn = g.out_channels * (g.in_channels / g.groups) * vol3(g.kernel);
  exec::conv_backward_data(g, flat(dt, dev, gy, g.batch * g.out_channels * vol3(g.out)), flat(dt, dev, w, wn),
                           nullptr, flat(dt, dev, gx, g.batch * g.in_channels * vol3(g.in)), current_context(dev));
}
void conv_bwd_filter(DType dt, Device dev, const ConvGeometry& g, const void* x, const void* gy, void* gw) {
  const index_t wn = g.out_channels * (g.in_channels / g.groups) * vol3(g.kernel);
  exec::conv_backward_filter(g, flat(dt, dev, x, g.batch * g.in_channels * vol3(g.in)),
                             flat(dt, dev, gy, g.batch * g.out_channels * vol3(g.out)), flat(dt, dev, gw, wn),
                             current_context(dev));
}
/// The same with the rank's own block x as a Block: a strided view (e.g. the interior of a user's
/// halo-padded array) is read in place by kernels that take input strides (exec/conv.hpp).
void conv_fwd(DType dt, Device dev, const ConvGeometry& g, const Block& x, const void* w, const void* bias, void* y) {
  if (x.is_contiguous()) return conv_fwd(dt, dev, g, x.data, w, bias, y);
  const index_t wn = g.out_channels * (g.in_channels / g.groups) * vol3(g.kernel);
  const Block bb = bias ? flat(dt, dev, bias, g.out_channels) : Block{};
  exec::conv_forward(g, x, flat(dt, dev, w, wn), bias ? &bb : nullptr,
                     flat(dt, dev, y, g.batch * g.out_channels * vol3(g.out)), current_context(dev));
}
void conv_bwd_filter(DType dt, Device dev, const ConvGeometry& g, const Block& x, const void* gy, void* gw) {
  if (x.is_contiguous()) return conv_bwd_filter(dt, dev, g, x.data, gy, gw);
  const index_t wn = g.out_channels * (g.in_channels / g.groups) * vol3(g.kernel);
  exec::conv_backward_filter(g, x, flat(dt, dev, gy, g.batch * g.out_channels * vol3(g.out)), flat(dt, dev, gw, wn),
                             current_context(dev));
}

/// Zeros the box [lo, lo + len) of b.
void zero_box(const Block& b, const std::vector<index_t>& lo, const std::vector<index_t>& len) {
  exec::box_zero(exec::sub_box(b, lo, len), current_context(b.device));
}

/// dst[dst_lo + i] = src[src_lo + i] over the box `len`.
void copy_box(const Block& src, const std::vector<index_t>& slo, const Block& dst, const std::vector<index_t>& dlo,
              const std::vector<index_t>& len) {
  exec::box_copy(exec::sub_box(dst, dlo, len), exec::sub_box(src, slo, len), current_context(dst.device));
}

Block allocate(DType dt, Device dev, const std::vector<index_t>& shape) { return Block::allocate(dt, dev, shape); }

/// The halo plan's transport options for this conv: the context's transport and slice size, the
/// window spans (block cells a boundary box reads), spatial dims sliceable.
shard::detail::StencilHaloOptions halo_options(const WindowPlan& plan, Device dev) {
  shard::detail::StencilHaloOptions o;
  o.op = "conv";
  o.transport = current_context(dev).settings().halo_transport;
  o.chunk_bytes = conv_backward_chunk_bytes(dev);
  o.reach.assign(2, 0);
  for (int d = 0; d < plan.spatial(); ++d) {
    o.reach.push_back(plan.dims[static_cast<std::size_t>(d)].span());
    o.slice_dims.push_back(d + 2);
  }
  return o;
}

Block zeros(DType dt, Device dev, const std::vector<index_t>& shape) {
  Block b = allocate(dt, dev, shape);
  exec::box_zero(b, current_context(dev));
  return b;
}

/// Ghost-cell gradients of every boundary box: the part of the extended block's gradient that
/// the block's own input-gradient pass does not produce.
/// Each is a box in extended-block coordinates, zero at the block's own cells.
std::vector<shard::detail::GhostGradient> ghost_input_grads(DType dt, Device dev, const WindowPlan& plan,
                                                            const ConvChannels& ch, const void* gy, const void* w,
                                                            bool compute) {
  std::vector<shard::detail::GhostGradient> ghost_grads;
  if (!compute) return ghost_grads;
  const int S = plan.spatial();
  const Block gyb = view(dt, dev, gy, block_shape(ch.batch, ch.out, plan.out_block));
  for (const auto& ob : plan.boundary_boxes) {
    std::vector<Range> in;
    bool reads = true;
    for (int d = 0; d < S; ++d) {
      in.push_back(plan.read_range(d, ob[static_cast<std::size_t>(d)].lo, ob[static_cast<std::size_t>(d)].hi()));
      reads = reads && in.back().len > 0;
    }
    if (!reads) continue;
    const auto gshape = block_shape(ch.batch, ch.out, ob);
    Block gyo = allocate(dt, dev, gshape);
    copy_box(gyb, local_start(ob, plan.out_block), gyo, std::vector<index_t>(gshape.size(), 0), gshape);
    Block gin = allocate(dt, dev, block_shape(ch.batch, ch.in, in));
    conv_bwd_data(dt, dev, geometry(plan, ch, in, ob), gyo.data, w, gin.data);
    std::vector<index_t> lo{0, 0}, len{ch.batch, ch.in};
    bool overlap = true;
    for (int d = 0; d < S; ++d) {  // the block's cells are counted by the block's own pass
      const auto u = static_cast<std::size_t>(d);
      const index_t a = std::max(in[u].lo, plan.in_block[u].lo), b = std::min(in[u].hi(), plan.in_block[u].hi());
      overlap = overlap && b > a;
      lo.push_back(a - in[u].lo);
      len.push_back(std::max<index_t>(0, b - a));
    }
    if (overlap) zero_box(gin, lo, len);
    ghost_grads.push_back({local_start(in, ext_ranges(plan)), std::move(gin)});
  }
  return ghost_grads;
}

}  // namespace

void dist_conv_forward(DType dt, Device dev, const WindowPlan& plan, const DistSpec& in_spec, const ConvChannels& ch,
                       const Block& x, const void* w, const void* bias, void* y, ConvGhosts* saved,
                       const Block* user_ext) {
  const auto xshape = block_shape(ch.batch, ch.in, plan.in_block);
  SHARD_CHECK(x.shape_vec() == xshape || (x.is_contiguous() && x.numel() == numel_of(xshape)), "conv",
              "local block of shape {} where {} is expected", x.shape_vec(), xshape);
  const bool compute = !plan.empty_output() && ch.batch > 0;
  if (saved) saved->boxes.clear();
  if (!plan.exchange) {
    if (compute) conv_fwd(dt, dev, geometry(plan, ch, plan.in_block, plan.out_block), x, w, bias, y);
    return;
  }
  // Post the exchange (its transport is the halo plan's choice), then compute every local output
  // from the block alone (cells outside it read as zero): right for the outputs whose windows stay
  // in the block or in zero padding, which is all but the boundary boxes. Those are recomputed
  // from the ghost cells once they have arrived.
  const Block xb = x.shape_vec() == xshape ? x : view(dt, dev, x.data, xshape);  // strided views read in place
  // The ghost cells come from the exchange, or from the user's declared ghosts (no communication).
  std::optional<shard::detail::StencilHaloForward> halo_src;
  if (user_ext) halo_src.emplace(*user_ext);
  else halo_src.emplace(dt, in_spec, plan.halo, xb, halo_options(plan, dev));
  auto& halo = *halo_src;
  if (!conv_overlap(dev)) halo.finish();  // benchmark switch: the same work, without the overlap
  if (compute) conv_fwd(dt, dev, geometry(plan, ch, plan.in_block, plan.out_block), x, w, bias, y);
  halo.finish();
  if (!compute) return;
  const auto ext_r = ext_ranges(plan);
  const Block yb = view(dt, dev, y, block_shape(ch.batch, ch.out, plan.out_block));
  for (const auto& ob : plan.boundary_boxes) {
    std::vector<Range> in;
    bool reads = true;
    for (int d = 0; d < plan.spatial(); ++d) {
      in.push_back(plan.read_range(d, ob[static_cast<std::size_t>(d)].lo, ob[static_cast<std::size_t>(d)].hi()));
      reads = reads && in.back().len > 0;
    }
    if (!reads) continue;  // reads zero padding only along some dim: the block pass was exact
    const auto in_shape = block_shape(ch.batch, ch.in, in);
    Block xin = allocate(dt, dev, in_shape);
    halo.read(local_start(in, ext_r), xin);
    const auto out_shape = block_shape(ch.batch, ch.out, ob);
    Block yo = allocate(dt, dev, out_shape);
    conv_fwd(dt, dev, geometry(plan, ch, in, ob), xin.data, w, bias, yo.data);
    copy_box(yo, std::vector<index_t>(out_shape.size(), 0), yb, local_start(ob, plan.out_block), out_shape);
    if (saved) {
      // Keep only the ghost cells: the block's own cells are in x, which backward reads anyway.
      std::vector<index_t> lo{0, 0}, len{ch.batch, ch.in};
      bool overlap = true;
      for (int d = 0; d < plan.spatial(); ++d) {
        const auto u = static_cast<std::size_t>(d);
        const index_t a = std::max(in[u].lo, plan.in_block[u].lo), b = std::min(in[u].hi(), plan.in_block[u].hi());
        overlap = overlap && b > a;
        lo.push_back(a - in[u].lo);
        len.push_back(std::max<index_t>(0, b - a));
      }
      if (overlap) zero_box(xin, lo, len);
      saved->boxes.push_back({ob, in, std::move(xin)});
    }
  }
}

Block dist_conv_backward(DType dt, Device dev, const WindowPlan& plan, const DistSpec& in_spec, const ConvChannels& ch,
                         const Block& x, const ConvGhosts& ghosts, const void* gy, const void* w, bool input_grad,
                         void* gw) {
  using shard::detail::HaloAdjointKind;
  const bool compute = !plan.empty_output() && ch.batch > 0;
  const auto shape = block_shape(ch.batch, ch.in, plan.in_block);
  auto compute_gw = [&] {
    if (!gw) return;
    index_t wn = ch.out * (ch.in / ch.groups);
    for (const auto& d : plan.dims) wn *= d.kernel;
    if (!compute) {
      exec::box_zero(view(dt, dev, gw, {wn}), current_context(dev));
      return;
    }
    conv_bwd_filter(dt, dev, geometry(plan, ch, plan.in_block, plan.out_block), x, gy, gw);
    // Boundary outputs also read ghost cells, which the block pass took as zeros: add their part.
    const Block gyb = view(dt, dev, gy, block_shape(ch.batch, ch.out, plan.out_block));
    const Block gwb = view(dt, dev, gw, {wn});
    Block tmp = allocate(dt, dev, {wn});
    for (const auto& b : ghosts.boxes) {
      const auto out_shape = block_shape(ch.batch, ch.out, b.out);
      Block gyo = allocate(dt, dev, out_shape);
      copy_box(gyb, local_start(b.out, plan.out_block), gyo, std::vector<index_t>(out_shape.size(), 0), out_shape);
      conv_bwd_filter(dt, dev, geometry(plan, ch, b.in, b.out), b.ghost.data, gyo.data, tmp.data);
      exec::box_add(gwb, tmp, current_context(dev));
    }
  };
  /// The block's own input gradient: every local output's contribution to the block's cells.
  auto block_grad = [&] {
    Block g = compute ? allocate(dt, dev, shape) : zeros(dt, dev, shape);
    if (compute) conv_bwd_data(dt, dev, geometry(plan, ch, plan.in_block, plan.out_block), gy, w, g.data);
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
  // The input gradient's transport is the halo plan's choice (dist/halo_transport.hpp).
  const auto opt = halo_options(plan, dev);
  const HaloAdjointKind kind = shard::detail::choose_halo_adjoint(dt, in_spec, plan.halo, opt);
  if (kind == HaloAdjointKind::whole_block) {
    // The gradient of the extended block, whose halo adjoint sends the ghost cells' gradients to
    // their owners while the weight gradient is computed.
    const auto ext_r = ext_ranges(plan);
    const auto ext_shape = block_shape(ch.batch, ch.in, ext_r);
    Block g = compute ? allocate(dt, dev, ext_shape) : zeros(dt, dev, ext_shape);
    if (compute) conv_bwd_data(dt, dev, geometry(plan, ch, ext_r, plan.out_block), gy, w, g.data);
    shard::detail::HaloTransfer tr(dt, in_spec, plan.halo, shard::detail::HaloTransfer::Direction::adjoint, g, true);
    g = Block{};
    if (!conv_overlap(dev)) tr.finish();  // benchmark switch
    compute_gw();
    return tr.finish();
  }
  // Thin or sliced: the block's gradient from one kernel call on the block; the ghost cells'
  // gradients from the boundary boxes only (small), in flight meanwhile.
  shard::detail::GhostHaloAdjoint adj(dt, in_spec, plan.halo, dev, kind,
                                      ghost_input_grads(dt, dev, plan, ch, gy, w, compute), opt);
  Block gx = block_grad();
  adj.progress(gx);
  if (!conv_overlap(dev)) adj.finish(gx);  // benchmark switch
  compute_gw();                            // while the last transfer is in flight
  adj.finish(gx);
  return gx;
}

}  // namespace shard::nn::functional::detail
