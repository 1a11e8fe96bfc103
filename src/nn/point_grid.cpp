// Schedule of the point-cloud <-> grid operators (include/shardtensor/nn/functional/point_grid.hpp):
// the halo plan (dist/halo.hpp HaloTransfer) extends a grid block by ghost cells or returns the
// ghost cells' sums to their owners; between the transfers run the local loops over this rank's
// points (host blocks; sums in double whatever the element type, so fp32 results do not depend
// on the order in which ranks add their contributions beyond the final rounding).
#include "shardtensor/nn/functional/point_grid.hpp"

#include <algorithm>
#include <cmath>

#include "shardtensor/exec/box.hpp"

namespace shard::nn::functional {

BoxPartition grid_partition(const DistSpec& grid, const GridDomain& domain) {
  std::vector<int> dims;
  for (int d = 2; d < grid.ndim(); ++d) dims.push_back(d);
  return BoxPartition::of_grid(grid, std::move(dims), domain.lo, domain.hi);
}

namespace detail {

HaloSpec point_grid_halo(const PointGridGeometry& g, Boundary mode) {
  std::vector<index_t> w(static_cast<std::size_t>(g.dims) + 2, 0);
  for (int d = 0; d < g.dims; ++d) w[static_cast<std::size_t>(d) + 2] = g.ghost[static_cast<std::size_t>(d)];
  return HaloSpec::symmetric(std::move(w), mode);
}

PointGridGeometry make_point_grid_geometry(const char* op, const DistSpec& grid, const GridDomain& domain) {
  const int R = grid.ndim();
  SHARD_CHECK(R == 4 || R == 5, op, "the grid must be [1, C, n...] with 2 or 3 spatial dims, got {}", grid);
  SHARD_CHECK(!grid.has_partial(), op, "the grid must not be Partial ({})", grid);
  const auto& gl = grid.global_shape();
  SHARD_CHECK(gl[0] == 1, op, "the grid's batch must be 1, got shape {}", gl);
  SHARD_CHECK(gl[1] >= 1, op, "the grid needs at least one channel, got shape {}", gl);
  SHARD_CHECK(grid.sharding_mesh_dims(0).empty() && grid.sharding_mesh_dims(1).empty(), op,
              "the grid's batch and channel dims must not be sharded ({})", grid);
  PointGridGeometry g;
  g.dims = R - 2;
  g.channels = gl[1];
  SHARD_CHECK(domain.lo.size() == static_cast<std::size_t>(g.dims) && domain.hi.size() == domain.lo.size(), op,
              "the domain has {} / {} bounds for a grid with {} spatial dims", domain.lo.size(), domain.hi.size(),
              g.dims);
  const Box& b = grid.local_box();
  for (int d = 0; d < g.dims; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const double lo = domain.lo[u], hi = domain.hi[u];
    SHARD_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi, op, "domain dim {}: [{}, {}] is not a finite box",
                d, lo, hi);
    SHARD_CHECK(gl[u + 2] >= 1, op, "the grid's spatial dim {} is empty ({})", d, gl);
    g.global[u] = gl[u + 2];
    g.offset[u] = b.lo[u + 2];
    g.len[u] = b.len[u + 2];
    g.lo[u] = lo;
    g.h[u] = (hi - lo) / static_cast<double>(gl[u + 2]);
  }
  (void)grid_partition(grid, domain);  // the spatial-decomposition checks of BoxPartition::of_grid
  return g;
}

void check_point_grid_sets(const char* op, const DistSpec& grid, const DistSpec& ps, const DistSpec* fs, index_t C) {
  check_point_set(ps, op, "points");
  const int D = grid.ndim() - 2;
  SHARD_CHECK(ps.global_shape()[1] == D, op, "points have {} coordinates but the grid {} has {} spatial dims",
              ps.global_shape()[1], grid.global_shape(), D);
  SHARD_CHECK(ps.mesh() == grid.mesh(), op, "the points and the grid live on different meshes: {}",
              mesh_mismatch(ps.mesh(), grid.mesh()));
  if (!fs) return;
  check_point_set(*fs, op, "features");
  SHARD_CHECK(fs->mesh() == ps.mesh(), op, "the features and the points live on different meshes: {}",
              mesh_mismatch(fs->mesh(), ps.mesh()));
  SHARD_CHECK(fs->global_shape()[1] == C, op, "features have {} channels but the grid {} has {}",
              fs->global_shape()[1], grid.global_shape(), C);
  SHARD_CHECK(point_counts(*fs) == point_counts(ps), op,
              "features and points must have the same rows on every rank: {} vs {}", point_counts(*fs),
              point_counts(ps));
}

void check_points_in_grid(const char* op, const DistSpec& grid, const GridDomain& domain, const DistSpec& ps,
                          const Block& points) {
  check_in_partition(ps, points, grid_partition(grid, domain), op);
}

namespace {

/// Element (c, i_0, ..., i_{D-1}) of a [1, C, E...] block as a linear offset.
struct CellIndexer {
  index_t sc = 0;
  std::array<index_t, 3> s{};
  explicit CellIndexer(const Block& b) {
    sc = b.strides[1];
    for (int d = 2; d < b.rank; ++d) s[static_cast<std::size_t>(d) - 2] = b.strides[static_cast<std::size_t>(d)];
  }
  index_t cell(const index_t* i, int D) const {
    index_t o = 0;
    for (int d = 0; d < D; ++d) o += i[d] * s[static_cast<std::size_t>(d)];
    return o;
  }
};

/// The 2^D corners of a point's interpolation stencil in an extended block with `ghost` cells.
struct Corners {
  int n = 0;
  std::array<index_t, 8> cell{};    ///< offsets (without the channel)
  std::array<double, 8> w{};        ///< multilinear weights
  std::array<std::array<double, 3>, 8> dw{};  ///< d w / d x_d
};

template <class T>
Corners corners_of(const PointGridGeometry& g, const CellIndexer& ix, const T* p) {
  const int D = g.dims;
  std::array<index_t, 3> e0{};
  std::array<double, 3> t{};
  std::array<bool, 3> clamped{};  // both corners are the edge cell: the value is flat along d
  for (int d = 0; d < D; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const double x = (static_cast<double>(p[d]) - g.lo[u]) / g.h[u] - 0.5;
    const double f = std::floor(x);
    index_t e = static_cast<index_t>(f) - (g.offset[u] - g.ghost[u]);
    double tt = x - f;
    // The partition check keeps e in [0, ext - 2]; guard against the last bit of rounding.
    if (e < 0) { e = 0; tt = 0; }
    if (e > g.ext(d) - 2) { e = g.ext(d) - 2; tt = 1; }
    e0[u] = e;
    t[u] = tt;
    const index_t i0 = e + g.offset[u] - g.ghost[u];  // global index of the lower corner
    clamped[u] = i0 < 0 || i0 + 1 > g.global[u] - 1;
  }
  Corners c;
  c.n = 1 << D;
  for (int k = 0; k < c.n; ++k) {
    index_t idx[3] = {0, 0, 0};
    double w = 1;
    std::array<double, 3> wd{1, 1, 1};  // product of the other dims' weights
    for (int d = 0; d < D; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const bool up = (k >> d) & 1;
      idx[d] = e0[u] + (up ? 1 : 0);
      const double wdim = up ? t[u] : 1 - t[u];
      for (int e = 0; e < D; ++e)
        if (e != d) wd[static_cast<std::size_t>(e)] *= wdim;
      w *= wdim;
    }
    c.cell[static_cast<std::size_t>(k)] = ix.cell(idx, D);
    c.w[static_cast<std::size_t>(k)] = w;
    for (int d = 0; d < D; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const bool up = (k >> d) & 1;
      c.dw[static_cast<std::size_t>(k)][u] = clamped[u] ? 0.0 : wd[u] * (up ? 1.0 : -1.0) / g.h[u];
    }
  }
  return c;
}

template <class T>
void interp_forward(const PointGridGeometry& g, const Block& ext, const Block& points, const Block& out) {
  const CellIndexer ix(ext);
  const T* v = static_cast<const T*>(ext.data);
  const T* p = static_cast<const T*>(points.data);
  T* y = static_cast<T*>(out.data);
  const index_t C = g.channels, D = g.dims;
  for (index_t i = 0; i < g.points; ++i) {
    const Corners k = corners_of<T>(g, ix, p + i * D);
    for (index_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int j = 0; j < k.n; ++j) acc += k.w[static_cast<std::size_t>(j)] * static_cast<double>(v[c * ix.sc + k.cell[static_cast<std::size_t>(j)]]);
      y[i * C + c] = static_cast<T>(acc);
    }
  }
}

template <class T>
void interp_grad_points(const PointGridGeometry& g, const Block& ext, const Block& points, const Block& gout,
                        const Block& gp) {
  const CellIndexer ix(ext);
  const T* v = static_cast<const T*>(ext.data);
  const T* p = static_cast<const T*>(points.data);
  const T* gy = static_cast<const T*>(gout.data);
  T* gx = static_cast<T*>(gp.data);
  const index_t C = g.channels, D = g.dims;
  for (index_t i = 0; i < g.points; ++i) {
    const Corners k = corners_of<T>(g, ix, p + i * D);
    std::array<double, 3> acc{};
    for (int j = 0; j < k.n; ++j) {
      double s = 0;  // sum_c gout[c] * v[c, corner]
      for (index_t c = 0; c < C; ++c)
        s += static_cast<double>(gy[i * C + c]) * static_cast<double>(v[c * ix.sc + k.cell[static_cast<std::size_t>(j)]]);
      for (index_t d = 0; d < D; ++d) acc[static_cast<std::size_t>(d)] += k.dw[static_cast<std::size_t>(j)][static_cast<std::size_t>(d)] * s;
    }
    for (index_t d = 0; d < D; ++d) gx[i * D + d] = static_cast<T>(acc[static_cast<std::size_t>(d)]);
  }
}

/// gext [1, C, E...] (f64, zeroed) += the weights times gout at every point's corners.
template <class T>
void interp_scatter(const PointGridGeometry& g, const Block& gext, const Block& points, const Block& gout) {
  const CellIndexer ix(gext);
  double* v = static_cast<double*>(gext.data);
  const T* p = static_cast<const T*>(points.data);
  const T* gy = static_cast<const T*>(gout.data);
  const index_t C = g.channels, D = g.dims;
  for (index_t i = 0; i < g.points; ++i) {
    const Corners k = corners_of<T>(g, ix, p + i * D);
    for (index_t c = 0; c < C; ++c)
      for (int j = 0; j < k.n; ++j)
        v[c * ix.sc + k.cell[static_cast<std::size_t>(j)]] += k.w[static_cast<std::size_t>(j)] * static_cast<double>(gy[i * C + c]);
  }
}

/// Calls fn(cell offset, weight, d w / d x) for every cell of the extended block (inside the
/// domain) within the radius of point p with a positive weight.
template <class T, class Fn>
void for_each_cell_near(const PointGridGeometry& g, const CellIndexer& ix, const T* p, Fn&& fn) {
  const int D = g.dims;
  const double r = g.radius, r2 = r * r;
  std::array<double, 3> x{};
  std::array<index_t, 3> a{}, b{};
  for (int d = 0; d < D; ++d) {
    const auto u = static_cast<std::size_t>(d);
    x[u] = static_cast<double>(p[d]);
    const double c = (x[u] - g.lo[u]) / g.h[u] - 0.5, rh = r / g.h[u];
    const index_t first = std::max<index_t>(0, g.offset[u] - g.ghost[u]);
    const index_t last = std::min<index_t>(g.global[u] - 1, g.offset[u] + g.len[u] - 1 + g.ghost[u]);
    a[u] = std::max<index_t>(first, static_cast<index_t>(std::ceil(c - rh)) - 1);
    b[u] = std::min<index_t>(last, static_cast<index_t>(std::floor(c + rh)) + 1);
    if (a[u] > b[u]) return;
  }
  std::array<index_t, 3> i = a;
  while (true) {
    double d2 = 0;
    std::array<double, 3> diff{};
    for (int d = 0; d < D; ++d) {
      const auto u = static_cast<std::size_t>(d);
      diff[u] = x[u] - (g.lo[u] + (static_cast<double>(i[u]) + 0.5) * g.h[u]);
      d2 += diff[u] * diff[u];
    }
    if (d2 <= r2) {
      double w = 1;
      std::array<double, 3> dw{};
      if (g.opts.weight == PointWeight::linear) {
        const double dist = std::sqrt(d2);
        w = 1 - dist / r;
        if (dist > 0)
          for (int d = 0; d < D; ++d) dw[static_cast<std::size_t>(d)] = -diff[static_cast<std::size_t>(d)] / (dist * r);
      }
      if (w > 0) {
        index_t e[3] = {0, 0, 0};
        for (int d = 0; d < D; ++d)
          e[d] = i[static_cast<std::size_t>(d)] - (g.offset[static_cast<std::size_t>(d)] - g.ghost[static_cast<std::size_t>(d)]);
        fn(ix.cell(e, D), w, dw);
      }
    }
    int d = D - 1;
    while (d >= 0 && i[static_cast<std::size_t>(d)] == b[static_cast<std::size_t>(d)]) {
      i[static_cast<std::size_t>(d)] = a[static_cast<std::size_t>(d)];
      --d;
    }
    if (d < 0) break;
    ++i[static_cast<std::size_t>(d)];
  }
}

template <class T>
void splat(const PointGridGeometry& g, const Block& ext, const Block& points, const Block& features, bool with_w) {
  const CellIndexer ix(ext);
  double* v = static_cast<double*>(ext.data);
  const T* p = static_cast<const T*>(points.data);
  const T* f = static_cast<const T*>(features.data);
  const index_t C = g.channels, D = g.dims;
  for (index_t i = 0; i < g.points; ++i) {
    const T* fi = f + i * C;
    for_each_cell_near<T>(g, ix, p + i * D, [&](index_t cell, double w, const std::array<double, 3>&) {
      for (index_t c = 0; c < C; ++c) v[c * ix.sc + cell] += w * static_cast<double>(fi[c]);
      if (with_w) v[C * ix.sc + cell] += w;
    });
  }
}

template <class T>
void splat_backward(const PointGridGeometry& g, const Block& ext, const Block& points, const Block& features,
                    bool with_w, const Block* gf, const Block* gp) {
  const CellIndexer ix(ext);
  const double* v = static_cast<const double*>(ext.data);
  const T* p = static_cast<const T*>(points.data);
  const T* f = static_cast<const T*>(features.data);
  const index_t C = g.channels, D = g.dims;
  const bool linear = g.opts.weight == PointWeight::linear;
  std::vector<double> accf(static_cast<std::size_t>(C));
  for (index_t i = 0; i < g.points; ++i) {
    const T* fi = f + i * C;
    std::fill(accf.begin(), accf.end(), 0.0);
    std::array<double, 3> accp{};
    for_each_cell_near<T>(g, ix, p + i * D, [&](index_t cell, double w, const std::array<double, 3>& dw) {
      if (gf)
        for (index_t c = 0; c < C; ++c) accf[static_cast<std::size_t>(c)] += w * v[c * ix.sc + cell];
      if (gp && linear) {
        double s = with_w ? v[C * ix.sc + cell] : 0.0;
        for (index_t c = 0; c < C; ++c) s += static_cast<double>(fi[c]) * v[c * ix.sc + cell];
        for (index_t d = 0; d < D; ++d) accp[static_cast<std::size_t>(d)] += dw[static_cast<std::size_t>(d)] * s;
      }
    });
    if (gf)
      for (index_t c = 0; c < C; ++c) static_cast<T*>(gf->data)[i * C + c] = static_cast<T>(accf[static_cast<std::size_t>(c)]);
    if (gp)
      for (index_t d = 0; d < D; ++d) static_cast<T*>(gp->data)[i * D + d] = static_cast<T>(accp[static_cast<std::size_t>(d)]);
  }
}

/// The grid spec with `channels` channels (same mesh, placements and spatial layouts).
DistSpec with_channels(const DistSpec& grid, index_t channels) {
  auto gl = grid.global_shape();
  gl[1] = channels;
  return DistSpec(grid.mesh(), grid.placements(), gl, grid.sizes());
}

std::vector<index_t> block_shape(const PointGridGeometry& g, index_t channels, bool extended) {
  std::vector<index_t> s{1, channels};
  for (int d = 0; d < g.dims; ++d) s.push_back(extended ? g.ext(d) : g.len[static_cast<std::size_t>(d)]);
  return s;
}

void check_host(const char* op, const Block& b) {
  SHARD_CHECK(b.device.is_cpu(), op, "point <-> grid ops run on the CPU only (block on {})", b.device);
}

/// dst[k] = src[k] for the first n elements of two contiguous host buffers (f32 <-> f64).
template <class D, class S>
void convert(void* dst, const void* src, index_t n) {
  for (index_t k = 0; k < n; ++k) static_cast<D*>(dst)[k] = static_cast<D>(static_cast<const S*>(src)[k]);
}

template <class Fn>
void dispatch(const char* op, DType dt, Fn&& fn) {
  if (dt == DType::f32) fn(float{});
  else if (dt == DType::f64) fn(double{});
  else SHARD_FAIL(op, "f32 or f64 only, got {}", dt);
}

}  // namespace

Block grid_to_points_forward(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& grid,
                             const Block& points, const Block& out, ExecContext& ctx) {
  (void)ctx;
  check_host("grid_to_points", grid);
  HaloTransfer h(grid.dtype, grid_spec, point_grid_halo(g, Boundary::replicate), HaloTransfer::Direction::forward,
                 grid);
  const Block ext = h.finish();
  dispatch("grid_to_points", grid.dtype, [&](auto t) { interp_forward<decltype(t)>(g, ext, points, out); });
  return ext;
}

Block grid_to_points_grad_grid(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& points,
                               const Block& gout, ExecContext& ctx) {
  const DType dt = gout.dtype;
  Block gext = Block::allocate(DType::f64, Device::cpu(), block_shape(g, g.channels, true));
  exec::box_zero(gext, ctx);
  dispatch("grid_to_points", dt, [&](auto t) { interp_scatter<decltype(t)>(g, gext, points, gout); });
  HaloTransfer h(DType::f64, grid_spec, point_grid_halo(g, Boundary::replicate), HaloTransfer::Direction::adjoint,
                 gext, /*consume_input=*/true);
  const Block gd = h.finish();
  Block res = Block::allocate(dt, Device::cpu(), block_shape(g, g.channels, false));
  dispatch("grid_to_points", dt, [&](auto t) { convert<decltype(t), double>(res.data, gd.data, res.numel()); });
  return res;
}

void grid_to_points_grad_points(const PointGridGeometry& g, const Block& grid_ext, const Block& points,
                                const Block& gout, const Block& gpoints, ExecContext&) {
  dispatch("grid_to_points", gout.dtype,
           [&](auto t) { interp_grad_points<decltype(t)>(g, grid_ext, points, gout, gpoints); });
}

Block points_to_grid_forward(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& points,
                             const Block& features, const Block& out, ExecContext& ctx) {
  check_host("points_to_grid", points);
  const bool mean = g.opts.reduce == PointReduce::mean;
  const index_t C = g.channels, Cp = C + (mean ? 1 : 0);
  Block ext = Block::allocate(DType::f64, Device::cpu(), block_shape(g, Cp, true));
  exec::box_zero(ext, ctx);
  dispatch("points_to_grid", points.dtype, [&](auto t) { splat<decltype(t)>(g, ext, points, features, mean); });
  HaloTransfer h(DType::f64, with_channels(grid_spec, Cp), point_grid_halo(g, Boundary::zero),
                 HaloTransfer::Direction::adjoint, ext, /*consume_input=*/true);
  const Block sums = h.finish();  // [1, Cp, len...] contiguous f64
  const DType dt = points.dtype;
  if (!mean) {
    dispatch("points_to_grid", dt, [&](auto t) { convert<decltype(t), double>(out.data, sums.data, out.numel()); });
    return Block{};
  }
  const index_t cells = sums.numel() / Cp;
  double* s = static_cast<double*>(sums.data);
  for (index_t k = 0; k < cells; ++k) {
    const double wsum = s[C * cells + k];
    for (index_t c = 0; c < C; ++c) s[c * cells + k] = wsum > 0 ? s[c * cells + k] / wsum : 0.0;
  }
  // out = the quotients (channels 0..C-1 of `sums`, which keeps them in double with the weight
  // sums for backward)
  dispatch("points_to_grid", dt, [&](auto t) { convert<decltype(t), double>(out.data, sums.data, out.numel()); });
  return sums;
}

void points_to_grid_backward(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& points,
                             const Block& features, const Block& out, const Block& wsum, const Block& gout,
                             const Block* gfeatures, const Block* gpoints, ExecContext& ctx) {
  (void)out;
  (void)ctx;
  const bool mean = g.opts.reduce == PointReduce::mean;
  const bool with_w = mean && gpoints && g.opts.weight == PointWeight::linear;
  const index_t C = g.channels, Cp = C + (with_w ? 1 : 0);
  // The cells' gradients in double: d/dN (= G, or G / S for mean) and d/dS (-<G, N / S> / S).
  Block cellg = Block::allocate(DType::f64, Device::cpu(), block_shape(g, Cp, false));
  dispatch("points_to_grid", gout.dtype,
           [&](auto t) { convert<double, decltype(t)>(cellg.data, gout.data, gout.numel()); });
  const index_t cells = cellg.numel() / Cp;
  if (mean) {
    double* v = static_cast<double*>(cellg.data);
    const double* q = static_cast<const double*>(wsum.data);  // [1, C + 1, len...]: quotients, weight sums
    for (index_t k = 0; k < cells; ++k) {
      const double S = q[C * cells + k];
      double gs = 0;
      for (index_t c = 0; c < C; ++c) {
        const double gc = v[c * cells + k];
        gs -= gc * q[c * cells + k];
        v[c * cells + k] = S > 0 ? gc / S : 0.0;
      }
      if (with_w) v[C * cells + k] = S > 0 ? gs / S : 0.0;
    }
  }
  HaloTransfer h(DType::f64, with_channels(grid_spec, Cp), point_grid_halo(g, Boundary::zero),
                 HaloTransfer::Direction::forward, cellg);
  const Block ext = h.finish();
  dispatch("points_to_grid", points.dtype,
           [&](auto t) { splat_backward<decltype(t)>(g, ext, points, features, with_w, gfeatures, gpoints); });
}

}  // namespace detail
}  // namespace shard::nn::functional
