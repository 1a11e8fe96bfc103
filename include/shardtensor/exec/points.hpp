#pragma once
/// \file points.hpp
/// Point-cloud kernel family front (issue 31): the per-entry maths of the point-cloud ops on
/// neighbour lists (nn/functional/neighbors.hpp) and the point <-> grid kernels
/// (nn/functional/point_grid.hpp), forward and backward, on Blocks of ctx.device() (CPU:
/// src/exec/points_cpu.cpp; CUDA: src/cuda/points_cuda.cpp + kernels/points.cu). The schedules
/// (src/nn/neighbors.cpp, src/nn/point_grid.cpp) run the communication and call these.
///
/// Every block is contiguous and row-major; values f32 or f64 (one dtype per call), indices and
/// counts i64. Sums are accumulated in double whatever the element type (the CPU table in index
/// order, the CUDA table per output element in the same order, or with double atomics for the
/// scatters, whose last bits may vary between runs on a GPU).
///
/// **Neighbour lists** (`PointListGeometry`): n rows of k entries; `width` is D (coordinates) or
/// C (channels). Entry (i, j) is valid when indices[i, j] >= 0 (offsets) or j < counts[i]
/// (weights, aggregate; counts are checked in [0, k] by the CPU table, clamped by the CUDA table).
///
/// **Point <-> grid** (`PointGridGeometry`): a rank's block of a cell-centred grid [1, C, len...]
/// (D = 2 or 3 spatial dims) extended by `ghost` cells per side ([1, C, ext...],
/// ext = len + 2 ghost); cell i of dim d has centre lo + (i + 1/2) h. The extended blocks of the
/// scatters are f64 (sums in double); the interpolated grid is of the points' dtype and may have
/// any strides.
#include <array>
#include <vector>

#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

// ------------------------------------------------------------------------------ neighbour lists

/// n rows of k entries of `width` elements (D or C; 1 where unused).
struct PointListGeometry {
  index_t n = 0;
  index_t k = 0;
  index_t width = 1;
};

/// The weight of a neighbour at distance d: 1 / (d + param), exp(-d^2 / (2 param^2)) or
/// max(0, 1 - d / param) (param > 0).
struct PointWeightFn {
  enum class Kind : unsigned char { inverse_distance, gaussian, linear };
  Kind kind = Kind::inverse_distance;
  double param = 1e-8;  ///< eps, sigma or radius
  /// 1 / (d + eps), eps > 0.
  static PointWeightFn inverse_distance(double eps = 1e-8) { return {Kind::inverse_distance, eps}; }
  /// exp(-d^2 / (2 sigma^2)), sigma > 0.
  static PointWeightFn gaussian(double sigma) { return {Kind::gaussian, sigma}; }
  /// max(0, 1 - d / radius), radius > 0 (gradient 0 from d >= radius on).
  static PointWeightFn linear(double radius) { return {Kind::linear, radius}; }
};

/// The reduction of points_aggregate over the valid entries of a row.
enum class PointAggregate : unsigned char { sum, mean, max };

/// out [n, k, D] = indices >= 0 ? gathered - query[i] : 0 (gathered [n, k, D], query [n, D]).
void points_offsets_forward(const PointListGeometry& g, const Block& gathered, const Block& query,
                            const Block& indices, const Block& out, ExecContext& ctx);
/// g_gathered [n, k, D] = valid ? grad : 0; g_query [n, D] = -sum over valid j of grad (either
/// may be null).
void points_offsets_backward(const PointListGeometry& g, const Block& grad, const Block& indices,
                             const Block* g_gathered, const Block* g_query, ExecContext& ctx);
/// out [n, k] = |offsets[i, j, :]| (offsets [n, k, D]).
void points_norm_forward(const PointListGeometry& g, const Block& offsets, const Block& out, ExecContext& ctx);
/// g_offsets [n, k, D] = grad * offsets / dist (0 where dist == 0).
void points_norm_backward(const PointListGeometry& g, const Block& offsets, const Block& dist, const Block& grad,
                          const Block& g_offsets, ExecContext& ctx);
/// out [n, k] = f(dist) for j < counts[i], else 0 (counts [n]).
void points_weights_forward(const PointListGeometry& g, const PointWeightFn& f, const Block& dist,
                            const Block& counts, const Block& out, ExecContext& ctx);
/// g_dist [n, k] = grad f'(dist) for j < counts[i], else 0.
void points_weights_backward(const PointListGeometry& g, const PointWeightFn& f, const Block& dist,
                             const Block& counts, const Block& grad, const Block& g_dist, ExecContext& ctx);
/// out [n, C] = the reduction over j < counts[i] of w[i, j] values[i, j, :] (values [n, k, C],
/// weights [n, k] or null for 1): sum, mean (0 for an empty row), or max (argmax [n, C] i64 = the
/// first maximising j, -1 for an empty row; argmax is only written for max and may be empty
/// otherwise).
void points_aggregate_forward(const PointListGeometry& g, PointAggregate reduce, const Block& values,
                              const Block* weights, const Block& counts, const Block& out, const Block& argmax,
                              ExecContext& ctx);
/// g_values [n, k, C] and g_weights [n, k] (each may be null; written whole) from grad [n, C].
void points_aggregate_backward(const PointListGeometry& g, PointAggregate reduce, const Block& values,
                               const Block* weights, const Block& counts, const Block& argmax, const Block& grad,
                               const Block* g_values, const Block* g_weights, ExecContext& ctx);

// ------------------------------------------------------------------------------ point <-> grid

/// A rank's part of a point <-> grid op (see the file comment).
struct PointGridGeometry {
  int dims = 0;          ///< D (2 or 3)
  index_t channels = 0;  ///< C
  index_t points = 0;    ///< local point rows
  std::array<index_t, 3> global{}, offset{}, len{}, ghost{};
  std::array<double, 3> lo{}, h{};
  double radius = 0;            ///< points_grid_splat only
  bool linear_weight = false;   ///< splat: w = max(0, 1 - d / radius) (else 1)
  /// The extended block's extent along spatial dim d.
  index_t ext(int d) const { return len[static_cast<std::size_t>(d)] + 2 * ghost[static_cast<std::size_t>(d)]; }
};

/// Multilinear interpolation: out [points, C] at points [points, D] of the extended grid `ext`
/// [1, C, ext...] (the points' dtype, any strides): continuous index u = (p - lo) / h - 1/2,
/// corners floor(u) and floor(u) + 1 (clamped to the extended block).
void points_grid_interp(const PointGridGeometry& g, const Block& ext, const Block& points, const Block& out,
                        ExecContext& ctx);
/// The points' gradient gpoints [points, D] of the interpolation from grad [points, C] (0 along a
/// dim where both corners are the same global edge cell).
void points_grid_interp_grad_points(const PointGridGeometry& g, const Block& ext, const Block& points,
                                    const Block& grad, const Block& gpoints, ExecContext& ctx);
/// The grid's gradient: gext [1, C, ext...] (f64, contiguous) += the interpolation weights times
/// grad [points, C] at every point's corners.
void points_grid_interp_scatter(const PointGridGeometry& g, const Block& points, const Block& grad,
                                const Block& gext, ExecContext& ctx);
/// Aggregation onto the cells: ext [1, C (+1), ext...] (f64, contiguous) += w(|p - centre|)
/// features[p] for every cell of the extended block inside the domain within g.radius of p; with
/// `with_weight`, channel C accumulates w.
void points_grid_splat(const PointGridGeometry& g, const Block& points, const Block& features, bool with_weight,
                       const Block& ext, ExecContext& ctx);
/// The splat's adjoint: gfeatures [points, C] = sum over the point's cells of w * cellg[c, cell];
/// gpoints [points, D] = sum of dw/dp * (cellg[C, cell] if with_weight + <features, cellg[:, cell]>)
/// (0 for the constant weight). cellg [1, C (+1), ext...] f64, any strides. Either output may be null.
void points_grid_splat_backward(const PointGridGeometry& g, const Block& cellg, const Block& points,
                                const Block& features, bool with_weight, const Block* gfeatures,
                                const Block* gpoints, ExecContext& ctx);
/// Mean over the cells: sums [C + 1, cells] (f64, contiguous; row C the weight sums) -> rows 0..C-1
/// divided by the weight sum (0 where it is 0), in place.
void points_grid_mean(index_t channels, index_t cells, const Block& sums, ExecContext& ctx);
/// The cell gradients of the mean, in place: cellg [C (+1), cells] (f64, contiguous) holds the
/// grid gradient G in rows 0..C-1 on entry; q [C + 1, cells] the mean's quotients and weight sums
/// S. On return row c = G[c] / S and, with `with_weight`, row C = -<G, q[0..C-1]> / S (0 where
/// S == 0).
void points_grid_mean_backward(index_t channels, index_t cells, const Block& q, bool with_weight, const Block& cellg,
                               ExecContext& ctx);

// ------------------------------------------------------------------------------ box ownership

/// A box partition in flat form (dist/points.hpp's BoxPartition fills it, detail::flat_partition):
/// coordinate dim d is cut at cuts[offsets[d] .. offsets[d + 1]) (ascending, slabs + 1 values);
/// slab k of dim d adds k * strides[d] to the owner's rank (stride 0: the dim is not split).
struct PointBoxPartition {
  std::vector<double> cuts;
  std::vector<index_t> offsets;  ///< dims + 1
  std::vector<index_t> strides;  ///< dims
  int ranks = 1;
  int dims() const { return static_cast<int>(strides.size()); }
};

/// The owner of every point of points [n, D] (f32 / f64, D == part.dims()): the rank whose box
/// holds it (BoxPartition::owner's rule: slab k when cut[k] <= x < cut[k + 1], the last non-empty
/// slab also takes x == hi), -1 outside the domain or NaN. owner [n] (i64, may be null) gets the
/// owners; counts [ranks + 1] (i64) the points per rank, then the points outside. Both on ctx's
/// device (the caller copies the few count bytes to the host).
void points_owner(const PointBoxPartition& part, const Block& points, const Block* owner, const Block& counts,
                  ExecContext& ctx);
/// rows [n_in] (i64) = the rows i with owner[i] >= 0, grouped by owner in rank order and
/// ascending within a group (a stable counting sort); offsets [ranks + 1] (i64) are the groups'
/// starts (the exclusive scan of points_owner's counts, offsets[ranks] = n_in).
void points_bucket_rows(int ranks, const Block& owner, const Block& offsets, const Block& rows, ExecContext& ctx);

// ------------------------------------------------------------------------------ halo selections

/// Closed boxes for the halo selections of the distributed neighbour queries (dist/points.hpp
/// knn / radius_neighbors, spatial_halo): box b is [lo[b * dims + d], hi[b * dims + d]] over the
/// dims coordinate dims; threshold[b] < 0 makes box b select nothing.
struct PointBoxes {
  int dims = 0;
  std::vector<double> lo, hi;     ///< [boxes * dims]
  std::vector<double> threshold;  ///< [boxes]
  index_t boxes() const { return static_cast<index_t>(threshold.size()); }
};

/// The bound a box tests a point against: threshold[b] (no `point_bound` block), or, with a
/// point_bound block [n, w] of the points' dtype, its last column times `scale` plus `add`
/// (rounded once each, in double) wherever threshold[b] >= 0 (e.g. the k-th d2 of a kNN list,
/// inflated by the rounding margins).
struct PointBoundScale {
  double scale = 1;
  double add = 0;
};

/// Box b selects point i (points [n, D] f32 / f64, D == boxes.dims) when dist2(p_i, box b) <=
/// its bound (dist2 summed in double in dim order, as BoxPartition::dist2_to_box; NaN selects
/// nothing). counts [boxes] (i64, on ctx's device) = the points each box selects.
void points_near_boxes_count(const PointBoxes& boxes, const Block& points, const Block* point_bound,
                             const PointBoundScale& bound, const Block& counts, ExecContext& ctx);
/// rows [sum of counts] (i64) = the points each box selects, grouped by box in box order and
/// ascending within a group; offsets [boxes] (i64, on ctx's device) are the groups' starts (the
/// exclusive scan of points_near_boxes_count's counts).
void points_near_boxes_rows(const PointBoxes& boxes, const Block& points, const Block* point_bound,
                            const PointBoundScale& bound, const Block& offsets, const Block& rows, ExecContext& ctx);
/// indices [n, k] (i64, in place) = -1 wherever d2 [n, k] > bound [n] or is NaN (d2 and bound of
/// one dtype, f32 / f64): a neighbour list cut at per-row bounds.
void points_list_filter(const PointListGeometry& g, const Block& d2, const Block& bound, const Block& indices,
                        ExecContext& ctx);
/// indices [n] (i64, in place) = table[indices] wherever indices >= 0 (table [m] i64; every
/// index < m: checked by the CPU table only).
void points_remap(const Block& table, const Block& indices, ExecContext& ctx);

}  // namespace shard::exec
