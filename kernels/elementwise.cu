// Elementwise CUDA kernels behind Tensor's device entry points: strided copy, fill, axpby, mul,
// sum. Launchers take a stream and return cudaError_t. They are stream-ordered like every other
// kernel of the library (they used to synchronise the stream, which cost a host round trip per
// concat, gradient accumulation and clone, and broke CUDA graph capture); only sum, whose value
// goes to the host, waits for its stream. Built into shardtensor::cuda; host glue in
// src/cuda/tensor_ops_cuda.cpp. The sum is deterministic: per-block fixed-order trees into a
// partials array, then one fixed-order final pass (no floating-point atomics).
#include <cuda_runtime.h>

#include <cstring>

#include "common.cuh"
#include "kernels_api.hpp"

namespace shard::kernels {
namespace {

using namespace cu;

constexpr gidx kSumBlocks = 1024;  ///< partial sums of sum(): at most this many blocks

struct StridedDesc {
  int rank;
  idx shape[kMaxRank];
  idx src_stride[kMaxRank];
  idx dst_stride[kMaxRank];
};

template <class T>
__global__ void strided_copy_kernel(StridedDesc d, idx n, const T* __restrict__ src, T* __restrict__ dst) {
  SHARD_GRID_STRIDE(lin, n) {
    idx rem = lin, so = 0, doff = 0;
    for (int k = d.rank - 1; k >= 0; --k) {
      const idx i = rem % d.shape[k];
      rem /= d.shape[k];
      so += i * d.src_stride[k];
      doff += i * d.dst_stride[k];
    }
    dst[doff] = src[so];
  }
}
template <class T> __global__ void fill_kernel(T* dst, idx n, T v) { SHARD_GRID_STRIDE(i, n) dst[i] = v; }
template <class T> __global__ void axpby_kernel(idx n, T alpha, const T* x, T beta, T* y) {
  SHARD_GRID_STRIDE(i, n) y[i] = alpha * x[i] + beta * y[i];
}
template <class T> __global__ void mul_kernel(idx n, const T* a, const T* b, T* out) {
  SHARD_GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}
template <class T> __global__ void sum_partial_kernel(idx n, const T* x, double* part) {
  __shared__ double buf[kThreads];
  double s = 0;
  SHARD_GRID_STRIDE(i, n) s += static_cast<double>(x[i]);
  buf[threadIdx.x] = s;
  block_tree(buf);
  if (threadIdx.x == 0) part[blockIdx.x] = buf[0];
}
__global__ void sum_final_kernel(idx parts, const double* part, double* out) {
  __shared__ double buf[kThreads];
  double s = 0;
  for (idx i = threadIdx.x; i < parts; i += blockDim.x) s += part[i];
  buf[threadIdx.x] = s;
  block_tree(buf);
  if (threadIdx.x == 0) *out = buf[0];
}

int finish(void* stream) {
  (void)stream;
  return last_error();
}
}  // namespace

int strided_copy(int elem_bytes, int rank, const idx* shape, const void* src, const idx* src_strides, void* dst,
                 const idx* dst_strides, void* stream) {
  if (rank < 0 || rank > kMaxRank) return invalid();
  StridedDesc d{};
  d.rank = rank;
  idx n = 1;
  for (int k = 0; k < rank; ++k) {
    d.shape[k] = shape[k];
    d.src_stride[k] = src_strides[k];
    d.dst_stride[k] = dst_strides[k];
    n *= shape[k];
  }
  if (n == 0) return 0;
  const int rc = by_width(elem_bytes, [&](auto t) {
    using U = decltype(t);
    strided_copy_kernel<U><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(d, n, static_cast<const U*>(src),
                                                                            static_cast<U*>(dst));
    return 0;
  });
  return rc ? rc : finish(stream);
}

int fill(int elem_bytes, void* dst, idx n, const void* value, void* stream) {
  if (n == 0) return 0;
  const int rc = by_width(elem_bytes, [&](auto t) {
    using U = decltype(t);
    U v;
    std::memcpy(&v, value, sizeof(U));
    fill_kernel<U><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(static_cast<U*>(dst), n, v);
    return 0;
  });
  return rc ? rc : finish(stream);
}

int axpby(int is_f64, idx n, double alpha, const void* x, double beta, void* y, void* stream) {
  if (n == 0) return 0;
  by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
    axpby_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(n, static_cast<T>(alpha), static_cast<const T*>(x),
                                                                     static_cast<T>(beta), static_cast<T*>(y));
    return 0;
  });
  return finish(stream);
}

int mul(int is_f64, idx n, const void* a, const void* b, void* out, void* stream) {
  if (n == 0) return 0;
  by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
    mul_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(n, static_cast<const T*>(a),
                                                                   static_cast<const T*>(b), static_cast<T*>(out));
    return 0;
  });
  return finish(stream);
}

int sum(int is_f64, idx n, const void* x, double* host_out, void* stream) {
  *host_out = 0;
  if (n == 0) return 0;
  cudaStream_t st = as_stream(stream);
  const unsigned blocks = grid_for(n, kThreads, kSumBlocks);
  const std::size_t bytes = (static_cast<std::size_t>(blocks) + 1) * sizeof(double);
  return with_stream_scratch(bytes, st, [&](void* scratch) {
    auto* ws = static_cast<double*>(scratch);
    by_float_type(is_f64, [&](auto t) {
      using T = decltype(t);
      sum_partial_kernel<T><<<blocks, kThreads, 0, st>>>(n, static_cast<const T*>(x), ws);
      return 0;
    });
    sum_final_kernel<<<1, kThreads, 0, st>>>(blocks, ws, ws + blocks);
    const int rc = last_error();
    return rc ? rc : static_cast<int>(cudaMemcpyAsync(host_out, ws + blocks, sizeof(double), cudaMemcpyDeviceToHost, st));
  });
}

const char* error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace shard::kernels
