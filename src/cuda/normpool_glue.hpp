#pragma once
// Shared helpers of the norm / pool / resize / gemm CUDA glue (src/cuda/{norm,pool,resize,gemm}_cuda.cpp):
// error checks, the context's device and stream, stream-ordered scratch buffers.
#include <cuda_runtime.h>

#include <cstddef>

#include "shardtensor/core/error.hpp"
#include "shardtensor/exec/context.hpp"

namespace shard::cuda_glue {

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

}  // namespace shard::cuda_glue
