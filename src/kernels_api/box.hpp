#pragma once
// Kernel firewall of the `box` family (kernels/box.cu): plain C++17, no fmt, no shardtensor
// headers. Launchers are asynchronous on `stream` (a cudaStream_t; null = the default stream)
// and return a cudaError_t as int (0 = success). Shapes and strides are in elements, outermost
// dim first; strides may be negative; dst and src must not overlap.
#include <cstdint>

namespace shard::kernels {

/// Largest box rank the launchers accept.
constexpr int kBoxMaxRank = 8;

/// Element types `box_add_launch` accumulates.
enum BoxAddType : int { box_f32 = 0, box_f64 = 1, box_i32 = 2, box_i64 = 3, box_c64 = 4, box_c128 = 5,
                     box_bf16 = 6, box_f16 = 7 };

/// dst = src over the box `shape` (elements of `elem_bytes` bytes: 1, 2, 4, 8 or 16).
int box_copy_launch(int elem_bytes, int rank, const std::int64_t* shape, void* dst, const std::int64_t* dst_strides,
                    const void* src, const std::int64_t* src_strides, void* stream);
/// dst += src over the box `shape`.
int box_add_launch(BoxAddType type, int rank, const std::int64_t* shape, void* dst, const std::int64_t* dst_strides,
                   const void* src, const std::int64_t* src_strides, void* stream);
/// Every element of the box = the `elem_bytes` bytes at `value` (host memory, read before return).
int box_fill_launch(int elem_bytes, int rank, const std::int64_t* shape, void* dst, const std::int64_t* dst_strides,
                    const void* value, void* stream);
/// Message for a launcher's error code.
const char* box_error_string(int code);

}  // namespace shard::kernels
