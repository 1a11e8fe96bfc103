#pragma once
/// \file point_grid.hpp
/// Differentiable point-cloud <-> grid operators (issue 17 step 5; DoMINO's geometry encoding).
///
/// **Grids.** A grid is a `Var<T, 2 + D>` of shape [1, C, n_0, ..., n_{D-1}] (batch 1, D = 2 or
/// 3 spatial dims) over the box domain [lo, hi] (`GridDomain`): cell i of spatial dim d has
/// width h_d = (hi_d - lo_d) / n_d and centre lo_d + (i + 1/2) h_d. Its spatial dims may be
/// sharded (uneven and empty shards included; each by at most one mesh dim of size > 1, and every
/// mesh dim of size > 1 shards one of them: a spatial decomposition); batch and C are not.
///
/// **Points.** Point sets are `Var<T, 2>` [Np, D] laid out by `point_placements(mesh)` (ragged,
/// empty shards allowed; dist/points.hpp) on the grid's mesh, and every rank's points lie in its
/// grid shard's box, `grid_partition(grid spec, domain)` = `BoxPartition::of_grid(grid, {2, ...,
/// D + 1}, lo, hi)` (checked collectively: an error on every rank otherwise; route a point set
/// there with `F::partition_by_box(points, grid_partition(...))`, nn/functional/neighbors.hpp,
/// and its features with the routing's `apply`). Features are [Np, C] with the points' rows.
///
///  - `grid_to_points(grid, points, domain)` -> [Np, C] (rows laid out like points): multilinear
///    interpolation of the cell-centred values. Continuous index u = (p - lo) / h - 1/2,
///    i0 = floor(u), t = u - i0; corners i0 and i0 + 1 clamped into [0, n - 1] (edge value
///    replicated). A 1-cell halo (Boundary::replicate, which is the clamp) serves the corners
///    beyond the shard. Gradients: grid = the weights scattered into the extended block, then the
///    halo adjoint; points = the derivative of the weights (0 along a clamped dim, where both
///    corners are the same cell; at integer u the one-sided derivative of floor, towards +).
///  - `points_to_grid<R>(points, features, grid_spec, domain, radius, opts)` -> grid [1, C, n...]
///    laid out by `grid_spec`: cell value = aggregate over points p with |p - centre| <= radius
///    of w(|p - centre|) f_p, w = 1 (PointWeight::none) or max(0, 1 - d / radius) (linear);
///    PointReduce::mean divides by the sum of the weights (0 where it is 0). Each rank scatters
///    its points into its block extended by min(n_d, ceil(radius / h_d)) ghost cells per side
///    (cells beyond the domain are skipped), then the halo ADJOINT (Boundary::zero) adds the ghost
///    cells' sums to their owners (the weight sum of mean travels as channel C + 1 of the same
///    exchange). Gradients: features = the halo exchange of the cell gradient then the weighted
///    gather (the exact adjoint); points = the derivative of the linear weight (none: 0) and, for
///    mean, the quotient rule (cell gradients G / S and -<G, out> / S through the same exchange).
///
/// Any device (CPU or CUDA blocks; the grid, points and features on one device): the per-entry
/// maths runs in the points family (exec/points.hpp) on that device, the halo exchanges on device
/// blocks, and nothing but the partition check's per-rank counts reaches the host. All checks
/// depend on specs alone, except the partition check (owners computed on the points' device),
/// which is the op's first collective, so a bad input throws on every rank.
///
/// Recipe (docs/architecture.md): checks, spec algebra and tape nodes here; the schedule (halo
/// transfers + the local loops) in src/nn/point_grid.cpp; communication through the halo plan
/// (dist/halo.hpp `HaloTransfer`).
#include <array>
#include <cmath>
#include <memory>
#include <vector>

#include "shardtensor/dist/halo.hpp"
#include "shardtensor/dist/points.hpp"
#include "shardtensor/nn/functional/common.hpp"

namespace shard::nn::functional {

/// The box [lo, hi] a grid covers (one entry per spatial dim, lo < hi, finite).
struct GridDomain {
  std::vector<double> lo, hi;
};

/// How points_to_grid combines the points near a cell.
enum class PointReduce : unsigned char { sum, mean };
/// The weight of a point at distance d from a cell centre: 1, or max(0, 1 - d / radius).
enum class PointWeight : unsigned char { none, linear };

/// Options of points_to_grid.
struct PointGridOptions {
  PointReduce reduce = PointReduce::sum;
  PointWeight weight = PointWeight::none;
};

namespace detail {

/// This rank's part of a point <-> grid op: the grid's global extents, this rank's block of it
/// (offset, length), the ghost cells per side of the extended block, the domain, the points.
struct PointGridGeometry {
  int dims = 0;          ///< D (2 or 3)
  index_t channels = 0;  ///< C
  index_t points = 0;    ///< local point rows
  std::array<index_t, 3> global{}, offset{}, len{}, ghost{};
  std::array<double, 3> lo{}, h{};
  double radius = 0;  ///< points_to_grid only
  PointGridOptions opts{};
  /// The extended block's extent along spatial dim d.
  index_t ext(int d) const { return len[static_cast<std::size_t>(d)] + 2 * ghost[static_cast<std::size_t>(d)]; }
};

/// The halo of the extended block: `ghost` cells on both sides of every spatial dim.
HaloSpec point_grid_halo(const PointGridGeometry& g, Boundary mode);

/// Checks of a grid spec (rank 2 + D, batch 1, C and batch unsharded, no Partial, a spatial
/// decomposition) and a domain; the same outcome on every rank. Returns the geometry without
/// ghost widths or point count.
PointGridGeometry make_point_grid_geometry(const char* op, const DistSpec& grid, const GridDomain& domain);

/// Checks that `ps` is a [Np, D] point set on the grid's mesh (and `fs`, when given, a [Np, C]
/// feature set with the same rows); spec-only.
void check_point_grid_sets(const char* op, const DistSpec& grid, const DistSpec& ps, const DistSpec* fs, index_t C);

/// The collective partition check (every rank's points in its grid box); the first collective.
void check_points_in_grid(const char* op, const DistSpec& grid, const GridDomain& domain, const DistSpec& ps,
                          const Block& points);

/// grid_to_points forward: extends `grid` (this rank's block, any strides) by the 1-cell
/// replicate halo and interpolates at `points` [n, D] into `out` [n, C] (both contiguous).
/// Returns the extended block (kept for the points' gradient). Collective.
Block grid_to_points_forward(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& grid,
                             const Block& points, const Block& out, ExecContext& ctx);
/// The grid's gradient (this rank's block, contiguous) from the values' gradient `gout` [n, C]:
/// local scatter into the extended block, then the halo adjoint. Collective.
Block grid_to_points_grad_grid(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& points,
                               const Block& gout, ExecContext& ctx);
/// The points' gradient [n, D] (contiguous, written) from `gout` and the extended grid. Local.
void grid_to_points_grad_points(const PointGridGeometry& g, const Block& grid_ext, const Block& points,
                                const Block& gout, const Block& gpoints, ExecContext& ctx);

/// points_to_grid forward: `out` [1, C, len...] contiguous. Returns, for mean, the weight sums
/// [len...] (kept for backward; else an empty Block). Collective.
Block points_to_grid_forward(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& points,
                             const Block& features, const Block& out, ExecContext& ctx);
/// points_to_grid backward from the grid gradient `gout` [1, C, len...] (contiguous): writes
/// `*gfeatures` [n, C] and `*gpoints` [n, D] when they are not null. `out` and `wsum` are
/// the forward's result and weight sums (mean). Collective (one halo exchange).
void points_to_grid_backward(const PointGridGeometry& g, const DistSpec& grid_spec, const Block& points,
                             const Block& features, const Block& out, const Block& wsum, const Block& gout,
                             const Block* gfeatures, const Block* gpoints, ExecContext& ctx);

}  // namespace detail

/// The box partition a point set must lie in to meet the grid `grid` (a [1, C, n...] spec) on
/// `domain`: `BoxPartition::of_grid(grid, {2, ..., D + 1}, lo, hi)`.
BoxPartition grid_partition(const DistSpec& grid, const GridDomain& domain);

/// Multilinear interpolation of the cell-centred `grid` [1, C, n...] at `points` [Np, D] (see
/// the file comment): [Np, C], rows laid out like the points. Collective over the mesh.
template <class T, int R>
Var<T, 2> grid_to_points(const Var<T, R>& grid, const Var<T, 2>& points, const GridDomain& domain) {
  static_assert((R == 4 || R == 5) && is_compute_type<T>, "grid_to_points: 2 or 3 spatial dims, float or double");
  const char* op = "grid_to_points";
  // A Partial grid is refused rather than resolved: Partial on a mesh dim of size > 1 leaves that
  // dim sharding no grid dim, which is not a spatial decomposition.
  detail::check_no_partial(grid.value().spec(), op, "the grid");
  detail::check_no_partial(points.value().spec(), op, "points");
  const DistSpec gs = grid.value().spec();
  const DistSpec ps = points.value().spec();
  auto geo = detail::make_point_grid_geometry(op, gs, domain);
  const index_t C = geo.channels;
  detail::check_point_grid_sets(op, gs, ps, nullptr, C);
  const Device dev = grid.value().device();
  SHARD_CHECK(points.value().device() == dev, op, "the grid and the points must be on one device (grid on {}, points on {})",
              dev, points.value().device());
  const Tensor<T, 2> pl = points.local().contiguous();
  detail::check_points_in_grid(op, gs, domain, ps, as_block(pl));
  geo.points = pl.size(0);
  geo.ghost = {1, 1, 1};
  const DistSpec os = point_rows_spec(ps, {C});
  auto y = Tensor<T, 2>::empty({geo.points, C}, dev);
  ExecContext& ctx = current_context(dev);
  auto ext = std::make_shared<Block>(
      detail::grid_to_points_forward(geo, gs, as_block(grid.local()), as_block(pl), as_block(y), ctx));
  return Var<T, 2>::make(
      DistTensor<T, 2>(os, y), op, {grid.ref(), points.ref()},
      [grid, points, gs, os, geo, pl, ext, dev](const DistTensor<T, 2>& g) {
        const Tensor<T, 2> gy = autograd::gradient_as(os, g, autograd::PartialGrad::resolve).local().contiguous();
        ExecContext& c = current_context(dev);
        if (points.requires_grad()) {
          auto gp = Tensor<T, 2>::empty({geo.points, static_cast<index_t>(geo.dims)}, dev);
          detail::grid_to_points_grad_points(geo, *ext, as_block(pl), as_block(gy), as_block(gp), c);
          points.accumulate_grad(DistTensor<T, 2>(points.value().spec(), gp));
        }
        if (grid.requires_grad()) {
          const Block gb = detail::grid_to_points_grad_grid(geo, gs, as_block(pl), as_block(gy), c);
          grid.accumulate_grad(DistTensor<T, R>(gs, tensor_of<T, R>(gb)));
        }
      });
}

/// Aggregation of point `features` [Np, C] at `points` [Np, D] onto the cells of a grid laid out
/// by `grid` (a [1, C, n...] spec of rank R) on `domain` (see the file comment): the grid Var.
/// Collective over the mesh. Errors on every rank: radius < 0, NaN or infinite (linear weight:
/// radius > 0), C != features' width, points outside their grid boxes, mismatched meshes.
template <int R, class T>
Var<T, R> points_to_grid(const Var<T, 2>& points, const Var<T, 2>& features, const DistSpec& grid,
                         const GridDomain& domain, double radius, const PointGridOptions& opts = {}) {
  static_assert((R == 4 || R == 5) && is_compute_type<T>, "points_to_grid: 2 or 3 spatial dims, float or double");
  const char* op = "points_to_grid";
  SHARD_CHECK(grid.ndim() == R, op, "the grid spec {} has rank {}, but points_to_grid<{}> makes rank {}", grid,
              grid.ndim(), R, R);
  auto geo = detail::make_point_grid_geometry(op, grid, domain);
  const DistSpec ps = points.value().spec(), fs = features.value().spec();
  detail::check_no_partial(ps, op, "points");
  detail::check_no_partial(fs, op, "features");
  detail::check_point_grid_sets(op, grid, ps, &fs, geo.channels);
  SHARD_CHECK(std::isfinite(radius) && radius >= 0, op, "radius must be finite and >= 0, got {}", radius);
  SHARD_CHECK(opts.weight != PointWeight::linear || radius > 0, op, "the linear weight needs radius > 0, got {}",
              radius);
  const Device dev = points.value().device();
  SHARD_CHECK(features.value().device() == dev, op,
              "the points and the features must be on one device (points on {}, features on {})", dev,
              features.value().device());
  const Tensor<T, 2> pl = points.local().contiguous();
  const Tensor<T, 2> fl = features.local().contiguous();
  detail::check_points_in_grid(op, grid, domain, ps, as_block(pl));
  geo.points = pl.size(0);
  geo.radius = radius;
  geo.opts = opts;
  for (int d = 0; d < geo.dims; ++d) {
    const auto u = static_cast<std::size_t>(d);
    const double w = std::ceil(radius / geo.h[u]);  // centres within radius of the box: floor(r/h + 1/2) <= ceil(r/h)
    geo.ghost[u] = static_cast<index_t>(std::min(w, static_cast<double>(geo.global[u])));
  }
  const Box b = grid.local_box();
  auto y = Tensor<T, R>::empty(DistTensor<T, R>::from_vec(b.len), dev);
  ExecContext& ctx = current_context(dev);
  auto wsum = std::make_shared<Block>(
      detail::points_to_grid_forward(geo, grid, as_block(pl), as_block(fl), as_block(y), ctx));
  return Var<T, R>::make(
      DistTensor<T, R>(grid, y), op, {points.ref(), features.ref()},
      [points, features, grid, geo, pl, fl, y, wsum, dev](const DistTensor<T, R>& g) {
        const Tensor<T, R> gy = autograd::gradient_as(grid, g, autograd::PartialGrad::resolve).local().contiguous();
        ExecContext& c = current_context(dev);
        const bool want_p = points.requires_grad(), want_f = features.requires_grad();
        auto gp = Tensor<T, 2>::empty({want_p ? geo.points : 0, static_cast<index_t>(geo.dims)}, dev);
        auto gf = Tensor<T, 2>::empty({want_f ? geo.points : 0, geo.channels}, dev);
        const Block bp = as_block(gp), bf = as_block(gf);
        detail::points_to_grid_backward(geo, grid, as_block(pl), as_block(fl), as_block(y), *wsum, as_block(gy),
                                        want_f ? &bf : nullptr, want_p ? &bp : nullptr, c);
        if (want_p) points.accumulate_grad(DistTensor<T, 2>(points.value().spec(), gp));
        if (want_f) features.accumulate_grad(DistTensor<T, 2>(features.value().spec(), gf));
      });
}

}  // namespace shard::nn::functional
