// The box engine's front (include/shardtensor/exec/box.hpp): operand checks, dispatch by device
// to the `box` kernel family, and copies between devices through contiguous staging buffers.
#include "shardtensor/exec/box.hpp"

#include <array>

#include "exec/box_kernels.hpp"
#include "shardtensor/runtime/memory.hpp"
#include "shardtensor/runtime/device_runtime.hpp"
#include "shardtensor/runtime/profiler.hpp"

namespace shard::exec {

/// Keeps src/exec/box_cpu.cpp (and its registration) in every link of the front.
SHARD_KEEP_CPU_TABLE(box);

namespace {

void check_pair(const Block& dst, const Block& src, const char* op) {
  SHARD_CHECK(dst.dtype == src.dtype, op, "dtype {} (destination) != {} (source)", dst.dtype, src.dtype);
  bool same = dst.rank == src.rank;
  for (int d = 0; d < dst.rank && same; ++d)
    same = dst.shape[static_cast<std::size_t>(d)] == src.shape[static_cast<std::size_t>(d)];
  SHARD_CHECK(same, op, "box shapes differ: destination {} on {}, source {} on {}", dst.shape_vec(), dst.device,
              src.shape_vec(), src.device);
}

const BoxKernels& box_table(Device dev, const char* op) { return kernels_for<BoxKernels>(dev, op); }

ExecContext& context_for(Device dev, ExecContext& ctx) { return ctx.device() == dev ? ctx : current_context(dev); }

/// dst = src across devices: pack into a contiguous buffer on the source's device if needed,
/// one runtime copy, unpack on the destination's device if needed.
void copy_across(const Block& dst, const Block& src, ExecContext& ctx) {
  const auto& rt = cuda_runtime("box_copy");
  const Device side = dst.device.is_cuda() ? dst.device : src.device;  // the stream's device
  ExecContext& sctx = context_for(src.device, ctx);
  ExecContext& dctx = context_for(dst.device, ctx);
  ExecContext& cctx = context_for(side, ctx);
  Block s = src;
  if (!src.is_contiguous()) {
    s = Block::allocate(src.dtype, src.device, src.shape.data(), src.rank);
    box_table(src.device, "box_copy").copy(s, src, sctx);
  }
  Block d = dst.is_contiguous() ? dst : Block::allocate(dst.dtype, dst.device, dst.shape.data(), dst.rank);
  rt.copy(d.data, dst.device, s.data, src.device, dst.bytes(), cctx.stream(), /*sync=*/true);
  if (d.data != dst.data) box_table(dst.device, "box_copy").copy(dst, d, dctx);
}

}  // namespace

void box_copy(const Block& dst, const Block& src, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "box", "copy", &ctx);
  check_pair(dst, src, "box_copy");
  if (dst.numel() == 0) return;
  shard::detail::bump_version(dst.owner);  // an in-place write: saved tensors see it
  if (dst.device == src.device) return box_table(dst.device, "box_copy").copy(dst, src, context_for(dst.device, ctx));
  copy_across(dst, src, ctx);
}

void box_add(const Block& dst, const Block& src, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "box", "add", &ctx);
  check_pair(dst, src, "box_add");
  SHARD_CHECK(dst.device == src.device, "box_add", "operands on different devices: destination on {}, source on {}",
              dst.device, src.device);
  SHARD_CHECK(box_addable(dst.dtype), "box_add", "dtype {} cannot be accumulated (f32, f64, bf16, f16, c64, c128, i32, i64)",
              dst.dtype);
  if (dst.numel() == 0) return;
  shard::detail::bump_version(dst.owner);
  box_table(dst.device, "box_add").add(dst, src, context_for(dst.device, ctx));
}

void box_fill(const Block& dst, const void* value, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "box", "fill", &ctx);
  SHARD_CHECK(value != nullptr, "box_fill", "null fill value for a {} box of shape {}", dst.dtype, dst.shape_vec());
  if (dst.numel() == 0) return;
  shard::detail::bump_version(dst.owner);
  box_table(dst.device, "box_fill").fill(dst, value, context_for(dst.device, ctx));
}

void box_zero(const Block& dst, ExecContext& ctx) {
  SHARD_PROFILE_SCOPE("op", "box", "zero", &ctx);
  static constexpr std::array<unsigned char, 16> zero{};
  static_assert(sizeof(zero) >= 16, "room for the largest element");
  box_fill(dst, zero.data(), ctx);
}

}  // namespace shard::exec
