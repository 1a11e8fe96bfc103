#pragma once
/// \file box.hpp
/// The strided-box engine: copy, add, fill and zero over boxes of Blocks, on the host or a
/// device. A box is a Block::slice; every function takes any strides. Dispatch goes by the
/// blocks' device to the `box` kernel family (CPU: src/exec/box_cpu.cpp; CUDA: kernels/box.cu).
/// Every dtype moves (including c64/c128); `add` needs an arithmetic dtype.
#include "shardtensor/exec/block.hpp"
#include "shardtensor/exec/context.hpp"

namespace shard::exec {

/// dst = src (same shape and dtype). Devices may differ (host <-> device copies are staged
/// through contiguous buffers); ordered on ctx's stream.
void box_copy(const Block& dst, const Block& src, ExecContext& ctx);
/// dst += src (same shape, dtype and device).
void box_add(const Block& dst, const Block& src, ExecContext& ctx);
/// Every element of dst = *value (value points at one element of dst.dtype, in host memory).
void box_fill(const Block& dst, const void* value, ExecContext& ctx);
/// Every element of dst = 0.
void box_zero(const Block& dst, ExecContext& ctx);

/// Convenience: the current context of the destination's device.
inline void box_copy(const Block& dst, const Block& src) { box_copy(dst, src, current_context(dst.device)); }
inline void box_add(const Block& dst, const Block& src) { box_add(dst, src, current_context(dst.device)); }
inline void box_zero(const Block& dst) { box_zero(dst, current_context(dst.device)); }

}  // namespace shard::exec
