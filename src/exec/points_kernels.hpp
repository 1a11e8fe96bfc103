#pragma once
// The points kernel family's interface (private): src/exec/points_cpu.cpp (DeviceKind::cpu) and
// src/cuda/points_cuda.cpp. The front has checked dtypes (dt is f32 or f64), shapes, devices and
// contiguity; extents are > 0 (the front returns early on empty work). Grids arrive as the
// kernels_api geometry with the extended block's strides filled in.
#include "kernels_api/points_ops.hpp"
#include "shardtensor/exec/points.hpp"
#include "shardtensor/runtime/registry.hpp"
#include "exec/kernel_table.hpp"

namespace shard::exec {

struct PointsKernels : KernelTable {
  static constexpr KernelFamily id = KernelFamily::points;
  // neighbour lists (exec/points.hpp); null output pointers are skipped
  virtual void offsets_forward(DType dt, const PointListGeometry& g, const void* gathered, const void* query,
                               const index_t* indices, void* out, ExecContext& ctx) const = 0;
  virtual void offsets_backward(DType dt, const PointListGeometry& g, const void* grad, const index_t* indices,
                                void* g_gathered, void* g_query, ExecContext& ctx) const = 0;
  virtual void norm_forward(DType dt, const PointListGeometry& g, const void* offsets, void* out,
                            ExecContext& ctx) const = 0;
  virtual void norm_backward(DType dt, const PointListGeometry& g, const void* offsets, const void* dist,
                             const void* grad, void* g_offsets, ExecContext& ctx) const = 0;
  virtual void weights_forward(DType dt, const PointListGeometry& g, const PointWeightFn& f, const void* dist,
                               const index_t* counts, void* out, ExecContext& ctx) const = 0;
  virtual void weights_backward(DType dt, const PointListGeometry& g, const PointWeightFn& f, const void* dist,
                                const index_t* counts, const void* grad, void* g_dist, ExecContext& ctx) const = 0;
  virtual void aggregate_forward(DType dt, const PointListGeometry& g, PointAggregate reduce, const void* values,
                                 const void* weights, const index_t* counts, void* out, index_t* argmax,
                                 ExecContext& ctx) const = 0;
  virtual void aggregate_backward(DType dt, const PointListGeometry& g, PointAggregate reduce, const void* values,
                                  const void* weights, const index_t* counts, const index_t* argmax, const void* grad,
                                  void* g_values, void* g_weights, ExecContext& ctx) const = 0;
  // point <-> grid
  virtual void grid_interp(DType dt, const kernels::PtsGrid& g, const void* ext, const void* points, void* out,
                           ExecContext& ctx) const = 0;
  virtual void grid_interp_grad_points(DType dt, const kernels::PtsGrid& g, const void* ext, const void* points,
                                       const void* grad, void* gpoints, ExecContext& ctx) const = 0;
  virtual void grid_interp_scatter(DType dt, const kernels::PtsGrid& g, const void* points, const void* grad,
                                   double* gext, ExecContext& ctx) const = 0;
  virtual void grid_splat(DType dt, const kernels::PtsGrid& g, const void* points, const void* features,
                          bool with_weight, double* ext, ExecContext& ctx) const = 0;
  virtual void grid_splat_backward(DType dt, const kernels::PtsGrid& g, const double* cellg, const void* points,
                                   const void* features, bool with_weight, void* gfeatures, void* gpoints,
                                   ExecContext& ctx) const = 0;
  virtual void grid_mean(index_t channels, index_t cells, double* sums, ExecContext& ctx) const = 0;
  virtual void grid_mean_backward(index_t channels, index_t cells, const double* q, bool with_weight, double* cellg,
                                  ExecContext& ctx) const = 0;
  // box ownership (part's arrays on ctx's device); counts [ranks + 1] written whole
  virtual void owner(DType dt, index_t n, const kernels::PtsPartition& part, const void* points, index_t* owner,
                     index_t* counts, ExecContext& ctx) const = 0;
  virtual void bucket_rows(index_t n, int ranks, const index_t* owner, const index_t* offsets, index_t* rows,
                           ExecContext& ctx) const = 0;
  // halo selections (boxes' arrays on ctx's device); pbound [n, pb_stride] or null
  virtual void near_boxes_count(DType dt, index_t n, const kernels::PtsBoxes& boxes, const void* points,
                                const void* pbound, index_t pb_stride, index_t* counts, ExecContext& ctx) const = 0;
  virtual void near_boxes_rows(DType dt, index_t n, const kernels::PtsBoxes& boxes, const void* points,
                               const void* pbound, index_t pb_stride, const index_t* offsets, index_t* rows,
                               ExecContext& ctx) const = 0;
  virtual void list_filter(DType dt, index_t n, index_t k, const void* d2, const void* bound, index_t* indices,
                           ExecContext& ctx) const = 0;
  virtual void remap(index_t n, index_t m, const index_t* table, index_t* indices, ExecContext& ctx) const = 0;
};

}  // namespace shard::exec
