// CUDA kernels of the spectral family (launchers: src/kernels_api/spectral.hpp): the per-mode
// channel mix of an FNO layer. One thread per output element sums over the contracted channel
// (or the batch, for the weight gradient) in a fixed order, the same order as the CPU table
// (src/exec/spectral_cpu.cpp), with the mode index fastest so that neighbouring threads read
// neighbouring modes.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/spectral.hpp"

namespace shard::kernels {
namespace {

using idx = sp_idx;
using namespace cu;

/// y[b, o, k] = sum_i x[b, i, k] * w[i, o, k]; element t = (b * O + o) * K + k.
template <class T>
__global__ void forward_kernel(idx B, idx I, idx O, idx K, const T* __restrict__ x, const T* __restrict__ w,
                               T* __restrict__ y) {
  SHARD_GRID_STRIDE(t, B * O * K) {
    const idx k = t % K, o = (t / K) % O, b = t / (K * O);
    T re = 0, im = 0;
    for (idx i = 0; i < I; ++i) {
      const T* xp = x + 2 * ((b * I + i) * K + k);
      const T* wp = w + 2 * ((i * O + o) * K + k);
      re += xp[0] * wp[0] - xp[1] * wp[1];
      im += xp[0] * wp[1] + xp[1] * wp[0];
    }
    y[2 * t] = re;
    y[2 * t + 1] = im;
  }
}

/// gx[b, i, k] = sum_o gy[b, o, k] * conj(w[i, o, k]); element t = (b * I + i) * K + k.
template <class T>
__global__ void grad_x_kernel(idx B, idx I, idx O, idx K, const T* __restrict__ w, const T* __restrict__ gy,
                              T* __restrict__ gx) {
  SHARD_GRID_STRIDE(t, B * I * K) {
    const idx k = t % K, i = (t / K) % I, b = t / (K * I);
    T re = 0, im = 0;
    for (idx o = 0; o < O; ++o) {
      const T* gp = gy + 2 * ((b * O + o) * K + k);
      const T* wp = w + 2 * ((i * O + o) * K + k);
      re += gp[0] * wp[0] + gp[1] * wp[1];
      im += gp[1] * wp[0] - gp[0] * wp[1];
    }
    gx[2 * t] = re;
    gx[2 * t + 1] = im;
  }
}

/// gw[i, o, k] = sum_b conj(x[b, i, k]) * gy[b, o, k]; element t = (i * O + o) * K + k.
template <class T>
__global__ void grad_w_kernel(idx B, idx I, idx O, idx K, const T* __restrict__ x, const T* __restrict__ gy,
                              T* __restrict__ gw) {
  SHARD_GRID_STRIDE(t, I * O * K) {
    const idx k = t % K, o = (t / K) % O, i = t / (K * O);
    T re = 0, im = 0;
    for (idx b = 0; b < B; ++b) {
      const T* xp = x + 2 * ((b * I + i) * K + k);
      const T* gp = gy + 2 * ((b * O + o) * K + k);
      re += xp[0] * gp[0] + xp[1] * gp[1];
      im += xp[0] * gp[1] - xp[1] * gp[0];
    }
    gw[2 * t] = re;
    gw[2 * t + 1] = im;
  }
}

}  // namespace

int spectral_forward(int is_f64, idx B, idx I, idx O, idx K, const void* x, const void* w, void* y, void* stream) {
  const idx n = B * O * K;
  if (n <= 0) return 0;
  return by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
    forward_kernel<T><<<grid_for(n), kThreads, 0, as_stream(stream)>>>(
        B, I, O, K, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y));
    return last_error();
  });
}

int spectral_backward(int is_f64, idx B, idx I, idx O, idx K, const void* x, const void* w, const void* gy, void* gx,
                      void* gw, void* stream) {
  return by_float_type(is_f64, [&](auto t) {
    using T = decltype(t);
    if (gx && B * I * K > 0)
      grad_x_kernel<T><<<grid_for(B * I * K), kThreads, 0, as_stream(stream)>>>(
          B, I, O, K, static_cast<const T*>(w), static_cast<const T*>(gy), static_cast<T*>(gx));
    if (gw && I * O * K > 0)
      grad_w_kernel<T><<<grid_for(I * O * K), kThreads, 0, as_stream(stream)>>>(
          B, I, O, K, static_cast<const T*>(x), static_cast<const T*>(gy), static_cast<T*>(gw));
    return last_error();
  });
}

}  // namespace shard::kernels
