// Epilogues of the GEMM kernel family on CUDA (fp32 and fp64): the bias add and the bias gradient
// of linear / channel_linear (see src/kernels_api/gemm.hpp). The GEMM itself is cuBLAS
// (src/cuda/gemm_cuda.cpp). The bias gradient is one block per output channel with a fixed-order
// shared-memory tree in double: no atomics, deterministic.
#include <cuda_runtime.h>

#include "kernels_api/gemm.hpp"

namespace shard::kernels::gemm {
namespace {

constexpr int kBlock = 256;

template <class T>
__global__ void add_bias_kernel(idx total, idx cout, idx S, const T* __restrict__ b, T* __restrict__ y) {
  for (idx i = blockIdx.x * static_cast<idx>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<idx>(gridDim.x) * blockDim.x)
    y[i] += b[(i / S) % cout];
}

template <class T>
__global__ void bias_grad_kernel(idx A, idx cout, idx S, const T* __restrict__ g, T* __restrict__ db) {
  __shared__ double buf[kBlock];
  const idx n = A * S;
  for (idx o = blockIdx.x; o < cout; o += gridDim.x) {
    double acc = 0;
    for (idx j = threadIdx.x; j < n; j += blockDim.x) {
      const idx a = j / S, s = j % S;
      acc += static_cast<double>(g[(a * cout + o) * S + s]);
    }
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
      if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) db[o] = static_cast<T>(buf[0]);
    __syncthreads();
  }
}

unsigned blocks_for(idx n) {
  const idx b = (n + kBlock - 1) / kBlock;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

int add_bias(int is_f64, idx A, idx cout, idx S, const void* bias, void* y, void* stream) {
  const idx total = A * cout * S;
  if (total == 0) return 0;
  if (is_f64)
    add_bias_kernel<double><<<blocks_for(total), kBlock, 0, as_stream(stream)>>>(
        total, cout, S, static_cast<const double*>(bias), static_cast<double*>(y));
  else
    add_bias_kernel<float><<<blocks_for(total), kBlock, 0, as_stream(stream)>>>(
        total, cout, S, static_cast<const float*>(bias), static_cast<float*>(y));
  return static_cast<int>(cudaGetLastError());
}

int bias_grad(int is_f64, idx A, idx cout, idx S, const void* g, void* db, void* stream) {
  if (cout == 0) return 0;
  const unsigned grid = static_cast<unsigned>(cout > (1 << 30) ? (1 << 30) : cout);
  if (is_f64)
    bias_grad_kernel<double><<<grid, kBlock, 0, as_stream(stream)>>>(A, cout, S, static_cast<const double*>(g),
                                                                    static_cast<double*>(db));
  else
    bias_grad_kernel<float><<<grid, kBlock, 0, as_stream(stream)>>>(A, cout, S, static_cast<const float*>(g),
                                                                   static_cast<float*>(db));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace shard::kernels::gemm
