// Elementwise CUDA kernels behind Tensor's device entry points: strided copy, fill, axpby, mul,
// sum. Launchers take a stream, return cudaError_t, and synchronise the stream before returning.
// Built into shardtensor::cuda; host glue in src/cuda/tensor_ops_cuda.cpp.
#include <cuda_runtime.h>

#include <cstring>

#include "kernels_api.hpp"

namespace shard::kernels {
namespace {

struct StridedDesc {
  int rank;
  idx shape[kMaxRank];
  idx src_stride[kMaxRank];
  idx dst_stride[kMaxRank];
};

#define SHARD_GRID_LOOP(i, n) \
  for (idx i = blockIdx.x * static_cast<idx>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<idx>(gridDim.x) * blockDim.x)

template <class T>
__global__ void strided_copy_kernel(StridedDesc d, idx n, const T* __restrict__ src, T* __restrict__ dst) {
  SHARD_GRID_LOOP(lin, n) {
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
template <class T> __global__ void fill_kernel(T* dst, idx n, T v) { SHARD_GRID_LOOP(i, n) dst[i] = v; }
template <class T> __global__ void axpby_kernel(idx n, T alpha, const T* x, T beta, T* y) {
  SHARD_GRID_LOOP(i, n) y[i] = alpha * x[i] + beta * y[i];
}
template <class T> __global__ void mul_kernel(idx n, const T* a, const T* b, T* out) {
  SHARD_GRID_LOOP(i, n) out[i] = a[i] * b[i];
}
template <class T> __global__ void sum_kernel(idx n, const T* x, double* out) {
  __shared__ double buf[256];
  double s = 0;
  SHARD_GRID_LOOP(i, n) s += static_cast<double>(x[i]);
  buf[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, buf[0]);
}

int grid_for(idx n) {
  const idx g = (n + 255) / 256;
  return static_cast<int>(g < 4096 ? (g < 1 ? 1 : g) : 4096);
}
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
int finish(void* stream) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return static_cast<int>(e);
  return static_cast<int>(cudaStreamSynchronize(as_stream(stream)));
}
template <class F> int by_width(int bytes, F&& f) {
  switch (bytes) {
    case 1: f(std::uint8_t{}); return 0;
    case 2: f(std::uint16_t{}); return 0;
    case 4: f(std::uint32_t{}); return 0;
    case 8: f(std::uint64_t{}); return 0;
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}
}  // namespace

int strided_copy(int elem_bytes, int rank, const idx* shape, const void* src, const idx* src_strides, void* dst,
                 const idx* dst_strides, void* stream) {
  if (rank > kMaxRank) return static_cast<int>(cudaErrorInvalidValue);
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
  int rc = by_width(elem_bytes, [&](auto t) {
    using U = decltype(t);
    strided_copy_kernel<U><<<grid_for(n), 256, 0, as_stream(stream)>>>(d, n, static_cast<const U*>(src),
                                                                       static_cast<U*>(dst));
  });
  return rc ? rc : finish(stream);
}

int fill(int elem_bytes, void* dst, idx n, const void* value, void* stream) {
  if (n == 0) return 0;
  int rc = by_width(elem_bytes, [&](auto t) {
    using U = decltype(t);
    U v;
    std::memcpy(&v, value, sizeof(U));
    fill_kernel<U><<<grid_for(n), 256, 0, as_stream(stream)>>>(static_cast<U*>(dst), n, v);
  });
  return rc ? rc : finish(stream);
}

int axpby(int is_f64, idx n, double alpha, const void* x, double beta, void* y, void* stream) {
  if (n == 0) return 0;
  if (is_f64)
    axpby_kernel<double><<<grid_for(n), 256, 0, as_stream(stream)>>>(n, alpha, static_cast<const double*>(x), beta,
                                                                     static_cast<double*>(y));
  else
    axpby_kernel<float><<<grid_for(n), 256, 0, as_stream(stream)>>>(n, static_cast<float>(alpha),
                                                                    static_cast<const float*>(x),
                                                                    static_cast<float>(beta), static_cast<float*>(y));
  return finish(stream);
}

int mul(int is_f64, idx n, const void* a, const void* b, void* out, void* stream) {
  if (n == 0) return 0;
  if (is_f64)
    mul_kernel<double><<<grid_for(n), 256, 0, as_stream(stream)>>>(n, static_cast<const double*>(a),
                                                                   static_cast<const double*>(b),
                                                                   static_cast<double*>(out));
  else
    mul_kernel<float><<<grid_for(n), 256, 0, as_stream(stream)>>>(n, static_cast<const float*>(a),
                                                                  static_cast<const float*>(b),
                                                                  static_cast<float*>(out));
  return finish(stream);
}

int sum(int is_f64, idx n, const void* x, double* host_out, void* stream) {
  *host_out = 0;
  if (n == 0) return 0;
  cudaStream_t st = as_stream(stream);
  double* d_out = nullptr;
  // Stream-ordered scratch (no device-wide sync); plain cudaMalloc where pools are unsupported.
  bool pooled = true;
  cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&d_out), sizeof(double), st);
  if (e != cudaSuccess) {
    cudaGetLastError();
    pooled = false;
    e = cudaMalloc(reinterpret_cast<void**>(&d_out), sizeof(double));
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  cudaMemsetAsync(d_out, 0, sizeof(double), st);
  if (is_f64) sum_kernel<double><<<grid_for(n), 256, 0, st>>>(n, static_cast<const double*>(x), d_out);
  else sum_kernel<float><<<grid_for(n), 256, 0, st>>>(n, static_cast<const float*>(x), d_out);
  int rc = static_cast<int>(cudaGetLastError());
  if (rc == 0) rc = static_cast<int>(cudaMemcpyAsync(host_out, d_out, sizeof(double), cudaMemcpyDeviceToHost, st));
  if (pooled) cudaFreeAsync(d_out, st);
  const int rs = static_cast<int>(cudaStreamSynchronize(st));
  if (!pooled) cudaFree(d_out);
  return rc ? rc : rs;
}

const char* error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace shard::kernels
