#pragma once
// Kernel firewall for the points family (kernels/points.cu): plain C++17. Every array is
// contiguous row-major as in include/shardtensor/exec/points.hpp; `f64` selects double (1) or
// float (0) elements; indices and counts are std::int64_t (counts are clamped to [0, k]; an
// argmax outside [0, k) is skipped). Launchers queue work on `stream` and return a cudaError_t
// as int (0: success), never synchronising. The grid scatters add into f64 blocks with atomics
// (the order of the additions into one cell, and so the last bits, may vary between runs).
#include <cstdint>

#include "kernels_api/points_ops.hpp"

namespace shard::kernels {

int points_offsets_forward(int f64, pts_idx n, pts_idx k, pts_idx D, const void* gathered, const void* query,
                           const pts_idx* indices, void* out, void* stream);
int points_offsets_backward(int f64, pts_idx n, pts_idx k, pts_idx D, const void* grad, const pts_idx* indices,
                            void* g_gathered, void* g_query, void* stream);
int points_norm_forward(int f64, pts_idx nk, pts_idx D, const void* offsets, void* out, void* stream);
int points_norm_backward(int f64, pts_idx nk, pts_idx D, const void* offsets, const void* dist, const void* grad,
                         void* g_offsets, void* stream);
/// kind: PtsWeight. grad == null: forward (out = f(dist)); else out = grad f'(dist).
int points_weights(int f64, pts_idx n, pts_idx k, int kind, double param, const void* dist, const pts_idx* counts,
                   const void* grad, void* out, void* stream);
/// reduce: PtsAggregate; weights may be null; argmax written for pts_max only.
int points_aggregate_forward(int f64, pts_idx n, pts_idx k, pts_idx C, int reduce, const void* values,
                             const void* weights, const pts_idx* counts, void* out, pts_idx* argmax, void* stream);
/// g_values / g_weights may be null (each written whole when not).
int points_aggregate_backward(int f64, pts_idx n, pts_idx k, pts_idx C, int reduce, const void* values,
                              const void* weights, const pts_idx* counts, const pts_idx* argmax, const void* grad,
                              void* g_values, void* g_weights, void* stream);

int points_grid_interp(int f64, const PtsGrid& g, const void* ext, const void* points, void* out, void* stream);
int points_grid_interp_grad_points(int f64, const PtsGrid& g, const void* ext, const void* points, const void* grad,
                                   void* gpoints, void* stream);
int points_grid_interp_scatter(int f64, const PtsGrid& g, const void* points, const void* grad, double* gext,
                               void* stream);
int points_grid_splat(int f64, const PtsGrid& g, const void* points, const void* features, int with_weight,
                      double* ext, void* stream);
/// gfeatures / gpoints may be null.
int points_grid_splat_backward(int f64, const PtsGrid& g, const double* cellg, const void* points,
                               const void* features, int with_weight, void* gfeatures, void* gpoints, void* stream);
int points_grid_mean(pts_idx channels, pts_idx cells, double* sums, void* stream);
int points_grid_mean_backward(pts_idx channels, pts_idx cells, const double* q, int with_weight, double* cellg,
                              void* stream);

/// owner [n] (may be null) = pts_owner of every point; counts [ranks + 1] = per-rank counts,
/// then the points outside (zeroed here, then counted with integer atomics: exact).
int points_owner(int f64, pts_idx n, const PtsPartition& part, const void* points, pts_idx* owner, pts_idx* counts,
                 void* stream);
/// rows = the rows with owner >= 0 grouped by owner (offsets [ranks + 1]), ascending in a group.
int points_bucket_rows(pts_idx n, int ranks, const pts_idx* owner, const pts_idx* offsets, pts_idx* rows,
                       void* stream);

/// counts [boxes] = the points each box selects (pts_box_selects; pbound [n, pb_stride] of the
/// points' dtype or null). Zeroed here, then counted with integer atomics (exact).
int points_near_boxes_count(int f64, pts_idx n, const PtsBoxes& boxes, const void* points, const void* pbound,
                            pts_idx pb_stride, pts_idx* counts, void* stream);
/// rows = the points each box selects, grouped by box (offsets [boxes]: the groups' starts),
/// ascending within a group (one block per box, a block-wide scan per chunk of rows).
int points_near_boxes_rows(int f64, pts_idx n, const PtsBoxes& boxes, const void* points, const void* pbound,
                           pts_idx pb_stride, const pts_idx* offsets, pts_idx* rows, void* stream);
/// idx [n, k] = -1 where d2 [n, k] > bound [n] (or NaN); d2 / bound of one dtype.
int points_list_filter(int f64, pts_idx n, pts_idx k, const void* d2, const void* bound, pts_idx* idx, void* stream);
/// idx [n] = table[idx] where idx >= 0 (idx < 0 kept).
int points_remap(pts_idx n, const pts_idx* table, pts_idx* idx, void* stream);

}  // namespace shard::kernels
