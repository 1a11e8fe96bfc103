#pragma once
// Kernel firewall of the resize family (kernels/resize.cu): plain C++17, no shardtensor headers.
// Launchers enqueue on `stream`, return a cudaError_t code (0 = success), do not synchronise.
// Device pointers; code: the storage dtype (0 f32, 1 f64, 2 bf16, 3 f16; bf16 / f16 results bit
// for bit the f32 kernels' rounded once more); mode: 0 nearest, 1 (bi/tri)linear, 2 cubic. Geometry as
// include/shardtensor/exec/resize.hpp (checked by the caller). The adjoint gathers per input
// cell in double (no atomics).
#include <cstdint>

namespace shard::kernels::resize {

using idx = std::int64_t;

/// Block geometry of a resampling launch (scale[d] 0: the general map global_out / ratio).
struct Geom {
  idx planes;
  idx scale[3], global_in[3], in_lo[3], in_len[3], out_lo[3], out_len[3];
  idx global_out[3];
  double ratio[3];
  int align_corners;
};

int forward(int code, int mode, const Geom& g, const void* x, void* y, void* stream);
int backward(int code, int mode, const Geom& g, const void* gy, void* gx, void* stream);

}  // namespace shard::kernels::resize
