#pragma once
// Kernel firewall for the row family (kernels/rows.cu): plain C++17. Matrices are contiguous
// row-major [rows, width] arrays, the index vector a contiguous std::int64_t array. Launchers
// queue work on `stream` and return a cudaError_t as int (0: success), never synchronising.
// An index of -1, and (defensively: the CPU table throws on it, this side never checks or
// synchronises) any index outside [0, rows), means "no row": gather writes zeros, scatter-add
// skips it. No launcher ever reads or writes outside its matrices.
#include <cstdint>

namespace shard::kernels {

using rows_idx = std::int64_t;

/// Element types rows_scatter_add accumulates.
enum RowsAddType : int { rows_f32 = 0, rows_f64 = 1, rows_i64 = 2 };

/// dst[i, :] = index[i] in [0, n_src) ? src[index[i], :] : 0 for i < n_index; elements of
/// elem_bytes bytes (1, 2, 4, 8 or 16). src [n_src, width], dst [n_index, width].
int rows_gather(int elem_bytes, rows_idx n_src, rows_idx n_index, rows_idx width, const void* src,
                const rows_idx* index, void* dst, void* stream);

/// dst[index[i], :] = src[i, :] for i < n_index with index[i] in [0, n_dst); elements of
/// elem_bytes bytes. A repeated index must carry the same row data (which write lands is
/// unspecified). src [n_index, width], dst [n_dst, width].
int rows_scatter(int elem_bytes, rows_idx n_dst, rows_idx n_index, rows_idx width, const void* src,
                 const rows_idx* index, void* dst, void* stream);

/// dst[index[i], :] += src[i, :] for i < n_index with index[i] in [0, n_dst), with atomics (the
/// order of the additions into one row is unspecified). src [n_index, width], dst [n_dst, width].
int rows_scatter_add(RowsAddType type, rows_idx n_dst, rows_idx n_index, rows_idx width, const void* src,
                     const rows_idx* index, void* dst, void* stream);

}  // namespace shard::kernels
