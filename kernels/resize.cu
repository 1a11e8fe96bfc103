// Resize kernel family on CUDA (f32, f64 and the bf16 / f16 storage types): nearest and
// (bi/tri)linear upsampling of a block of a global grid, forward and adjoint (see
// src/kernels_api/resize.hpp). The source taps use the CPU's formula (src/exec/resize_kernels.hpp);
// forward evaluates the same expression as the CPU kernel; the adjoint gathers per input cell in
// double over the outputs that read it (no atomics, deterministic). Templated on the storage type
// S (common.cuh's Storage<S>): values widen exactly and each result rounds double -> float -> S,
// so bf16 / f16 give bit for bit the f32 working-copy route.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/resize.hpp"

namespace shard::kernels::resize {
namespace {

using namespace cu;
constexpr int kBlock = kThreads;

struct Tap {
  idx i0, i1;
  double w0, w1;
};

/// Taps of block-relative output o in dim d, relative to the block's first input.
__device__ inline Tap tap(const Geom& g, int linear, int d, idx o) {
  const idx f = g.scale[d], G = g.global_in[d], go = g.out_lo[d] + o;
  Tap t;
  if (!linear) {
    t = {go / f, go / f, 1.0, 0.0};
  } else {
    double src = (static_cast<double>(go) + 0.5) / static_cast<double>(f) - 0.5;
    if (src < 0.0) src = 0.0;
    idx i0 = static_cast<idx>(src);
    if (i0 > G - 1) i0 = G - 1;
    const idx i1 = i0 + 1 < G - 1 ? i0 + 1 : G - 1;
    const double l1 = src - static_cast<double>(i0);
    t = {i0, i1, 1.0 - l1, l1};
  }
  t.i0 -= g.in_lo[d];
  t.i1 -= g.in_lo[d];
  return t;
}

/// Weight with which block-relative output o reads block-relative input i in dim d (0: none).
__device__ inline double weight(const Geom& g, int linear, int d, idx o, idx i, double* second) {
  const Tap t = tap(g, linear, d, o);
  *second = (linear && t.i1 == i && t.w1 != 0.0) ? t.w1 : 0.0;
  return t.i0 == i ? t.w0 : 0.0;
}

/// Block-relative outputs [lo, hi) that may read block-relative input i in dim d.
__device__ inline void reader_range(const Geom& g, int linear, int d, idx i, idx* lo, idx* hi) {
  const idx f = g.scale[d], gi = g.in_lo[d] + i;
  idx a = linear ? (gi - 2) * f : gi * f, b = linear ? (gi + 2) * f : (gi + 1) * f;
  a -= g.out_lo[d];
  b -= g.out_lo[d];
  *lo = a > 0 ? a : 0;
  *hi = b < g.out_len[d] ? b : g.out_len[d];
}

template <class T>
__global__ void forward_kernel(Geom g, int linear, const T* __restrict__ x, T* __restrict__ y) {
  const idx pin = g.in_len[0] * g.in_len[1] * g.in_len[2], pout = g.out_len[0] * g.out_len[1] * g.out_len[2];
  const idx n1 = g.in_len[1], n2 = g.in_len[2];
  SHARD_GRID_STRIDE(t, g.planes * pout) {
    const idx pl = t / pout, r = t % pout, o0 = r / (g.out_len[1] * g.out_len[2]),
              o1 = (r / g.out_len[2]) % g.out_len[1], o2 = r % g.out_len[2];
    const T* xp = x + pl * pin;
    const Tap a = tap(g, linear, 0, o0), b = tap(g, linear, 1, o1), c = tap(g, linear, 2, o2);
    const T* r00 = xp + (a.i0 * n1 + b.i0) * n2;
    if (!linear) {
      y[t] = r00[c.i0];
      continue;
    }
    const T* r01 = xp + (a.i0 * n1 + b.i1) * n2;
    const T* r10 = xp + (a.i1 * n1 + b.i0) * n2;
    const T* r11 = xp + (a.i1 * n1 + b.i1) * n2;
    const double w00 = a.w0 * b.w0, w01 = a.w0 * b.w1, w10 = a.w1 * b.w0, w11 = a.w1 * b.w1;
    const double v0 =
        c.w0 * (w00 * wide(r00[c.i0]) + w01 * wide(r01[c.i0]) + w10 * wide(r10[c.i0]) + w11 * wide(r11[c.i0]));
    const double v1 =
        c.w1 * (w00 * wide(r00[c.i1]) + w01 * wide(r01[c.i1]) + w10 * wide(r10[c.i1]) + w11 * wide(r11[c.i1]));
    y[t] = narrow<T>(v0 + v1);
  }
}

template <class T>
__global__ void backward_kernel(Geom g, int linear, const T* __restrict__ gy, T* __restrict__ gx) {
  const idx pin = g.in_len[0] * g.in_len[1] * g.in_len[2], pout = g.out_len[0] * g.out_len[1] * g.out_len[2];
  SHARD_GRID_STRIDE(t, g.planes * pin) {
    const idx pl = t / pin, r = t % pin, i0 = r / (g.in_len[1] * g.in_len[2]), i1 = (r / g.in_len[2]) % g.in_len[1],
              i2 = r % g.in_len[2];
    const T* gp = gy + pl * pout;
    idx lo0, hi0, lo1, hi1, lo2, hi2;
    reader_range(g, linear, 0, i0, &lo0, &hi0);
    reader_range(g, linear, 1, i1, &lo1, &hi1);
    reader_range(g, linear, 2, i2, &lo2, &hi2);
    double acc = 0;
    for (idx o0 = lo0; o0 < hi0; ++o0) {
      double a2;
      const double a1 = weight(g, linear, 0, o0, i0, &a2), wa = a1 + a2;
      if (wa == 0.0) continue;
      for (idx o1 = lo1; o1 < hi1; ++o1) {
        double b2;
        const double b1 = weight(g, linear, 1, o1, i1, &b2), wb = b1 + b2;
        if (wb == 0.0) continue;
        const double wab = wa * wb;
        const T* gr = gp + (o0 * g.out_len[1] + o1) * g.out_len[2];
        for (idx o2 = lo2; o2 < hi2; ++o2) {
          double c2;
          const double c1 = weight(g, linear, 2, o2, i2, &c2);
          if (c1 == 0.0 && c2 == 0.0) continue;
          const double v = wab * wide(gr[o2]);
          acc += c1 * v;
          if (c2 != 0.0) acc += c2 * v;
        }
      }
    }
    gx[t] = narrow<T>(acc);
  }
}

unsigned blocks_for(idx n) { return grid_for(n, kBlock); }

}  // namespace

int forward(int code, int linear, const Geom& g, const void* x, void* y, void* stream) {
  const idx n = g.planes * g.out_len[0] * g.out_len[1] * g.out_len[2];
  if (n == 0) return 0;
  return by_storage(code, [&](auto t) {
    using T = decltype(t);
    forward_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(g, linear, static_cast<const T*>(x),
                                                                      static_cast<T*>(y));
    return last_error();
  });
}

int backward(int code, int linear, const Geom& g, const void* gy, void* gx, void* stream) {
  const idx n = g.planes * g.in_len[0] * g.in_len[1] * g.in_len[2];
  if (n == 0) return 0;
  return by_storage(code, [&](auto t) {
    using T = decltype(t);
    backward_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(g, linear, static_cast<const T*>(gy),
                                                                       static_cast<T*>(gx));
    return last_error();
  });
}

}  // namespace shard::kernels::resize
