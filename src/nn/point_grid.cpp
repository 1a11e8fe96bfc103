// Schedule of the point-cloud <-> grid operators (include/shardtensor/nn/functional/point_grid.hpp):
// the halo plan (dist/halo.hpp HaloTransfer) extends a grid block by ghost cells or returns the
// ghost cells' sums to their owners; between the transfers run the points family's kernels
// (exec/points.hpp) over this rank's points on ctx's device (sums in double whatever the element
// type, so fp32 results do not depend on the order in which ranks add their contributions beyond
// the final rounding).
#include "shardtensor/nn/functional/point_grid.hpp"

#include <algorithm>
#include <cmath>

#include "shardtensor/exec/box.hpp"
#include "shardtensor/exec/pointwise.hpp"
#include "shardtensor/exec/points.hpp"

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

/// The points family's geometry of g.
exec::PointGridGeometry exec_geometry(const PointGridGeometry& g) {
  exec::PointGridGeometry e;
  e.dims = g.dims;
  e.channels = g.channels;
  e.points = g.points;
  e.global = g.global;
  e.offset = g.offset;
  e.len = g.len;
  e.ghost = g.ghost;
  e.lo = g.lo;
  e.h = g.h;
  e.radius = g.radius;
  e.linear_weight = g.opts.weight == PointWeight::linear;
  return e;
}

/// The first `channels` channels of a contiguous [1, C', len...] block, as a contiguous view.
Block leading_channels(const Block& b, index_t channels) {
  std::vector<index_t> shape = b.shape_vec();
  shape[1] = channels;
  return Block::view(b.dtype, b.device, b.data, shape.data(), static_cast<int>(shape.size()), nullptr, b.owner);
}

void check_on(const char* op, const Block& b, const ExecContext& ctx, const char* what) {
  SHARD_CHECK(b.device == ctx.device(), op, "{} on {} but the execution context on {}", what, b.device, ctx.device());
}

}  // namespace

Block grid_to_points_forward(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& grid,
                             const Block& points, const Block& out, ExecContext& ctx) {
  check_on("grid_to_points", grid, ctx, "the grid");
  HaloTransfer h(grid.dtype, grid_spec, point_grid_halo(g, Boundary::replicate), HaloTransfer::Direction::forward,
                 grid);
  const Block ext = h.finish();
  exec::points_grid_interp(exec_geometry(g), ext, points, out, ctx);
  return ext;
}

Block grid_to_points_grad_grid(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& points,
                               const Block& gout, ExecContext& ctx) {
  const DType dt = gout.dtype;
  Block gext = Block::allocate(DType::f64, ctx.device(), block_shape(g, g.channels, true));
  exec::box_zero(gext, ctx);
  exec::points_grid_interp_scatter(exec_geometry(g), points, gout, gext, ctx);
  HaloTransfer h(DType::f64, grid_spec, point_grid_halo(g, Boundary::replicate), HaloTransfer::Direction::adjoint,
                 gext, /*consume_input=*/true);
  const Block gd = h.finish();
  Block res = Block::allocate(dt, ctx.device(), block_shape(g, g.channels, false));
  exec::convert(gd, res, ctx);
  return res;
}

void grid_to_points_grad_points(const PointGridGeometry& g, const Block& grid_ext, const Block& points,
                                const Block& gout, const Block& gpoints, ExecContext& ctx) {
  exec::points_grid_interp_grad_points(exec_geometry(g), grid_ext, points, gout, gpoints, ctx);
}

Block points_to_grid_forward(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& points,
                             const Block& features, const Block& out, ExecContext& ctx) {
  check_on("points_to_grid", points, ctx, "the points");
  const bool mean = g.opts.reduce == PointReduce::mean;
  const index_t C = g.channels, Cp = C + (mean ? 1 : 0);
  Block ext = Block::allocate(DType::f64, ctx.device(), block_shape(g, Cp, true));
  exec::box_zero(ext, ctx);
  exec::points_grid_splat(exec_geometry(g), points, features, mean, ext, ctx);
  HaloTransfer h(DType::f64, with_channels(grid_spec, Cp), point_grid_halo(g, Boundary::zero),
                 HaloTransfer::Direction::adjoint, ext, /*consume_input=*/true);
  const Block sums = h.finish();  // [1, Cp, len...] contiguous f64
  if (!mean) {
    exec::convert(sums, out, ctx);
    return Block{};
  }
  // the quotients in channels 0..C-1 of `sums`, which keeps them in double with the weight sums
  // for backward
  exec::points_grid_mean(C, sums.numel() / Cp, sums, ctx);
  exec::convert(leading_channels(sums, C), out, ctx);
  return sums;
}

void points_to_grid_backward(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& points,
                             const Block& features, const Block& out, const Block& wsum, const Block& gout,
                             const Block* gfeatures, const Block* gpoints, ExecContext& ctx) {
  (void)out;
  const bool mean = g.opts.reduce == PointReduce::mean;
  const bool with_w = mean && gpoints && g.opts.weight == PointWeight::linear;
  const index_t C = g.channels, Cp = C + (with_w ? 1 : 0);
  // The cells' gradients in double: d/dN (= G, or G / S for mean) and d/dS (-<G, N / S> / S).
  Block cellg = Block::allocate(DType::f64, ctx.device(), block_shape(g, Cp, false));
  exec::convert(gout, leading_channels(cellg, C), ctx);
  if (mean) exec::points_grid_mean_backward(C, cellg.numel() / Cp, wsum, with_w, cellg, ctx);
  HaloTransfer h(DType::f64, with_channels(grid_spec, Cp), point_grid_halo(g, Boundary::zero),
                 HaloTransfer::Direction::forward, cellg);
  const Block ext = h.finish();
  exec::points_grid_splat_backward(exec_geometry(g), ext, points, features, with_w, gfeatures, gpoints, ctx);
}

}  // namespace detail
}  // namespace shard::nn::functional
