#pragma once
// Helpers shared by the CUDA kernel-family glue (src/cuda/*_cuda.cpp): device selection for the
// context's device and launcher error codes turned into shard::Error naming the op and device.
#include <cuda_runtime.h>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/exec/context.hpp"

namespace shard::exec::cuda_glue {

/// Makes the context's device current for a scope (restores the previous one).
class DeviceScope {
 public:
  DeviceScope(const ExecContext& ctx, const char* op) {
    SHARD_CHECK(ctx.device().is_cuda(), op, "a CUDA kernel was given a context on {}", ctx.device());
    cudaGetDevice(&prev_);
    if (prev_ != ctx.device().index) {
      const cudaError_t e = cudaSetDevice(ctx.device().index);
      SHARD_CHECK(e == cudaSuccess, op, "cudaSetDevice({}) failed: {}", ctx.device().index, cudaGetErrorString(e));
      set_ = true;
    }
  }
  ~DeviceScope() {
    if (set_) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
  bool set_ = false;
};

/// Throws shard::Error naming `op` and the device unless rc == cudaSuccess.
inline void check_rc(int rc, const char* op, const ExecContext& ctx) {
  SHARD_CHECK(rc == 0, op, "CUDA kernel failed on {}: {}", ctx.device(),
              cudaGetErrorString(static_cast<cudaError_t>(rc)));
}

/// 1 for f64, 0 for f32 (the fronts admit only these).
inline int is_f64(DType dt) { return dt == DType::f64 ? 1 : 0; }

}  // namespace shard::exec::cuda_glue
