// CUDA implementation of the points family: host glue to kernels/points.cu (firewall:
// src/kernels_api/points.hpp). Registered for DeviceKind::cuda when shardtensor::cuda is linked.
// Asynchronous on the context's stream. Unlike the CPU table, counts and argmax entries are not
// checked (that would need a synchronisation): counts are clamped to [0, k].
#include <cuda_runtime.h>

#include "cuda/family_util.hpp"
#include "exec/points_kernels.hpp"
#include "kernels_api/points.hpp"

namespace shard::exec {
namespace {

using cuda_glue::check_rc;
using cuda_glue::DeviceScope;
using cuda_glue::is_f64;

static_assert(sizeof(index_t) == sizeof(kernels::pts_idx), "index_t is the launchers' 64-bit index");

struct CudaPoints final : PointsKernels {
  void offsets_forward(DType dt, const PointListGeometry& g, const void* gathered, const void* query,
                       const index_t* indices, void* out, ExecContext& ctx) const override {
    const char* op = "points_offsets_forward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_offsets_forward(is_f64(dt), g.n, g.k, g.width, gathered, query, indices, out,
                                             ctx.stream().handle),
             op, ctx);
  }
  void offsets_backward(DType dt, const PointListGeometry& g, const void* grad, const index_t* indices,
                        void* g_gathered, void* g_query, ExecContext& ctx) const override {
    const char* op = "points_offsets_backward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_offsets_backward(is_f64(dt), g.n, g.k, g.width, grad, indices, g_gathered, g_query,
                                              ctx.stream().handle),
             op, ctx);
  }
  void norm_forward(DType dt, const PointListGeometry& g, const void* offsets, void* out,
                    ExecContext& ctx) const override {
    const char* op = "points_norm_forward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_norm_forward(is_f64(dt), g.n * g.k, g.width, offsets, out, ctx.stream().handle), op,
             ctx);
  }
  void norm_backward(DType dt, const PointListGeometry& g, const void* offsets, const void* dist, const void* grad,
                     void* g_offsets, ExecContext& ctx) const override {
    const char* op = "points_norm_backward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_norm_backward(is_f64(dt), g.n * g.k, g.width, offsets, dist, grad, g_offsets,
                                           ctx.stream().handle),
             op, ctx);
  }
  void weights_forward(DType dt, const PointListGeometry& g, const PointWeightFn& f, const void* dist,
                       const index_t* counts, void* out, ExecContext& ctx) const override {
    const char* op = "points_weights_forward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_weights(is_f64(dt), g.n, g.k, static_cast<int>(f.kind), f.param, dist, counts, nullptr,
                                     out, ctx.stream().handle),
             op, ctx);
  }
  void weights_backward(DType dt, const PointListGeometry& g, const PointWeightFn& f, const void* dist,
                        const index_t* counts, const void* grad, void* g_dist, ExecContext& ctx) const override {
    const char* op = "points_weights_backward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_weights(is_f64(dt), g.n, g.k, static_cast<int>(f.kind), f.param, dist, counts, grad,
                                     g_dist, ctx.stream().handle),
             op, ctx);
  }
  void aggregate_forward(DType dt, const PointListGeometry& g, PointAggregate reduce, const void* values,
                         const void* weights, const index_t* counts, void* out, index_t* argmax,
                         ExecContext& ctx) const override {
    const char* op = "points_aggregate_forward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_aggregate_forward(is_f64(dt), g.n, g.k, g.width, static_cast<int>(reduce), values,
                                               weights, counts, out, argmax, ctx.stream().handle),
             op, ctx);
  }
  void aggregate_backward(DType dt, const PointListGeometry& g, PointAggregate reduce, const void* values,
                          const void* weights, const index_t* counts, const index_t* argmax, const void* grad,
                          void* g_values, void* g_weights, ExecContext& ctx) const override {
    const char* op = "points_aggregate_backward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_aggregate_backward(is_f64(dt), g.n, g.k, g.width, static_cast<int>(reduce), values,
                                                weights, counts, argmax, grad, g_values, g_weights,
                                                ctx.stream().handle),
             op, ctx);
  }
  void grid_interp(DType dt, const kernels::PtsGrid& g, const void* ext, const void* points, void* out,
                   ExecContext& ctx) const override {
    const char* op = "points_grid_interp";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_grid_interp(is_f64(dt), g, ext, points, out, ctx.stream().handle), op, ctx);
  }
  void grid_interp_grad_points(DType dt, const kernels::PtsGrid& g, const void* ext, const void* points,
                               const void* grad, void* gpoints, ExecContext& ctx) const override {
    const char* op = "points_grid_interp_grad_points";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_grid_interp_grad_points(is_f64(dt), g, ext, points, grad, gpoints, ctx.stream().handle),
             op, ctx);
  }
  void grid_interp_scatter(DType dt, const kernels::PtsGrid& g, const void* points, const void* grad, double* gext,
                           ExecContext& ctx) const override {
    const char* op = "points_grid_interp_scatter";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_grid_interp_scatter(is_f64(dt), g, points, grad, gext, ctx.stream().handle), op, ctx);
  }
  void grid_splat(DType dt, const kernels::PtsGrid& g, const void* points, const void* features, bool with_weight,
                  double* ext, ExecContext& ctx) const override {
    const char* op = "points_grid_splat";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_grid_splat(is_f64(dt), g, points, features, with_weight ? 1 : 0, ext,
                                        ctx.stream().handle),
             op, ctx);
  }
  void grid_splat_backward(DType dt, const kernels::PtsGrid& g, const double* cellg, const void* points,
                           const void* features, bool with_weight, void* gfeatures, void* gpoints,
                           ExecContext& ctx) const override {
    const char* op = "points_grid_splat_backward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_grid_splat_backward(is_f64(dt), g, cellg, points, features, with_weight ? 1 : 0,
                                                 gfeatures, gpoints, ctx.stream().handle),
             op, ctx);
  }
  void grid_mean(index_t channels, index_t cells, double* sums, ExecContext& ctx) const override {
    const char* op = "points_grid_mean";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_grid_mean(channels, cells, sums, ctx.stream().handle), op, ctx);
  }
  void grid_mean_backward(index_t channels, index_t cells, const double* q, bool with_weight, double* cellg,
                          ExecContext& ctx) const override {
    const char* op = "points_grid_mean_backward";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_grid_mean_backward(channels, cells, q, with_weight ? 1 : 0, cellg, ctx.stream().handle),
             op, ctx);
  }
  void owner(DType dt, index_t n, const kernels::PtsPartition& part, const void* points, index_t* own, index_t* counts,
             ExecContext& ctx) const override {
    const char* op = "points_owner";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_owner(is_f64(dt), n, part, points, own, counts, ctx.stream().handle), op, ctx);
  }
  void bucket_rows(index_t n, int ranks, const index_t* own, const index_t* offsets, index_t* rows,
                   ExecContext& ctx) const override {
    const char* op = "points_bucket_rows";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_bucket_rows(n, ranks, own, offsets, rows, ctx.stream().handle), op, ctx);
  }
  void near_boxes_count(DType dt, index_t n, const kernels::PtsBoxes& boxes, const void* points, const void* pb,
                        index_t pbs, index_t* counts, ExecContext& ctx) const override {
    const char* op = "points_near_boxes_count";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_near_boxes_count(is_f64(dt), n, boxes, points, pb, pbs, counts, ctx.stream().handle), op,
             ctx);
  }
  void near_boxes_rows(DType dt, index_t n, const kernels::PtsBoxes& boxes, const void* points, const void* pb,
                       index_t pbs, const index_t* offsets, index_t* rows, ExecContext& ctx) const override {
    const char* op = "points_near_boxes_rows";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_near_boxes_rows(is_f64(dt), n, boxes, points, pb, pbs, offsets, rows,
                                             ctx.stream().handle),
             op, ctx);
  }
  void list_filter(DType dt, index_t n, index_t k, const void* d2, const void* bound, index_t* ix,
                   ExecContext& ctx) const override {
    const char* op = "points_list_filter";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_list_filter(is_f64(dt), n, k, d2, bound, ix, ctx.stream().handle), op, ctx);
  }
  void remap(index_t n, index_t, const index_t* table, index_t* ix, ExecContext& ctx) const override {
    const char* op = "points_remap";
    DeviceScope scope(ctx, op);
    check_rc(kernels::points_remap(n, table, ix, ctx.stream().handle), op, ctx);
  }
};

const CudaPoints g_cuda_points;
struct Registrar {
  Registrar() { register_family(DeviceKind::cuda, KernelFamily::points, &g_cuda_points); }
} g_registrar;

}  // namespace

/// Anchor: referencing it keeps this file (and its registrar) in a static link.
void cuda_link_points() noexcept {}

}  // namespace shard::exec
