// The type-erased core of the domain-parallel convolution (nn/functional/conv.hpp): forward with
// the halo exchange overlapped by the computation on the rank's own block, and backward (input
// gradient through the halo adjoint, overlapped by the weight gradient).
#include <algorithm>
#include <cstring>

#include "shardtensor/nn/functional/conv.hpp"
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

/// dst[dst_lo + i] += src[src_lo + i] over the box `len`.
void add_box(const Block& src, const std::vector<index_t>& slo, const Block& dst, const std::vector<index_t>& dlo,
             const std::vector<index_t>& len) {
  exec::box_add(exec::sub_box(dst, dlo, len), exec::sub_box(src, slo, len), current_context(dst.device));
}

/// dst[dst_lo + i] = src[src_lo + i] over the box `len`.
void copy_box(const Block& src, const std::vector<index_t>& slo, const Block& dst, const std::vector<index_t>& dlo,
              const std::vector<index_t>& len) {
  exec::box_copy(exec::sub_box(dst, dlo, len), exec::sub_box(src, slo, len), current_context(dst.device));
}

/// Calls f(lo, len) (full N, C, spatial boxes) for disjoint boxes covering `ext` minus the inner
/// spatial box [ilo, ihi) clamped to ext (an onion decomposition, dim by dim).
template <class F>
void for_each_outer_box(const std::vector<index_t>& ext, const std::vector<index_t>& ilo,
                        const std::vector<index_t>& ihi, F&& f) {
  const std::size_t R = ext.size();
  std::vector<index_t> lo(R, 0), len = ext;
  for (std::size_t d = 2; d < R; ++d) {
    auto emit = [&](index_t a, index_t b) {
      if (b <= a) return;
      auto l = lo, n = len;
      l[d] = a;
      n[d] = b - a;
      for (auto e : n)
        if (e == 0) return;
      f(l, n);
    };
    const index_t a = std::clamp<index_t>(ilo[d - 2], 0, ext[d]), b = std::clamp<index_t>(ihi[d - 2], a, ext[d]);
    emit(0, a);
    emit(b, ext[d]);
    lo[d] = a;
    len[d] = b - a;
  }
}

index_t numel_of(const std::vector<index_t>& s) {
  index_t n = 1;
  for (auto e : s) n *= e;
  return n;
}

Block allocate(DType dt, Device dev, const std::vector<index_t>& shape) { return Block::allocate(dt, dev, shape); }

Block zeros(DType dt, Device dev, const std::vector<index_t>& shape) {
  Block b = allocate(dt, dev, shape);
  exec::box_zero(b, current_context(dev));
  return b;
}

/// The thin halo. When a single spatial dim d needs ghost cells, the halo exchange and its
/// adjoint run on the tensor T made of every part's first and last `edge` cells along d (the
/// whole block when it is thinner): T holds every cell that any rank's ghost layers copy from
/// (every boundary mode, multi-hop included, since edge > the ghost widths) and every block cell
/// the boundary boxes read (edge >= span: their windows start outside the block). T keeps the
/// global order of those cells, so the exchange on T with the same widths and modes delivers
/// exactly the ghost cells of the real one, and neither direction copies the block's interior.
struct Thin {
  bool ok = false;
  int d = -1;
  index_t edge = 0, t = 0, off = 0, n = 0;
  DistSpec spec;
  /// Block-local row of T-local row j along d.
  index_t block_row(index_t j) const { return n <= 2 * edge || j < edge ? j : n - t + j; }
};

Thin make_thin(const WindowPlan& plan, const DistSpec& in_spec) {
  Thin th;
  int count = 0;
  for (int d = 0; d < plan.spatial(); ++d) {
    const auto u = static_cast<std::size_t>(d);
    if (plan.halo_lo[u] + plan.halo_hi[u] > 0) {
      ++count;
      th.d = d;
    }
  }
  if (count != 1) return th;
  const auto u = static_cast<std::size_t>(th.d);
  th.edge = std::max(std::max(plan.halo_lo[u], plan.halo_hi[u]) + 1, plan.dims[u].span());
  const ShardLayout& L = in_spec.layout(th.d + 2);
  std::vector<index_t> ts;
  index_t total = 0;
  for (index_t p = 0; p < L.parts(); ++p) {
    ts.push_back(std::min(L.size(p), 2 * th.edge));
    total += ts.back();
  }
  auto global = in_spec.global_shape();
  global[u + 2] = total;
  ShardSizes sizes = in_spec.sizes();
  sizes[u + 2] = L.parts() > 1 ? ts : std::vector<index_t>{};
  th.spec = DistSpec(in_spec.mesh(), in_spec.placements(), global, sizes);
  th.off = plan.in_block[u].lo;
  th.n = plan.in_block[u].len;
  th.t = std::min(th.n, 2 * th.edge);
  th.ok = true;
  return th;
}

/// This rank's block of T (a view of x when the block is thin enough).
Block thin_local(DType dt, const Thin& th, const Block& xb) {
  if (th.t == th.n) return xb;
  auto shape = xb.shape_vec();
  const auto ud = static_cast<std::size_t>(th.d) + 2;
  shape[ud] = th.t;
  Block tl = allocate(dt, xb.device, shape);
  auto len = shape;
  len[ud] = th.edge;
  std::vector<index_t> z(shape.size(), 0), hi(shape.size(), 0), thi(shape.size(), 0);
  hi[ud] = th.n - th.edge;
  thi[ud] = th.edge;
  copy_box(xb, z, tl, z, len);
  copy_box(xb, hi, tl, thi, len);
  return tl;
}

/// The pieces of the global range [r0, r1) along the thin dim: below the block (T_ext rows), in
/// it (block rows), above it (T_ext rows). Calls f(kind, src_row, dst_offset, len), kind 0 = T_ext.
template <class F>
void thin_pieces(const Thin& th, index_t lo_w, index_t r0, index_t r1, F&& f) {
  const index_t a = std::min(r1, th.off), b0 = std::max(r0, th.off), b1 = std::min(r1, th.off + th.n);
  const index_t c = std::max(r0, th.off + th.n);
  if (a > r0) f(0, r0 - (th.off - lo_w), index_t{0}, a - r0);
  if (b1 > b0) f(1, b0 - th.off, b0 - r0, b1 - b0);
  if (r1 > c) f(0, lo_w + th.t + (c - th.off - th.n), c - r0, r1 - c);
}

/// The gradient of the cells outside the block read by one boundary box (block cells zeroed).
struct GhostGrad {
  std::vector<Range> in;
  Block g;
};

/// Ghost-cell gradients of every boundary box: the part of the extended block's gradient that
/// the block's own input-gradient pass does not produce.
std::vector<GhostGrad> ghost_input_grads(DType dt, Device dev, const WindowPlan& plan, const ConvChannels& ch,
                                         const void* gy, const void* w, bool compute) {
  std::vector<GhostGrad> ghost_grads;
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
    ghost_grads.push_back({std::move(in), std::move(gin)});
  }
  return ghost_grads;
}

}  // namespace

void dist_conv_forward(DType dt, Device dev, const WindowPlan& plan, const DistSpec& in_spec, const ConvChannels& ch,
                       const Block& x, const void* w, const void* bias, void* y, ConvGhosts* saved) {
  const auto xshape = block_shape(ch.batch, ch.in, plan.in_block);
  SHARD_CHECK(x.shape_vec() == xshape || (x.is_contiguous() && x.numel() == numel_of(xshape)), "conv",
              "local block of shape {} where {} is expected", x.shape_vec(), xshape);
  const bool compute = !plan.empty_output() && ch.batch > 0;
  if (saved) saved->boxes.clear();
  if (!plan.exchange) {
    if (compute) conv_fwd(dt, dev, geometry(plan, ch, plan.in_block, plan.out_block), x, w, bias, y);
    return;
  }
  // Post the exchange, then compute every local output from the block alone (cells outside it
  // read as zero): right for the outputs whose windows stay in the block or in zero padding,
  // which is all but the boundary boxes. Those are recomputed from the finished extended block.
  const Thin th = make_thin(plan, in_spec);
  const Block xb = x.shape_vec() == xshape ? x : view(dt, dev, x.data, xshape);
  if (th.ok) shard::detail::validate_halo(in_spec, plan.halo, "conv");  // the real halo's limits
  shard::detail::HaloTransfer tr(dt, th.ok ? th.spec : in_spec, plan.halo,
                                 shard::detail::HaloTransfer::Direction::forward, th.ok ? thin_local(dt, th, xb) : xb);
  if (!conv_overlap(dev)) tr.finish();  // benchmark switch: the same work, without the overlap
  if (compute) conv_fwd(dt, dev, geometry(plan, ch, plan.in_block, plan.out_block), x, w, bias, y);
  const Block& ext = tr.finish();
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
    if (!th.ok) {
      copy_box(ext, local_start(in, ext_r), xin, std::vector<index_t>(in_shape.size(), 0), in_shape);
    } else {
      const auto ud = static_cast<std::size_t>(th.d);
      thin_pieces(th, plan.halo_lo[ud], in[ud].lo, in[ud].hi(), [&](int kind, index_t src, index_t dst, index_t len) {
        auto slo = local_start(in, plan.in_block), dlo = std::vector<index_t>(in_shape.size(), 0), l = in_shape;
        slo[ud + 2] = src;
        dlo[ud + 2] = dst;
        l[ud + 2] = len;
        copy_box(kind == 0 ? ext : xb, slo, xin, dlo, l);
      });
    }
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
  using shard::detail::HaloTransfer;
  const bool compute = !plan.empty_output() && ch.batch > 0;
  const int S = plan.spatial();
  Block gx;
  // Input gradient. Without a chunk dim (below): the gradient of the extended block (or of the
  // block itself without a halo), then the halo adjoint sends the ghost cells' gradients to
  // their owners while the weight gradient is computed. With an unsharded zero-padded spatial
  // dim `cd` and a large block: the sliced transport below, whose memory beyond dx is a slice.
  bool gw_done = false;
  auto compute_gw = [&] {
    gw_done = true;
    if (gw) {
      index_t wn = ch.out * (ch.in / ch.groups);
      for (const auto& d : plan.dims) wn *= d.kernel;
      if (compute) {
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
      } else {
        exec::box_zero(view(dt, dev, gw, {wn}), current_context(dev));
      }
    }
  };
  std::unique_ptr<HaloTransfer> tr;
  Thin th;
  int cd = -1;
  auto land = [&] {
    if (!tr) return;
    gx = tr->finish();
    tr.reset();
  };
  if (input_grad && !plan.exchange) {
    const auto shape = block_shape(ch.batch, ch.in, plan.in_block);
    gx = compute ? allocate(dt, dev, shape) : zeros(dt, dev, shape);
    if (compute) conv_bwd_data(dt, dev, geometry(plan, ch, plan.in_block, plan.out_block), gy, w, gx.data);
  } else if (input_grad && (th = make_thin(plan, in_spec)).ok) {
    // Thin transport: ghost gradients from the boundary boxes go into a zero T_ext, whose
    // adjoint (on T) is in flight while dx of the block and dW are computed; what it returns is
    // added to dx's face cells.
    const auto ud = static_cast<std::size_t>(th.d) + 2;
    const std::vector<GhostGrad> ghost_grads = ghost_input_grads(dt, dev, plan, ch, gy, w, compute);
    auto zshape = block_shape(ch.batch, ch.in, plan.in_block);
    zshape[ud] = th.t + plan.halo_lo[ud - 2] + plan.halo_hi[ud - 2];
    Block z = zeros(dt, dev, zshape);
    for (const auto& gg : ghost_grads)
      thin_pieces(th, plan.halo_lo[ud - 2], gg.in[ud - 2].lo, gg.in[ud - 2].hi(),
                  [&](int kind, index_t src, index_t dst, index_t len) {
                    if (kind != 0) return;  // block cells: zero in gg (counted by the block pass)
                    auto dlo = local_start(gg.in, plan.in_block), slo = std::vector<index_t>(zshape.size(), 0);
                    auto l = gg.g.shape_vec();
                    dlo[ud] = src;
                    slo[ud] = dst;
                    l[ud] = len;
                    add_box(gg.g, slo, z, dlo, l);
                  });
    tr = std::make_unique<HaloTransfer>(dt, th.spec, plan.halo, HaloTransfer::Direction::adjoint, z, true);
    z = Block{};
    Block res;
    if (!conv_overlap(dev)) {  // benchmark switch
      res = tr->finish();
      tr.reset();
    }
    const auto shape = block_shape(ch.batch, ch.in, plan.in_block);
    gx = compute ? allocate(dt, dev, shape) : zeros(dt, dev, shape);
    if (compute) conv_bwd_data(dt, dev, geometry(plan, ch, plan.in_block, plan.out_block), gy, w, gx.data);
    compute_gw();
    if (tr) res = tr->finish();
    tr.reset();
    // T-local rows [0, t) are block rows block_row(j): one run, or the two faces.
    const index_t first = th.t == th.n ? th.t : th.edge;
    for (index_t j0 : {index_t{0}, first}) {
      const index_t len = j0 == 0 ? first : th.t - first;
      if (len <= 0) continue;
      std::vector<index_t> slo(static_cast<std::size_t>(res.rank), 0), dlo(static_cast<std::size_t>(res.rank), 0);
      auto l = res.shape_vec();
      slo[ud] = j0;
      dlo[ud] = th.block_row(j0);
      l[ud] = len;
      add_box(res, slo, gx, dlo, l);
    }
  } else if (input_grad) {
    const auto ext_r = ext_ranges(plan);
    const auto ext_shape = block_shape(ch.batch, ch.in, ext_r);
    index_t nch = 1;
    for (int d = 0; d < S && cd < 0; ++d) {
      const auto u = static_cast<std::size_t>(d);
      if (in_spec.layout(d + 2).parts() == 1 && plan.halo_lo[u] == 0 && plan.halo_hi[u] == 0) cd = d;
    }
    if (cd >= 0) {
      // The slice count must be the same on every rank (each slice is a collective): from the
      // global size per rank, not from this rank's (uneven) block.
      const double bytes = static_cast<double>(numel_of(in_spec.global_shape())) *
                           static_cast<double>(dtype_size(dt)) / static_cast<double>(in_spec.mesh().size());
      nch = std::min<index_t>(plan.in_block[static_cast<std::size_t>(cd)].len,
                              static_cast<index_t>(bytes / static_cast<double>(conv_backward_chunk_bytes(dev))) + 1);
      if (nch <= 1) cd = -1;
    }
    if (cd < 0) {
      Block g = compute ? allocate(dt, dev, ext_shape) : zeros(dt, dev, ext_shape);
      if (compute) conv_bwd_data(dt, dev, geometry(plan, ch, ext_r, plan.out_block), gy, w, g.data);
      tr = std::make_unique<HaloTransfer>(dt, in_spec, plan.halo, HaloTransfer::Direction::adjoint, g, true);
      if (!conv_overlap(dev)) land();  // benchmark switch
    } else {
      // Sliced transport. The block's own gradient comes from one kernel call on the block
      // (exact for the block's cells: every local output's contribution); the ghost cells'
      // gradients come from the boundary boxes only (small). The halo adjoint then only has to
      // carry ghost gradients: it runs slice by slice along cd on a zero buffer holding them,
      // and what it returns (non-zero only within max width + 1 of the block faces) is added
      // to the block's gradient. Besides dx this needs one slice buffer and one slice result.
      const auto uc = static_cast<std::size_t>(cd);
      const Range cb = plan.in_block[uc];
      const std::vector<GhostGrad> ghost_grads = ghost_input_grads(dt, dev, plan, ch, gy, w, compute);
      // Faces that can receive gradients from the adjoint: within max(lo, hi) + 1 of the block
      // faces along every dim with a halo (the sources of every ghost cell, in every mode).
      std::vector<index_t> inner_lo(static_cast<std::size_t>(S)), inner_hi(static_cast<std::size_t>(S));
      for (int d = 0; d < S; ++d) {
        const auto u = static_cast<std::size_t>(d);
        const index_t n = plan.in_block[u].len;
        if (plan.halo_lo[u] + plan.halo_hi[u] == 0) {
          inner_lo[u] = 0;
          inner_hi[u] = n;
        } else {
          const index_t r = std::max(plan.halo_lo[u], plan.halo_hi[u]) + 1;
          inner_lo[u] = std::min(r, n);
          inner_hi[u] = std::max(inner_lo[u], n - r);
        }
      }
      index_t max_chunk = 0;
      for (index_t k = 0; k < nch; ++k) max_chunk = std::max(max_chunk, balanced_size(cb.len, nch, k));
      auto zmax = block_shape(ch.batch, ch.in, ext_r);
      zmax[uc + 2] = max_chunk;
      const Block zbuf = zeros(dt, dev, zmax);
      std::vector<index_t> zshape = zmax;
      index_t pending_lo = 0;
      auto post = [&](index_t k) {
        const index_t u0 = cb.lo + balanced_offset(cb.len, nch, k), u1 = u0 + balanced_size(cb.len, nch, k);
        auto shape = block_shape(ch.batch, ch.in, ext_r);
        shape[uc + 2] = u1 - u0;
        Block z = view(dt, dev, zbuf.data, shape);
        z.owner = zbuf.owner;
        if (shape != zshape) {  // another slice extent: the zero layout moved
          exec::box_zero(view(dt, dev, zbuf.data, zmax), current_context(dev));
          zshape = shape;
        }
        for (const auto& gg : ghost_grads) {
          const index_t a = std::max(u0, gg.in[uc].lo), b = std::min(u1, gg.in[uc].hi());
          if (b <= a) continue;
          std::vector<index_t> slo{0, 0}, dlo{0, 0}, len{ch.batch, ch.in};
          for (int d = 0; d < S; ++d) {
            const auto u = static_cast<std::size_t>(d);
            const bool c = u == uc;
            slo.push_back(c ? a - gg.in[u].lo : 0);
            dlo.push_back(c ? a - u0 : gg.in[u].lo - ext_r[u].lo);
            len.push_back(c ? b - a : gg.in[u].len);
          }
          add_box(gg.g, slo, z, dlo, len);
        }
        auto gk = in_spec.global_shape();
        gk[uc + 2] = u1 - u0;
        const DistSpec chunk_spec(in_spec.mesh(), in_spec.placements(), gk, in_spec.sizes());
        tr = std::make_unique<HaloTransfer>(dt, chunk_spec, plan.halo, HaloTransfer::Direction::adjoint, z, true);
        pending_lo = u0;
      };
      auto land_slice = [&] {
        if (!tr) return;
        const Block res = tr->finish();
        tr.reset();
        std::vector<index_t> blo(static_cast<std::size_t>(res.rank), 0);
        blo[uc + 2] = pending_lo - cb.lo;
        for_each_outer_box(res.shape_vec(), inner_lo, inner_hi,
                           [&](const std::vector<index_t>& lo, const std::vector<index_t>& len) {
                             auto d = lo;
                             d[uc + 2] += blo[uc + 2];
                             add_box(res, lo, gx, d, len);
                           });
        // Restore the zero buffer: the ghosts and the faces the adjoint added into.
        Block z = view(dt, dev, zbuf.data, zshape);
        std::vector<index_t> zlo(static_cast<std::size_t>(S)), zhi(static_cast<std::size_t>(S));
        for (int d = 0; d < S; ++d) {
          const auto u = static_cast<std::size_t>(d);
          zlo[u] = inner_lo[u] + plan.halo_lo[u];
          zhi[u] = inner_hi[u] + plan.halo_lo[u];
        }
        for_each_outer_box(zshape, zlo, zhi, [&](const std::vector<index_t>& lo, const std::vector<index_t>& len) {
          zero_box(z, lo, len);
        });
      };
      post(0);  // in flight while the block's own gradient is computed
      const auto shape = block_shape(ch.batch, ch.in, plan.in_block);
      gx = compute ? allocate(dt, dev, shape) : zeros(dt, dev, shape);
      if (compute) conv_bwd_data(dt, dev, geometry(plan, ch, plan.in_block, plan.out_block), gy, w, gx.data);
      for (index_t k = 1; k < nch; ++k) {
        land_slice();
        post(k);
      }
      if (!conv_overlap(dev)) land_slice();  // benchmark switch
      compute_gw();  // while the last slice is in flight
      land_slice();
    }
  }
  if (!gw_done) compute_gw();
  land();
  return gx;
}

}  // namespace shard::nn::functional::detail
