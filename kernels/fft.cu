// CUDA kernels of the fft family (launchers: src/kernels_api/fft.hpp): the output scale and the
// c2r input's real zero / Nyquist frequencies. The transforms are cuFFT's (src/cuda/fft_cuda.cpp).
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/fft.hpp"

namespace shard::kernels {
namespace {

using idx = fft_idx;
using namespace cu;

template <class T>
__global__ void scale_kernel(idx n, T s, T* __restrict__ x) {
  SHARD_GRID_STRIDE(i, n) x[i] *= s;
}

/// One thread per (outer, edge, inner) triple: edge 0 is the zero frequency, edge 1 Nyquist.
/// `x` holds interleaved (re, im) pairs.
template <class T>
__global__ void real_edges_kernel(idx outer, idx h, idx inner, int edges, T* __restrict__ x) {
  const idx n = outer * edges * inner;
  SHARD_GRID_STRIDE(t, n) {
    const idx i = t % inner;
    const idx e = (t / inner) % edges;
    const idx o = t / (inner * edges);
    const idx k = e == 0 ? 0 : h - 1;
    x[2 * ((o * h + k) * inner + i) + 1] = T(0);
  }
}

}  // namespace

int fft_scale(int is_f64, idx n, double scale, void* data, void* stream) {
  if (n <= 0) return 0;
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(n, static_cast<T>(scale), static_cast<T*>(data));
    return last_error();
  });
}

int fft_c2r_real_edges(int is_f64, idx outer, idx h, idx inner, int even, void* data, void* stream) {
  if (outer <= 0 || h <= 0 || inner <= 0) return 0;
  const int edges = even && h > 1 ? 2 : 1;
  const idx n = outer * edges * inner;
  return by_float_type(is_f64, [&](auto tag) {
    using T = decltype(tag);
    real_edges_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(outer, h, inner, edges, static_cast<T*>(data));
    return last_error();
  });
}

}  // namespace shard::kernels
