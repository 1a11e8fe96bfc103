#pragma once
// Kernel firewall of the pool family (kernels/pool.cu): plain C++17, no shardtensor headers.
// Launchers enqueue on `stream`, return a cudaError_t code (0 = success), do not synchronise.
// Device pointers; code: the storage dtype (0 f32, 1 f64, 2 bf16, 3 f16; results of bf16 / f16
// bit for bit the f32 kernels' rounded once more). Geometry as include/shardtensor/exec/pool.hpp.
// Backward kernels gather (one thread per input cell, outputs in increasing order): no atomics.
#include <cstdint>

namespace shard::kernels::pool {

using idx = std::int64_t;

/// Pooling geometry over `planes` planes of 3 spatial dims.
struct Geom {
  idx planes;
  idx in[3], out[3], kernel[3], stride[3], pad_lo[3];
  int count_include_pad;
  idx pad_end[3];  ///< avg divisor (count_include_pad): windows clipped to it; clip_divisor = 0: the kernel volume
  int clip_divisor;
};

int avg_forward(int code, const Geom& g, const void* x, void* y, void* stream);
int avg_backward(int code, const Geom& g, const void* gy, void* gx, void* stream);
int max_forward(int code, const Geom& g, const void* x, void* y, std::int64_t* idx_out, void* stream);
int max_backward(int code, const Geom& g, const void* gy, const std::int64_t* idx_in, void* gx, void* stream);

}  // namespace shard::kernels::pool
