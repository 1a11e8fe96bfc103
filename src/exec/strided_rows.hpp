#pragma once
// Strided operands of the flat kernel families (pointwise, reduce). A block of rank R is walked as
// numel / inner rows of `inner` = shape[R - 1] elements; row r starts at row_offset(b, r) and
// steps by b.strides[R - 1]. The CPU tables read strided views (e.g. the interior of a user's
// halo-padded array) this way, in place; a table without strided entry points gets a contiguous
// copy from the front (materialize).
#include "shardtensor/exec/box.hpp"
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec::detail {

/// Elements per row (the innermost extent; 1 for rank 0).
inline index_t row_extent(const Block& b) { return b.rank ? b.shape[static_cast<std::size_t>(b.rank - 1)] : 1; }
/// Element step inside a row.
inline index_t row_step(const Block& b) { return b.rank ? b.strides[static_cast<std::size_t>(b.rank - 1)] : 1; }
/// Element offset of row r's first element (r < numel / row_extent).
inline index_t row_offset(const Block& b, index_t r) {
  index_t off = 0;
  for (int d = b.rank - 2; d >= 0; --d) {
    const auto u = static_cast<std::size_t>(d);
    off += (r % b.shape[u]) * b.strides[u];
    r /= b.shape[u];
  }
  return off;
}
/// A contiguous copy of b on its device (for tables that take contiguous operands only).
inline Block materialize(const Block& b, ExecContext& ctx) {
  Block c = Block::allocate(b.dtype, b.device, b.shape.data(), b.rank);
  if (b.numel() > 0) box_copy(c, b, ctx);
  return c;
}

}  // namespace shard::exec::detail
