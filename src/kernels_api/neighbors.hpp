#pragma once
// Kernel firewall for the neighbour-search family (kernels/neighbors.cu): plain C++17. Points are
// contiguous row-major [n, dim] arrays of float (is_f64 = 0) or double; lists are [n_query, width]
// (indices std::int64_t, dist2 the points' type), padded with -1 / +inf. Launchers queue work on
// `stream` and return a cudaError_t as int (0: success), never synchronising.
#include <cstdint>

namespace shard::kernels {

using nb_idx = std::int64_t;

/// Largest point dimension the search launcher accepts (one support point must fit in the
/// shared-memory tile); a larger dim returns cudaErrorInvalidValue.
constexpr int kNeighborsMaxDim = 4096;

/// The `width` best support points of every query in (d2, index) order among those with
/// d2 <= r2 (r2 = +inf: kNN); reported indices are the support row + index_offset; counts (may be
/// null) gets the valid entries of each row. Requires n_support <= INT32_MAX. nan_flag: a device
/// int the launcher sets to 1 (never clears) when a query or support coordinate is NaN.
int neighbors_search(int is_f64, nb_idx n_query, nb_idx n_support, int dim, nb_idx width, double r2,
                     nb_idx index_offset, const void* query, const void* support, nb_idx* indices, void* dist2,
                     nb_idx* counts, int* nan_flag, void* stream);

/// Merges the candidate rows into the running rows (see exec::neighbors_merge): the merged rows
/// go to out_indices / out_dist2 (device buffers of [n_query, width], distinct from the inputs);
/// counts (may be null) gets the merged valid counts.
int neighbors_merge(int is_f64, nb_idx n_query, nb_idx width, const nb_idx* indices, const void* dist2,
                    const nb_idx* cand_indices, const void* cand_dist2, nb_idx* out_indices, void* out_dist2,
                    nb_idx* counts, void* stream);

}  // namespace shard::kernels
