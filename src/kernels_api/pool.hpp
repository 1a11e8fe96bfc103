#pragma once
// Kernel firewall of the pool family (kernels/pool.cu): plain C++17, no shardtensor headers.
// Launchers enqueue on `stream`, return a cudaError_t code (0 = success), do not synchronise.
// Device pointers; is_f64: 0 float, 1 double. Geometry as include/shardtensor/exec/pool.hpp.
// Backward kernels gather (one thread per input cell, outputs in increasing order): no atomics.
#include <cstdint>

namespace shard::kernels::pool {

using idx = std::int64_t;

/// Pooling geometry over `planes` planes of 3 spatial dims.
struct Geom {
  idx planes;
  idx in[3], out[3], kernel[3], stride[3], pad_lo[3];
  int count_include_pad;
};

int avg_forward(int is_f64, const Geom& g, const void* x, void* y, void* stream);
int avg_backward(int is_f64, const Geom& g, const void* gy, void* gx, void* stream);
int max_forward(int is_f64, const Geom& g, const void* x, void* y, std::int64_t* idx_out, void* stream);
int max_backward(int is_f64, const Geom& g, const void* gy, const std::int64_t* idx_in, void* gx, void* stream);

}  // namespace shard::kernels::pool
