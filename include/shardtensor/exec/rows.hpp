#pragma once
/// \file rows.hpp
/// Row kernel family front (issue 17): gather rows of a matrix by index, and the adjoint
/// scatter-add. The data movement of every sparse, index-driven exchange (dist/points.hpp:
/// RowExchange packs the rows each rank sends with rows_gather and accumulates returned
/// gradients with rows_scatter_add; the neighbour gather and the point<->grid ops use them too).
///
/// Blocks: `src` / `dst` are contiguous [rows, width] matrices (width in elements, >= 0), `index`
/// a contiguous [n_index] i64 vector. Index -1 means "no row": gather writes zeros, scatter-add
/// skips it. Any other index outside [0, n_src) (gather) / [0, n_dst) (scatter) is a bug of the
/// caller; the CPU table checks and throws shard::Error, the CUDA table (asynchronous, no check)
/// treats it as -1 and never reads or writes out of bounds.
///  - rows_gather: any dtype (a copy of element_size-byte elements);
///  - rows_scatter_add: f32, f64, i64 (and c64 / c128 as real pairs). The CPU table adds in index
///    order (deterministic); the CUDA table uses atomics (the order of additions to one row, and
///    so the last bits of a float sum, may vary between runs when an index repeats).
#include "shardtensor/core/shape.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

struct RowsGeometry {
  index_t n_src = 0;    ///< rows of the source matrix
  index_t n_index = 0;  ///< entries of the index vector
  index_t width = 0;    ///< elements per row
};

/// dst[i, :] = index[i] >= 0 ? src[index[i], :] : 0, for i < n_index. src [n_src, width],
/// dst [n_index, width] of src's dtype.
void rows_gather(const RowsGeometry& g, const Block& src, const Block& index, const Block& dst, ExecContext& ctx);

/// dst[index[i], :] += src[i, :] for every i < n_index with index[i] >= 0. src [n_index, width],
/// dst [n_src, width] (n_src is dst's row count here).
void rows_scatter_add(const RowsGeometry& g, const Block& src, const Block& index, const Block& dst, ExecContext& ctx);

/// dst[index[i], :] = src[i, :] for every i < n_index with index[i] >= 0 (a copy; any dtype);
/// src [n_index, width], dst [n_src, width]. An index that repeats must come with the same row
/// data each time (which copy lands is unspecified); rows no index names are left as they are.
void rows_scatter(const RowsGeometry& g, const Block& src, const Block& index, const Block& dst, ExecContext& ctx);

}  // namespace shard::exec
