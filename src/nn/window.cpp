// Layout algebra of the window ops: the anchor rule, transposed layouts, halo widths and the
// boundary boxes of one rank (see nn/functional/window.hpp).
#include "shardtensor/nn/functional/window.hpp"

#include <algorithm>

namespace shard::nn::functional::detail {

namespace {

index_t ceil_div(index_t a, index_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

void check_window_dim(const char* op, const WindowDim& w, int d) {
  SHARD_CHECK(w.kernel >= 1 && w.stride >= 1 && w.dilation >= 1, op,
              "spatial dim {}: kernel {}, stride {} and dilation {} must be >= 1", d, w.kernel, w.stride, w.dilation);
  SHARD_CHECK(w.pad_lo >= 0 && w.pad_hi >= 0, op, "spatial dim {}: padding lo {} hi {} must be >= 0", d, w.pad_lo,
              w.pad_hi);
  SHARD_CHECK(std::max({w.kernel, w.stride, w.dilation, w.pad_lo, w.pad_hi}) <= kMaxWindowParam, op,
              "spatial dim {}: kernel {}, stride {}, dilation {}, padding {} + {} must each be at most {}", d, w.kernel,
              w.stride, w.dilation, w.pad_lo, w.pad_hi, kMaxWindowParam);
}

index_t anchor_of(const WindowDim& w) { return std::clamp<index_t>(w.pad_lo, 0, w.span()); }

}  // namespace

index_t window_output_extent(const char* op, index_t G, const WindowDim& w, int spatial_dim) {
  check_window_dim(op, w, spatial_dim);
  SHARD_CHECK(G >= 1, op, "spatial dim {} has global extent {}; a window op needs >= 1", spatial_dim, G);
  const index_t room = G + w.pad_lo + w.pad_hi - w.span() - 1;
  SHARD_CHECK(room >= 0, op,
              "spatial dim {}: kernel {} dilated by {} spans {} cells, more than the padded global extent {} "
              "(extent {} + padding {} + {})",
              spatial_dim, w.kernel, w.dilation, w.span() + 1, G + w.pad_lo + w.pad_hi, G, w.pad_lo, w.pad_hi);
  return room / w.stride + 1;
}

std::vector<index_t> anchor_output_sizes(const ShardLayout& in, const WindowDim& w, index_t global_out) {
  const index_t G = in.extent(), c = anchor_of(w);
  auto bound = [&](index_t g) -> index_t {
    if (g <= 0) return 0;
    if (g >= G) return global_out;
    return std::clamp<index_t>(ceil_div(g + w.pad_lo - c, w.stride), 0, global_out);
  };
  std::vector<index_t> sizes(static_cast<std::size_t>(in.parts()));
  for (index_t p = 0; p < in.parts(); ++p)
    sizes[static_cast<std::size_t>(p)] = bound(in.offset(p) + in.size(p)) - bound(in.offset(p));
  return sizes;
}

std::vector<index_t> transpose_output_sizes(const ShardLayout& x, const WindowDim& w, index_t global_y) {
  const index_t G = x.extent(), c = anchor_of(w);
  auto start = [&](index_t g) -> index_t {
    if (g <= 0) return 0;
    if (g >= G) return global_y;
    return std::clamp<index_t>(g * w.stride - w.pad_lo + c, 0, global_y);
  };
  std::vector<index_t> sizes(static_cast<std::size_t>(x.parts()));
  for (index_t p = 0; p < x.parts(); ++p)
    sizes[static_cast<std::size_t>(p)] = start(x.offset(p) + x.size(p)) - start(x.offset(p));
  return sizes;
}

DistSpec window_output_spec(const DistSpec& x, index_t out_channels, const std::vector<index_t>& out_extents,
                            const std::vector<std::vector<index_t>>& spatial_sizes) {
  const int R = x.ndim();
  std::vector<index_t> global = x.global_shape();
  global[1] = out_channels;
  ShardSizes sizes(static_cast<std::size_t>(R));
  if (x.layout(0).parts() > 1) sizes[0] = x.layout(0).sizes();
  if (x.layout(1).parts() > 1 && out_channels == x.global_shape()[1]) sizes[1] = x.layout(1).sizes();
  for (int d = 2; d < R; ++d) {
    const auto u = static_cast<std::size_t>(d);
    global[u] = out_extents[u - 2];
    if (x.layout(d).parts() > 1) sizes[u] = spatial_sizes[u - 2];
  }
  return DistSpec(x.mesh(), x.placements(), global, sizes);
}

DistSpec anchor_output_spec(const char* op, const DistSpec& x, index_t out_channels, const std::vector<WindowDim>& dims) {
  std::vector<index_t> ext(dims.size());
  std::vector<std::vector<index_t>> sizes(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) {
    ext[d] = window_output_extent(op, x.global_shape()[d + 2], dims[d], static_cast<int>(d));
    sizes[d] = anchor_output_sizes(x.layout(static_cast<int>(d) + 2), dims[d], ext[d]);
  }
  return window_output_spec(x, out_channels, ext, sizes);
}

Range WindowPlan::read_range(int d, index_t o0, index_t o1) const {
  const auto u = static_cast<std::size_t>(d);
  if (o1 <= o0) return {0, 0};
  const WindowDim& w = dims[u];
  index_t lo = o0 * w.stride - w.pad_lo, hi = (o1 - 1) * w.stride - w.pad_lo + w.span() + 1;
  if (w.mode == Boundary::zero) {
    lo = std::max<index_t>(lo, 0);
    hi = std::min(hi, in_global[u]);
  }
  return hi > lo ? Range{lo, hi - lo} : Range{lo, 0};
}

bool WindowPlan::empty_output() const {
  return std::any_of(out_block.begin(), out_block.end(), [](const Range& r) { return r.len == 0; });
}

WindowPlan make_window_plan(const char* op, const DistSpec& in, const DistSpec& out, std::vector<WindowDim> dims) {
  WindowPlan p;
  const int S = static_cast<int>(dims.size());
  SHARD_CHECK(in.ndim() == S + 2 && out.ndim() == S + 2, op, "specs {} and {} are not N, C + {} spatial dims", in, out,
              S);
  p.dims = std::move(dims);
  const auto& coords = in.mesh().coords();
  p.halo.lo.assign(static_cast<std::size_t>(S + 2), 0);
  p.halo.hi.assign(static_cast<std::size_t>(S + 2), 0);
  p.halo.modes.assign(static_cast<std::size_t>(S + 2), Boundary::zero);
  for (int d = 0; d < S; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const ShardLayout& Li = in.layout(d + 2);
    const ShardLayout& Lo = out.layout(d + 2);
    SHARD_CHECK(Li.parts() == Lo.parts() && in.sharding_mesh_dims(d + 2) == out.sharding_mesh_dims(d + 2), op,
                "input {} and output {} split spatial dim {} differently", in, out, d);
    p.in_global.push_back(Li.extent());
    p.out_global.push_back(Lo.extent());
    const index_t me = in.part_of(d + 2, coords);
    p.in_block.push_back({Li.offset(me), Li.size(me)});
    p.out_block.push_back({Lo.offset(me), Lo.size(me)});
    index_t lo = 0, hi = 0;
    for (index_t q = 0; q < Li.parts(); ++q) {
      const Range r = p.read_range(d, Lo.offset(q), Lo.offset(q) + Lo.size(q));
      if (r.len == 0) continue;
      lo = std::max(lo, Li.offset(q) - r.lo);
      hi = std::max(hi, r.hi() - (Li.offset(q) + Li.size(q)));
    }
    p.halo_lo.push_back(lo);
    p.halo_hi.push_back(hi);
    p.halo.lo[u + 2] = lo;
    p.halo.hi[u + 2] = hi;
    p.halo.modes[u + 2] = p.dims[u].mode;
    p.exchange = p.exchange || lo > 0 || hi > 0;
  }
  if (p.empty_output()) return p;
  // Boundary boxes: per dim the outputs reading below / above the block (prefix / suffix of the
  // range; taken as supersets so that correctness never depends on monotonicity), then an onion
  // decomposition of the union into disjoint boxes.
  std::vector<Range> box = p.out_block;
  for (int d = 0; d < S; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const Range ob = p.out_block[u], blk = p.in_block[u];
    index_t ia = ob.lo, ib = ob.hi();
    for (index_t o = ob.lo; o < ob.hi(); ++o) {
      const Range r = p.read_range(d, o, o + 1);
      if (r.len > 0 && r.lo < blk.lo) ia = o + 1;
    }
    for (index_t o = ob.hi() - 1; o >= ob.lo; --o) {
      const Range r = p.read_range(d, o, o + 1);
      if (r.len > 0 && r.hi() > blk.hi()) ib = o;
    }
    const index_t ic = std::max(ia, ib);
    auto add = [&](index_t lo, index_t hi) {
      if (hi <= lo) return;
      std::vector<Range> b = box;
      b[u] = {lo, hi - lo};
      for (const auto& r : b)
        if (r.len == 0) return;
      p.boundary_boxes.push_back(std::move(b));
    };
    add(ob.lo, ia);
    add(ic, ob.hi());
    box[u] = {ia, std::max<index_t>(0, ic - ia)};
  }
  return p;
}

}  // namespace shard::nn::functional::detail
