// Front of the points kernel family: dtype, device, shape and contiguity checks, then dispatch
// (include/shardtensor/exec/points.hpp).
#include "shardtensor/exec/points.hpp"

#include <cmath>
#include <vector>

#include "exec/front_util.hpp"
#include "exec/points_kernels.hpp"
#include "shardtensor/exec/box.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

SHARD_KEEP_CPU_TABLE(points);

namespace {

using shard::exec::detail::check_block;

void check_list(const char* op, const PointListGeometry& g) {
  SHARD_CHECK(g.n >= 0 && g.k >= 0 && g.width >= 0, op, "negative extent (n {}, k {}, width {})", g.n, g.k, g.width);
}

const PointsKernels& table(const char* op, DType dt, const ExecContext& ctx) {
  return detail::front_table<PointsKernels>(op, dt, ctx.device(), ctx);
}

void check_fn(const char* op, const PointWeightFn& f) {
  SHARD_CHECK(f.param > 0 && std::isfinite(f.param), op, "the weight function's parameter must be finite and > 0, got {}",
              f.param);
}

void bump(const Block* b) {
  if (b != nullptr) shard::detail::bump_version(b->owner);
}

const index_t* idx_ptr(const Block& b) { return static_cast<const index_t*>(b.data); }
void* data_or_null(const Block* b) { return b != nullptr ? b->data : nullptr; }

}  // namespace

void points_offsets_forward(const PointListGeometry& g, const Block& gathered, const Block& query,
                            const Block& indices, const Block& out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "offsets_forward", &ctx);
  const char* op = "points_offsets_forward";
  check_list(op, g);
  const DType dt = query.dtype;
  const auto& t = table(op, dt, ctx);
  check_block(op, "gathered", gathered, dt, g.n * g.k * g.width, ctx);
  check_block(op, "query", query, dt, g.n * g.width, ctx);
  check_block(op, "indices", indices, DType::i64, g.n * g.k, ctx);
  check_block(op, "out", out, dt, g.n * g.k * g.width, ctx);
  bump(&out);
  if (g.n * g.k * g.width == 0) return;
  t.offsets_forward(dt, g, gathered.data, query.data, idx_ptr(indices), out.data, ctx);
}

void points_offsets_backward(const PointListGeometry& g, const Block& grad, const Block& indices,
                             const Block* g_gathered, const Block* g_query, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "offsets_backward", &ctx);
  const char* op = "points_offsets_backward";
  check_list(op, g);
  const DType dt = grad.dtype;
  const auto& t = table(op, dt, ctx);
  check_block(op, "grad", grad, dt, g.n * g.k * g.width, ctx);
  check_block(op, "indices", indices, DType::i64, g.n * g.k, ctx);
  if (g_gathered) check_block(op, "g_gathered", *g_gathered, dt, g.n * g.k * g.width, ctx);
  if (g_query) check_block(op, "g_query", *g_query, dt, g.n * g.width, ctx);
  bump(g_gathered);
  bump(g_query);
  if (g.n * g.width == 0 || (!g_gathered && !g_query)) return;
  t.offsets_backward(dt, g, grad.data, idx_ptr(indices), data_or_null(g_gathered), data_or_null(g_query), ctx);
}

void points_norm_forward(const PointListGeometry& g, const Block& offsets, const Block& out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "norm_forward", &ctx);
  const char* op = "points_norm_forward";
  check_list(op, g);
  const DType dt = offsets.dtype;
  const auto& t = table(op, dt, ctx);
  check_block(op, "offsets", offsets, dt, g.n * g.k * g.width, ctx);
  check_block(op, "out", out, dt, g.n * g.k, ctx);
  bump(&out);
  if (g.n * g.k == 0) return;
  t.norm_forward(dt, g, offsets.data, out.data, ctx);
}

void points_norm_backward(const PointListGeometry& g, const Block& offsets, const Block& dist, const Block& grad,
                          const Block& g_offsets, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "norm_backward", &ctx);
  const char* op = "points_norm_backward";
  check_list(op, g);
  const DType dt = offsets.dtype;
  const auto& t = table(op, dt, ctx);
  check_block(op, "offsets", offsets, dt, g.n * g.k * g.width, ctx);
  check_block(op, "dist", dist, dt, g.n * g.k, ctx);
  check_block(op, "grad", grad, dt, g.n * g.k, ctx);
  check_block(op, "g_offsets", g_offsets, dt, g.n * g.k * g.width, ctx);
  bump(&g_offsets);
  if (g.n * g.k * g.width == 0) return;
  t.norm_backward(dt, g, offsets.data, dist.data, grad.data, g_offsets.data, ctx);
}

namespace {

/// The shared front of points_weights_forward (grad null: out = f(dist)) and _backward.
void weights_front(const char* op, const PointListGeometry& g, const PointWeightFn& f, const Block& dist,
                   const Block& counts, const Block* grad, const Block& out, ExecContext& ctx) {
  check_list(op, g);
  check_fn(op, f);
  const DType dt = dist.dtype;
  const auto& t = table(op, dt, ctx);
  check_block(op, "dist", dist, dt, g.n * g.k, ctx);
  check_block(op, "counts", counts, DType::i64, g.n, ctx);
  if (grad) check_block(op, "grad", *grad, dt, g.n * g.k, ctx);
  check_block(op, grad ? "g_dist" : "out", out, dt, g.n * g.k, ctx);
  bump(&out);
  if (g.n * g.k == 0) return;
  if (grad) t.weights_backward(dt, g, f, dist.data, idx_ptr(counts), grad->data, out.data, ctx);
  else t.weights_forward(dt, g, f, dist.data, idx_ptr(counts), out.data, ctx);
}

}  // namespace

void points_weights_forward(const PointListGeometry& g, const PointWeightFn& f, const Block& dist,
                            const Block& counts, const Block& out, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "weights_forward", &ctx);
  weights_front("points_weights_forward", g, f, dist, counts, nullptr, out, ctx);
}

void points_weights_backward(const PointListGeometry& g, const PointWeightFn& f, const Block& dist,
                             const Block& counts, const Block& grad, const Block& g_dist, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "weights_backward", &ctx);
  weights_front("points_weights_backward", g, f, dist, counts, &grad, g_dist, ctx);
}

void points_aggregate_forward(const PointListGeometry& g, PointAggregate reduce, const Block& values,
                              const Block* weights, const Block& counts, const Block& out, const Block& argmax,
                              ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "aggregate_forward", &ctx);
  const char* op = "points_aggregate_forward";
  check_list(op, g);
  const DType dt = values.dtype;
  const auto& t = table(op, dt, ctx);
  check_block(op, "values", values, dt, g.n * g.k * g.width, ctx);
  if (weights) check_block(op, "weights", *weights, dt, g.n * g.k, ctx);
  check_block(op, "counts", counts, DType::i64, g.n, ctx);
  check_block(op, "out", out, dt, g.n * g.width, ctx);
  const bool max = reduce == PointAggregate::max;
  if (max) check_block(op, "argmax", argmax, DType::i64, g.n * g.width, ctx);
  bump(&out);
  if (max) bump(&argmax);
  if (g.n * g.width == 0) return;
  t.aggregate_forward(dt, g, reduce, values.data, weights ? weights->data : nullptr, idx_ptr(counts), out.data,
                      max ? static_cast<index_t*>(argmax.data) : nullptr, ctx);
}

void points_aggregate_backward(const PointListGeometry& g, PointAggregate reduce, const Block& values,
                               const Block* weights, const Block& counts, const Block& argmax, const Block& grad,
                               const Block* g_values, const Block* g_weights, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "aggregate_backward", &ctx);
  const char* op = "points_aggregate_backward";
  check_list(op, g);
  const DType dt = values.dtype;
  const auto& t = table(op, dt, ctx);
  check_block(op, "values", values, dt, g.n * g.k * g.width, ctx);
  if (weights) check_block(op, "weights", *weights, dt, g.n * g.k, ctx);
  check_block(op, "counts", counts, DType::i64, g.n, ctx);
  const bool max = reduce == PointAggregate::max;
  if (max) check_block(op, "argmax", argmax, DType::i64, g.n * g.width, ctx);
  check_block(op, "grad", grad, dt, g.n * g.width, ctx);
  if (g_values) check_block(op, "g_values", *g_values, dt, g.n * g.k * g.width, ctx);
  if (g_weights) check_block(op, "g_weights", *g_weights, dt, g.n * g.k, ctx);
  bump(g_values);
  bump(g_weights);
  if (g.n * g.k == 0 || (!g_values && !g_weights)) return;
  t.aggregate_backward(dt, g, reduce, values.data, weights ? weights->data : nullptr, idx_ptr(counts),
                       max ? idx_ptr(argmax) : nullptr, grad.data, data_or_null(g_values), data_or_null(g_weights),
                       ctx);
}

// ------------------------------------------------------------------------------ point <-> grid

namespace {

/// The kernels_api form of g, with `ext`'s strides (a [1, channels, ext...] block).
kernels::PtsGrid grid_of(const char* op, const PointGridGeometry& g, const Block& ext, index_t channels,
                         const char* what) {
  SHARD_CHECK(g.dims == 2 || g.dims == 3, op, "2 or 3 spatial dims, got {}", g.dims);
  SHARD_CHECK(g.points >= 0 && g.channels >= 0, op, "negative extent (points {}, channels {})", g.points, g.channels);
  bool ok = ext.rank == g.dims + 2 && ext.shape[0] == 1 && ext.shape[1] == channels;
  for (int d = 0; ok && d < g.dims; ++d) ok = ext.shape[static_cast<std::size_t>(d) + 2] == g.ext(d);
  std::vector<index_t> want{1, channels};
  for (int d = 0; d < g.dims; ++d) want.push_back(g.ext(d));
  SHARD_CHECK(ok, op, "{} must have shape {}, got {}", what, want, ext.shape_vec());
  kernels::PtsGrid k;
  k.dims = g.dims;
  k.channels = g.channels;
  k.points = g.points;
  for (int d = 0; d < g.dims; ++d) {
    const auto u = static_cast<std::size_t>(d);
    SHARD_CHECK(g.h[u] > 0 && g.len[u] >= 0 && g.ghost[u] >= 0 && g.global[u] >= 1 && g.ext(d) >= 2, op,
                "bad grid geometry along dim {} (h {}, len {}, ghost {}, global {})", d, g.h[u], g.len[u], g.ghost[u],
                g.global[u]);
    k.global[d] = g.global[u];
    k.offset[d] = g.offset[u];
    k.len[d] = g.len[u];
    k.ghost[d] = g.ghost[u];
    k.lo[d] = g.lo[u];
    k.h[d] = g.h[u];
    k.s[d] = ext.strides[u + 2];
  }
  k.sc = ext.strides[1];
  k.radius = g.radius;
  k.linear = g.linear_weight ? 1 : 0;
  return k;
}

}  // namespace

void points_grid_interp(const PointGridGeometry& g, const Block& ext, const Block& points, const Block& out,
                        ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "grid_interp", &ctx);
  const char* op = "points_grid_interp";
  const DType dt = points.dtype;
  const auto& t = table(op, dt, ctx);
  const auto k = grid_of(op, g, ext, g.channels, "the extended grid");
  check_block(op, "ext", ext, dt, -1, ctx);
  check_block(op, "points", points, dt, g.points * g.dims, ctx);
  check_block(op, "out", out, dt, g.points * g.channels, ctx);
  bump(&out);
  if (g.points * g.channels == 0) return;
  t.grid_interp(dt, k, ext.data, points.data, out.data, ctx);
}

void points_grid_interp_grad_points(const PointGridGeometry& g, const Block& ext, const Block& points,
                                    const Block& grad, const Block& gpoints, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "grid_interp_grad_points", &ctx);
  const char* op = "points_grid_interp_grad_points";
  const DType dt = points.dtype;
  const auto& t = table(op, dt, ctx);
  const auto k = grid_of(op, g, ext, g.channels, "the extended grid");
  check_block(op, "ext", ext, dt, -1, ctx);
  check_block(op, "points", points, dt, g.points * g.dims, ctx);
  check_block(op, "grad", grad, dt, g.points * g.channels, ctx);
  check_block(op, "gpoints", gpoints, dt, g.points * g.dims, ctx);
  bump(&gpoints);
  if (g.points == 0) return;
  t.grid_interp_grad_points(dt, k, ext.data, points.data, grad.data, gpoints.data, ctx);
}

void points_grid_interp_scatter(const PointGridGeometry& g, const Block& points, const Block& grad,
                                const Block& gext, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "grid_interp_scatter", &ctx);
  const char* op = "points_grid_interp_scatter";
  const DType dt = points.dtype;
  const auto& t = table(op, dt, ctx);
  const auto k = grid_of(op, g, gext, g.channels, "the extended grid gradient");
  check_block(op, "gext", gext, DType::f64, gext.numel(), ctx);
  check_block(op, "points", points, dt, g.points * g.dims, ctx);
  check_block(op, "grad", grad, dt, g.points * g.channels, ctx);
  bump(&gext);
  if (g.points * g.channels == 0) return;
  t.grid_interp_scatter(dt, k, points.data, grad.data, static_cast<double*>(gext.data), ctx);
}

void points_grid_splat(const PointGridGeometry& g, const Block& points, const Block& features, bool with_weight,
                       const Block& ext, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "grid_splat", &ctx);
  const char* op = "points_grid_splat";
  const DType dt = points.dtype;
  const auto& t = table(op, dt, ctx);
  SHARD_CHECK(std::isfinite(g.radius) && g.radius >= 0 && (!g.linear_weight || g.radius > 0), op,
              "radius must be finite and >= 0 (> 0 for the linear weight), got {}", g.radius);
  const auto k = grid_of(op, g, ext, g.channels + (with_weight ? 1 : 0), "the extended grid");
  check_block(op, "ext", ext, DType::f64, ext.numel(), ctx);
  check_block(op, "points", points, dt, g.points * g.dims, ctx);
  check_block(op, "features", features, dt, g.points * g.channels, ctx);
  bump(&ext);
  if (g.points == 0) return;
  t.grid_splat(dt, k, points.data, features.data, with_weight, static_cast<double*>(ext.data), ctx);
}

void points_grid_splat_backward(const PointGridGeometry& g, const Block& cellg, const Block& points,
                                const Block& features, bool with_weight, const Block* gfeatures,
                                const Block* gpoints, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "grid_splat_backward", &ctx);
  const char* op = "points_grid_splat_backward";
  const DType dt = points.dtype;
  const auto& t = table(op, dt, ctx);
  SHARD_CHECK(std::isfinite(g.radius) && g.radius >= 0 && (!g.linear_weight || g.radius > 0), op,
              "radius must be finite and >= 0 (> 0 for the linear weight), got {}", g.radius);
  const auto k = grid_of(op, g, cellg, g.channels + (with_weight ? 1 : 0), "the extended cell gradient");
  check_block(op, "cellg", cellg, DType::f64, -1, ctx);
  check_block(op, "points", points, dt, g.points * g.dims, ctx);
  check_block(op, "features", features, dt, g.points * g.channels, ctx);
  if (gfeatures) check_block(op, "gfeatures", *gfeatures, dt, g.points * g.channels, ctx);
  if (gpoints) check_block(op, "gpoints", *gpoints, dt, g.points * g.dims, ctx);
  bump(gfeatures);
  bump(gpoints);
  if (g.points == 0 || (!gfeatures && !gpoints)) return;
  t.grid_splat_backward(dt, k, static_cast<const double*>(cellg.data), points.data, features.data, with_weight,
                        data_or_null(gfeatures), data_or_null(gpoints), ctx);
}

void points_grid_mean(index_t channels, index_t cells, const Block& sums, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "grid_mean", &ctx);
  const char* op = "points_grid_mean";
  SHARD_CHECK(channels >= 0 && cells >= 0, op, "negative extent (channels {}, cells {})", channels, cells);
  const auto& t = table(op, DType::f64, ctx);
  check_block(op, "sums", sums, DType::f64, (channels + 1) * cells, ctx);
  bump(&sums);
  if (cells == 0) return;
  t.grid_mean(channels, cells, static_cast<double*>(sums.data), ctx);
}

void points_grid_mean_backward(index_t channels, index_t cells, const Block& q, bool with_weight, const Block& cellg,
                               ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "grid_mean_backward", &ctx);
  const char* op = "points_grid_mean_backward";
  SHARD_CHECK(channels >= 0 && cells >= 0, op, "negative extent (channels {}, cells {})", channels, cells);
  const auto& t = table(op, DType::f64, ctx);
  check_block(op, "q", q, DType::f64, (channels + 1) * cells, ctx);
  check_block(op, "cellg", cellg, DType::f64, (channels + (with_weight ? 1 : 0)) * cells, ctx);
  bump(&cellg);
  if (cells == 0) return;
  t.grid_mean_backward(channels, cells, static_cast<const double*>(q.data), with_weight,
                       static_cast<double*>(cellg.data), ctx);
}

// ------------------------------------------------------------------------------ box ownership

namespace {

/// part's arrays as blocks on ctx's device (host views on the CPU, small uploads elsewhere) and
/// the kernels_api form pointing at them.
struct FlatPartition {
  Block cuts, meta;
  kernels::PtsPartition k;
};

FlatPartition flat_partition(const char* op, const PointBoxPartition& part, ExecContext& ctx) {
  const int D = part.dims();
  SHARD_CHECK(D >= 1 && part.ranks >= 1 && static_cast<int>(part.offsets.size()) == D + 1 && part.offsets[0] == 0 &&
                  part.offsets.back() == static_cast<index_t>(part.cuts.size()),
              op, "malformed partition ({} dims, {} offsets, {} cuts, {} ranks)", D, part.offsets.size(),
              part.cuts.size(), part.ranks);
  for (int d = 0; d < D; ++d)
    SHARD_CHECK(part.offsets[static_cast<std::size_t>(d) + 1] - part.offsets[static_cast<std::size_t>(d)] >= 2, op,
                "dim {} needs at least 2 cuts", d);
  std::vector<index_t> meta(part.offsets.begin(), part.offsets.end());
  meta.insert(meta.end(), part.strides.begin(), part.strides.end());
  const index_t nc = static_cast<index_t>(part.cuts.size()), nm = static_cast<index_t>(meta.size());
  FlatPartition f;
  const Block hc = Block::view(DType::f64, Device::cpu(), const_cast<double*>(part.cuts.data()), &nc, 1);
  const Block hm = Block::view(DType::i64, Device::cpu(), meta.data(), &nm, 1);
  f.cuts = Block::allocate(DType::f64, ctx.device(), &nc, 1);
  f.meta = Block::allocate(DType::i64, ctx.device(), &nm, 1);
  box_copy(f.cuts, hc, ctx);
  box_copy(f.meta, hm, ctx);
  f.k.dims = D;
  f.k.ranks = part.ranks;
  f.k.cuts = static_cast<const double*>(f.cuts.data);
  f.k.meta = static_cast<const kernels::pts_idx*>(f.meta.data);
  return f;
}

}  // namespace

void points_owner(const PointBoxPartition& part, const Block& points, const Block* owner, const Block& counts,
                  ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "owner", &ctx);
  const char* op = "points_owner";
  const DType dt = points.dtype;
  const auto& t = table(op, dt, ctx);
  const FlatPartition f = flat_partition(op, part, ctx);
  SHARD_CHECK(points.rank == 2 && points.shape[1] == part.dims(), op, "points must be [n, {}], got {}", part.dims(),
              points.shape_vec());
  const index_t n = points.shape[0];
  check_block(op, "points", points, dt, n * part.dims(), ctx);
  if (owner) check_block(op, "owner", *owner, DType::i64, n, ctx);
  check_block(op, "counts", counts, DType::i64, part.ranks + 1, ctx);
  bump(owner);
  bump(&counts);
  t.owner(dt, n, f.k, points.data, owner ? static_cast<index_t*>(owner->data) : nullptr,
          static_cast<index_t*>(counts.data), ctx);
}

void points_bucket_rows(int ranks, const Block& owner, const Block& offsets, const Block& rows, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "bucket_rows", &ctx);
  const char* op = "points_bucket_rows";
  SHARD_CHECK(ranks >= 1, op, "ranks must be >= 1, got {}", ranks);
  const auto& t = table(op, DType::f64, ctx);
  check_block(op, "owner", owner, DType::i64, owner.numel(), ctx);
  check_block(op, "offsets", offsets, DType::i64, ranks + 1, ctx);
  check_block(op, "rows", rows, DType::i64, rows.numel(), ctx);
  bump(&rows);
  if (owner.numel() == 0 || rows.numel() == 0) return;
  t.bucket_rows(owner.numel(), ranks, idx_ptr(owner), idx_ptr(offsets), static_cast<index_t*>(rows.data), ctx);
}

// ------------------------------------------------------------------------------ halo selections

namespace {

/// boxes' arrays as one f64 block on ctx's device (lo, hi, threshold) and the kernels_api form.
struct FlatBoxes {
  Block arrays;
  kernels::PtsBoxes k;
};

FlatBoxes flat_boxes(const char* op, const PointBoxes& boxes, const PointBoundScale& bound, ExecContext& ctx) {
  const index_t nb = boxes.boxes(), D = boxes.dims;
  SHARD_CHECK(D >= 1 && static_cast<index_t>(boxes.lo.size()) == nb * D &&
                  static_cast<index_t>(boxes.hi.size()) == nb * D,
              op, "malformed boxes ({} dims, {} thresholds, {} lo, {} hi)", D, nb, boxes.lo.size(), boxes.hi.size());
  std::vector<double> all(boxes.lo);
  all.insert(all.end(), boxes.hi.begin(), boxes.hi.end());
  all.insert(all.end(), boxes.threshold.begin(), boxes.threshold.end());
  const index_t na = static_cast<index_t>(all.size());
  FlatBoxes f;
  f.arrays = Block::allocate(DType::f64, ctx.device(), &na, 1);
  if (na > 0) box_copy(f.arrays, Block::view(DType::f64, Device::cpu(), all.data(), &na, 1), ctx);
  const auto* a = static_cast<const double*>(f.arrays.data);
  f.k.dims = boxes.dims;
  f.k.boxes = nb;
  f.k.lo = a;
  f.k.hi = a + nb * D;
  f.k.threshold = a + 2 * nb * D;
  f.k.scale = bound.scale;
  f.k.add = bound.add;
  return f;
}

/// Checks points [n, D] and the optional point_bound [n, w]; returns w (1 without the block).
index_t check_selection(const char* op, const PointBoxes& boxes, const Block& points, const Block* point_bound,
                        ExecContext& ctx) {
  SHARD_CHECK(points.rank == 2 && points.shape[1] == boxes.dims, op, "points must be [n, {}], got {}", boxes.dims,
              points.shape_vec());
  const index_t n = points.shape[0];
  check_block(op, "points", points, points.dtype, n * boxes.dims, ctx);
  if (point_bound == nullptr) return 1;
  SHARD_CHECK(point_bound->rank == 2 && point_bound->shape[0] == n && point_bound->shape[1] >= 1, op,
              "point_bound must be [{}, w >= 1], got {}", n, point_bound->shape_vec());
  check_block(op, "point_bound", *point_bound, points.dtype, n * point_bound->shape[1], ctx);
  return point_bound->shape[1];
}

}  // namespace

void points_near_boxes_count(const PointBoxes& boxes, const Block& points, const Block* point_bound,
                             const PointBoundScale& bound, const Block& counts, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "near_boxes_count", &ctx);
  const char* op = "points_near_boxes_count";
  const DType dt = points.dtype;
  const auto& t = table(op, dt, ctx);
  const index_t w = check_selection(op, boxes, points, point_bound, ctx);
  check_block(op, "counts", counts, DType::i64, boxes.boxes(), ctx);
  bump(&counts);
  if (boxes.boxes() == 0) return;
  const FlatBoxes f = flat_boxes(op, boxes, bound, ctx);
  t.near_boxes_count(dt, points.shape[0], f.k, points.data, data_or_null(point_bound), w,
                     static_cast<index_t*>(counts.data), ctx);
}

void points_near_boxes_rows(const PointBoxes& boxes, const Block& points, const Block* point_bound,
                            const PointBoundScale& bound, const Block& offsets, const Block& rows, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "near_boxes_rows", &ctx);
  const char* op = "points_near_boxes_rows";
  const DType dt = points.dtype;
  const auto& t = table(op, dt, ctx);
  const index_t w = check_selection(op, boxes, points, point_bound, ctx);
  check_block(op, "offsets", offsets, DType::i64, boxes.boxes(), ctx);
  check_block(op, "rows", rows, DType::i64, rows.numel(), ctx);
  bump(&rows);
  if (boxes.boxes() == 0 || rows.numel() == 0 || points.shape[0] == 0) return;
  const FlatBoxes f = flat_boxes(op, boxes, bound, ctx);
  t.near_boxes_rows(dt, points.shape[0], f.k, points.data, data_or_null(point_bound), w, idx_ptr(offsets),
                    static_cast<index_t*>(rows.data), ctx);
}

void points_list_filter(const PointListGeometry& g, const Block& d2, const Block& bound, const Block& indices,
                        ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "list_filter", &ctx);
  const char* op = "points_list_filter";
  check_list(op, g);
  const DType dt = d2.dtype;
  const auto& t = table(op, dt, ctx);
  check_block(op, "d2", d2, dt, g.n * g.k, ctx);
  check_block(op, "bound", bound, dt, g.n, ctx);
  check_block(op, "indices", indices, DType::i64, g.n * g.k, ctx);
  bump(&indices);
  if (g.n * g.k == 0) return;
  t.list_filter(dt, g.n, g.k, d2.data, bound.data, static_cast<index_t*>(indices.data), ctx);
}

void points_remap(const Block& table_block, const Block& indices, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "points", "remap", &ctx);
  const char* op = "points_remap";
  const auto& t = table(op, DType::f64, ctx);
  check_block(op, "table", table_block, DType::i64, table_block.numel(), ctx);
  check_block(op, "indices", indices, DType::i64, indices.numel(), ctx);
  bump(&indices);
  if (indices.numel() == 0) return;
  t.remap(indices.numel(), table_block.numel(), idx_ptr(table_block), static_cast<index_t*>(indices.data), ctx);
}

}  // namespace shard::exec
