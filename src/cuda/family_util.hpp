#pragma once
// Helpers shared by the CUDA kernel-family glue (src/cuda/*_cuda.cpp): device selection for the
// context's device (a restoring DeviceScope, or enter() which leaves it set and returns the
// stream), launcher / runtime error codes turned into shard::Error, stream-ordered scratch
// buffers and small host <-> device copies of double statistics (norm).
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "shardtensor/core/dtype.hpp"
#include "shardtensor/core/error.hpp"
#include "shardtensor/runtime/context.hpp"
#include "shardtensor/runtime/memory.hpp"

namespace shard::exec::cuda_glue {

/// CUDA graphs begun (DeviceRuntime::begin_capture) and not yet destroyed, in the whole process
/// (src/cuda/runtime_cuda.cpp). While one lives, caches whose buffers a graph may have captured
/// (the cuBLAS workspaces) must not free them.
int live_graphs() noexcept;

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
/// The storage dtype code of the launchers templated on the storage type (kernels/common.cuh
/// by_storage): 0 f32, 1 f64, 2 bf16, 3 f16.
inline int storage_code(DType dt) {
  return dt == DType::f64 ? 1 : dt == DType::bf16 ? 2 : dt == DType::f16 ? 3 : 0;
}

/// Throws shard::Error naming `op` for a nonzero cudaError_t code.
inline void check(int code, const char* op) {
  if (code != 0)
    SHARD_FAIL(op, "CUDA error {} ({})", code, cudaGetErrorString(static_cast<cudaError_t>(code)));
}

/// Makes the context's device current and returns its stream.
inline cudaStream_t enter(ExecContext& ctx, const char* op) {
  check(static_cast<int>(cudaSetDevice(ctx.device().index)), op);
  return static_cast<cudaStream_t>(ctx.stream().handle);
}

/// Device scratch of n elements of T, allocated and freed in stream order (cudaMallocAsync).
template <class T>
class Scratch {
 public:
  Scratch(std::size_t n, cudaStream_t s, const char* op) : s_(s) {
    if (n > 0) check(static_cast<int>(cudaMallocAsync(reinterpret_cast<void**>(&p_), n * sizeof(T), s)), op);
  }
  ~Scratch() {
    if (p_) cudaFreeAsync(p_, s_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  cudaStream_t s_;
};

/// Copies n doubles host -> device on `s` (the host buffer may be reused on return).
inline void upload(double* dst, const double* src, std::size_t n, cudaStream_t s, const char* op) {
  if (n > 0 && src) check(static_cast<int>(cudaMemcpyAsync(dst, src, n * sizeof(double), cudaMemcpyHostToDevice, s)), op);
}
/// Copies n doubles device -> host and waits for the stream.
inline void download(double* dst, const double* src, std::size_t n, cudaStream_t s, const char* op) {
  if (n > 0 && dst) check(static_cast<int>(cudaMemcpyAsync(dst, src, n * sizeof(double), cudaMemcpyDeviceToHost, s)), op);
  check(static_cast<int>(cudaStreamSynchronize(s)), op);
}


/// Memory for one call from the caching allocator, tagged with ctx's stream: ctx is made current
/// while the block is taken and while it is given back (the allocator orders a block by the
/// thread's current context's stream), so the block is reused only by work queued after this
/// call's. Null for 0 bytes. Used for cuDNN workspaces and scratch (conv, fused attention).
class CallWorkspace {
 public:
  CallWorkspace(std::size_t bytes, ExecContext& ctx) : ctx_(ctx) {
    if (bytes == 0) return;
    const ContextGuard guard(ctx_);
    mem_ = allocate_bytes(bytes, ctx_.device());
  }
  ~CallWorkspace() {
    if (!mem_) return;
    try {
      const ContextGuard guard(ctx_);
      mem_.reset();  // parked on ctx's stream: reused only by work queued after this call's
    } catch (...) {
      mem_.reset();
    }
  }
  CallWorkspace(const CallWorkspace&) = delete;
  CallWorkspace& operator=(const CallWorkspace&) = delete;
  void* get() const { return mem_.get(); }

 private:
  ExecContext& ctx_;
  std::shared_ptr<void> mem_;
};

}  // namespace shard::exec::cuda_glue
