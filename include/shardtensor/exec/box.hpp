#pragma once
/// \file box.hpp
/// The strided-box engine: copy, add, fill and zero over boxes of Blocks, on the host or a
/// device. A box is a Block::slice; every function takes any strides. Dispatch goes by the
/// blocks' device to the `box` kernel family (CPU: src/exec/box_cpu.cpp; CUDA: kernels/box.cu).
/// Every dtype moves (including c64/c128); `add` needs an arithmetic dtype.
#include "shardtensor/runtime/block.hpp"
#include "shardtensor/runtime/context.hpp"

namespace shard::exec {

/// The view of the box [lo, lo + len) of b (Block::slice), except that an empty box (some
/// len[d] == 0) may lie anywhere, as in the box algebra of dist/ (Box::intersect): it is a view
/// with b's data pointer and no elements.
inline Block sub_box(const Block& b, const std::vector<index_t>& lo, const std::vector<index_t>& len) {
  for (std::size_t d = 0; d < len.size(); ++d)
    if (len[d] == 0) {
      SHARD_CHECK(static_cast<int>(len.size()) == b.rank, "sub_box", "box of rank {} in a block of rank {}", len.size(),
                  b.rank);
      Block e = b;
      for (std::size_t k = 0; k < len.size(); ++k) e.shape[k] = len[k];
      return e;
    }
  return b.slice(lo, len);
}

/// dst = src (same shape and dtype). Devices may differ (host <-> device copies are staged
/// through contiguous buffers); ordered on ctx's stream.
void box_copy(const Block& dst, const Block& src, ExecContext& ctx);
/// dst += src (same shape, dtype and device).
void box_add(const Block& dst, const Block& src, ExecContext& ctx);
/// Every element of dst = *value (value points at one element of dst.dtype, in host memory).
void box_fill(const Block& dst, const void* value, ExecContext& ctx);
/// Every element of dst = 0.
void box_zero(const Block& dst, ExecContext& ctx);

/// Convenience: the calling thread's current context of the blocks' device (looked up after the
/// operand checks, so bad operands get the box op's own error).
inline void box_copy(const Block& dst, const Block& src) { box_copy(dst, src, current_context()); }
inline void box_add(const Block& dst, const Block& src) { box_add(dst, src, current_context()); }
inline void box_fill(const Block& dst, const void* value) { box_fill(dst, value, current_context()); }
inline void box_zero(const Block& dst) { box_zero(dst, current_context()); }

}  // namespace shard::exec
