// CUDA kernels of the row family (launchers: src/kernels_api/rows.hpp): gather rows by index
// and the adjoint scatter-add. One thread per element of the index-ordered matrix (row i,
// column c: neighbouring threads touch neighbouring columns of one row). Scatter-add uses atomics
// (f32; f64 as a compare-and-swap loop; i64 as unsigned long long: two's complement addition is
// the same bits), so with repeated indices the order of the float additions into a row, and the
// last bits of the sum, can vary between runs; the CPU table adds in index order.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/rows.hpp"

namespace shard::kernels {
namespace {

using idx = rows_idx;
using namespace cu;

template <class E>
__global__ void gather_kernel(idx n_src, idx n_index, idx width, const E* __restrict__ src,
                              const idx* __restrict__ index, E* __restrict__ dst) {
  SHARD_GRID_STRIDE(t, n_index * width) {
    const idx i = t / width, c = t - i * width;
    const idx r = index[i];
    if (r >= 0 && r < n_src)
      dst[t] = src[r * width + c];
    else
      dst[t] = E{};
  }
}

template <class E>
__global__ void scatter_kernel(idx n_dst, idx n_index, idx width, const E* __restrict__ src,
                               const idx* __restrict__ index, E* __restrict__ dst) {
  SHARD_GRID_STRIDE(t, n_index * width) {
    const idx i = t / width, c = t - i * width;
    const idx r = index[i];
    if (r >= 0 && r < n_dst) dst[r * width + c] = src[t];
  }
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
/// f64 through a compare-and-swap loop on the bits: GPGPU-Sim (the simulator lane) has no
/// atom.add.f64. Uncontended it costs one extra load; swap in atomicAdd(double*) if a profile of
/// heavily repeated rows ever asks for it.
__device__ __forceinline__ void atomic_add(double* p, double v) {
  auto* a = reinterpret_cast<unsigned long long*>(p);
  unsigned long long old = *a, assumed;
  do {
    assumed = old;
    old = atomicCAS(a, assumed,
                    static_cast<unsigned long long>(__double_as_longlong(__dadd_rn(__longlong_as_double(
                        static_cast<long long>(assumed)), v))));
  } while (assumed != old);
}
__device__ __forceinline__ void atomic_add(long long* p, long long v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

template <class T>
__global__ void scatter_add_kernel(idx n_dst, idx n_index, idx width, const T* __restrict__ src,
                                   const idx* __restrict__ index, T* __restrict__ dst) {
  SHARD_GRID_STRIDE(t, n_index * width) {
    const idx i = t / width, c = t - i * width;
    const idx r = index[i];
    if (r >= 0 && r < n_dst) atomic_add(dst + r * width + c, src[t]);
  }
}

}  // namespace

int rows_gather(int elem_bytes, idx n_src, idx n_index, idx width, const void* src, const idx* index, void* dst,
                void* stream) {
  if (n_index <= 0 || width <= 0) return 0;
  return by_width(elem_bytes, [&](auto e) {
    using E = decltype(e);
    gather_kernel<E><<<grid_for(n_index * width), kThreads, 0, as_stream(stream)>>>(
        n_src, n_index, width, static_cast<const E*>(src), index, static_cast<E*>(dst));
    return last_error();
  });
}

int rows_scatter(int elem_bytes, idx n_dst, idx n_index, idx width, const void* src, const idx* index, void* dst,
                 void* stream) {
  if (n_index <= 0 || width <= 0) return 0;
  return by_width(elem_bytes, [&](auto e) {
    using E = decltype(e);
    scatter_kernel<E><<<grid_for(n_index * width), kThreads, 0, as_stream(stream)>>>(
        n_dst, n_index, width, static_cast<const E*>(src), index, static_cast<E*>(dst));
    return last_error();
  });
}

int rows_scatter_add(RowsAddType type, idx n_dst, idx n_index, idx width, const void* src, const idx* index,
                     void* dst, void* stream) {
  if (n_index <= 0 || width <= 0) return 0;
  const unsigned grid = grid_for(n_index * width);
  const cudaStream_t s = as_stream(stream);
  switch (type) {
    case rows_f32:
      scatter_add_kernel<float><<<grid, kThreads, 0, s>>>(n_dst, n_index, width, static_cast<const float*>(src), index,
                                                          static_cast<float*>(dst));
      break;
    case rows_f64:
      scatter_add_kernel<double><<<grid, kThreads, 0, s>>>(n_dst, n_index, width, static_cast<const double*>(src),
                                                           index, static_cast<double*>(dst));
      break;
    case rows_i64:
      scatter_add_kernel<long long><<<grid, kThreads, 0, s>>>(
          n_dst, n_index, width, static_cast<const long long*>(src), index, static_cast<long long*>(dst));
      break;
    default: return invalid();
  }
  return last_error();
}

}  // namespace shard::kernels
