// Epilogues of the GEMM kernel family on CUDA (f32, f64, and bf16 / f16 storage computed in float):
// the bias add and the bias gradient of linear / channel_linear (see src/kernels_api/gemm.hpp). The GEMM itself is cuBLAS
// (src/cuda/gemm_cuda.cpp). The bias gradient is one block per output channel with a fixed-order
// shared-memory tree in double: no atomics, deterministic.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/gemm.hpp"

namespace shard::kernels::gemm {
namespace {

using namespace cu;
constexpr int kBlock = kThreads;

template <class T>
__global__ void add_bias_kernel(idx total, idx cout, idx S, const T* __restrict__ b, T* __restrict__ y) {
  using St = Storage<T>;
  SHARD_GRID_STRIDE(i, total) y[i] = St::store(St::load(y[i]) + St::load(b[(i / S) % cout]));
}

template <class T>
__global__ void bias_grad_kernel(idx A, idx cout, idx S, const T* __restrict__ g, T* __restrict__ db) {
  __shared__ double buf[kBlock];
  const idx n = A * S;
  for (idx o = blockIdx.x; o < cout; o += gridDim.x) {
    double acc = 0;
    for (idx j = threadIdx.x; j < n; j += blockDim.x) {
      const idx a = j / S, s = j % S;
      acc += wide(g[(a * cout + o) * S + s]);
    }
    const double total = block_sum(acc, buf);
    if (threadIdx.x == 0) db[o] = narrow<T>(total);
  }
}

}  // namespace

int add_bias(int dtype, idx A, idx cout, idx S, const void* bias, void* y, void* stream) {
  const idx total = A * cout * S;
  if (total == 0) return 0;
  return by_storage(dtype, [&](auto t) {
    using T = decltype(t);
    add_bias_kernel<T><<<grid_for(total), kBlock, 0, as_stream(stream)>>>(total, cout, S, static_cast<const T*>(bias),
                                                                          static_cast<T*>(y));
    return last_error();
  });
}

int bias_grad(int dtype, idx A, idx cout, idx S, const void* g, void* db, void* stream) {
  if (cout == 0) return 0;
  return by_storage(dtype, [&](auto t) {
    using T = decltype(t);
    bias_grad_kernel<T><<<blocks_per_item(cout), kBlock, 0, as_stream(stream)>>>(A, cout, S, static_cast<const T*>(g),
                                                                                 static_cast<T*>(db));
    return last_error();
  });
}

}  // namespace shard::kernels::gemm
