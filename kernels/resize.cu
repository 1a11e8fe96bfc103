// Resize kernel family on CUDA (f32, f64 and the bf16 / f16 storage types): nearest,
// (bi/tri)linear and cubic resampling of a block of a global grid (integer factors or the general
// map: non-integer scales, explicit sizes, align_corners), forward and adjoint (see
// src/kernels_api/resize.hpp). The source taps use the CPU's formulas (src/exec/resize_kernels.hpp);
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
struct CTap {
  idx i[4];
  double w[4];
};

__device__ inline idx axis_out(const Geom& g, int d) {
  return g.scale[d] > 0 ? g.scale[d] * g.global_in[d] : g.global_out[d];
}

/// PyTorch's area_pixel_compute_source_index of global output go in dim d (before linear's clamp).
__device__ inline double source_coord(const Geom& g, int d, idx go) {
  const idx G = g.global_in[d], Go = axis_out(g, d);
  if (g.align_corners)
    return Go > 1 ? static_cast<double>(G - 1) / static_cast<double>(Go - 1) * static_cast<double>(go) : 0.0;
  if (g.scale[d] > 0) return (static_cast<double>(go) + 0.5) / static_cast<double>(g.scale[d]) - 0.5;
  return g.ratio[d] * (static_cast<double>(go) + 0.5) - 0.5;
}

/// Taps of block-relative output o in dim d (nearest / linear), relative to the block's first input.
__device__ inline Tap tap(const Geom& g, int linear, int d, idx o) {
  const idx G = g.global_in[d], go = g.out_lo[d] + o;
  Tap t;
  if (!linear) {
    idx i;
    if (g.scale[d] > 0) {
      i = go / g.scale[d];
    } else {  // PyTorch: min(floorf(o * (float) scale), G - 1), in float
      i = static_cast<idx>(floorf(static_cast<float>(go) * static_cast<float>(g.ratio[d])));
      if (i > G - 1) i = G - 1;
    }
    t = {i, i, 1.0, 0.0};
  } else {
    double src = source_coord(g, d, go);
    if (src < 0.0) src = 0.0;
    idx i0 = static_cast<idx>(src);
    if (i0 > G - 1) i0 = G - 1;
    const idx i1 = i0 + 1 < G - 1 ? i0 + 1 : G - 1;
    double l1 = src - static_cast<double>(i0);
    if (l1 > 1.0) l1 = 1.0;
    t = {i0, i1, 1.0 - l1, l1};
  }
  t.i0 -= g.in_lo[d];
  t.i1 -= g.in_lo[d];
  return t;
}

__device__ inline double cubic1(double x) {
  const double A = -0.75;
  return ((A + 2) * x - (A + 3)) * x * x + 1;
}
__device__ inline double cubic2(double x) {
  const double A = -0.75;
  return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
}

/// Cubic taps of block-relative output o in dim d (as src/exec/resize_kernels.hpp's resize_cubic_tap).
__device__ inline CTap ctap(const Geom& g, int d, idx o) {
  const idx G = g.global_in[d];
  const double src = source_coord(g, d, g.out_lo[d] + o);
  idx i = static_cast<idx>(floor(src));
  if (i > G - 1) i = G - 1;
  double t = src - static_cast<double>(i);
  t = t < 0.0 ? 0.0 : (t > 1.0 ? 1.0 : t);
  CTap c;
  c.w[0] = cubic2(t + 1.0);
  c.w[1] = cubic1(t);
  const double t2 = 1.0 - t;
  c.w[2] = cubic1(t2);
  c.w[3] = cubic2(t2 + 1.0);
  for (int k = 0; k < 4; ++k) {
    idx j = i - 1 + k;
    j = j < 0 ? 0 : (j > G - 1 ? G - 1 : j);
    c.i[k] = j - g.in_lo[d];
  }
  return c;
}

/// Weight with which block-relative output o reads block-relative input i in dim d (0: none).
__device__ inline double weight(const Geom& g, int linear, int d, idx o, idx i, double* second) {
  const Tap t = tap(g, linear, d, o);
  *second = (linear && t.i1 == i && t.w1 != 0.0) ? t.w1 : 0.0;
  return t.i0 == i ? t.w0 : 0.0;
}

/// First and last block-relative input that block-relative output o reads in dim d.
__device__ inline void read_bounds(const Geom& g, int mode, int d, idx o, idx* first, idx* last) {
  if (mode == 2) {
    const CTap c = ctap(g, d, o);
    *first = c.i[0];
    *last = c.i[3];
  } else {
    const Tap t = tap(g, mode, d, o);
    *first = t.i0;
    *last = mode ? t.i1 : t.i0;
  }
}

/// Block-relative outputs [lo, hi) that may read block-relative input i in dim d.
__device__ inline void reader_range(const Geom& g, int mode, int d, idx i, idx* lo, idx* hi) {
  if (g.scale[d] > 0 && !g.align_corners && mode != 2) {  // integer factors: closed form
    const int linear = mode;
    const idx f = g.scale[d], gi = g.in_lo[d] + i;
    idx a = linear ? (gi - 2) * f : gi * f, b = linear ? (gi + 2) * f : (gi + 1) * f;
    a -= g.out_lo[d];
    b -= g.out_lo[d];
    *lo = a > 0 ? a : 0;
    *hi = b < g.out_len[d] ? b : g.out_len[d];
    return;
  }
  // General map: the read bounds are non-decreasing in o; binary search both ends.
  idx a = 0, b = g.out_len[d];
  while (a < b) {  // first o whose last read >= i
    const idx m = a + (b - a) / 2;
    idx f0, l0;
    read_bounds(g, mode, d, m, &f0, &l0);
    if (l0 >= i) b = m;
    else a = m + 1;
  }
  *lo = a;
  b = g.out_len[d];
  while (a < b) {  // first o whose first read > i
    const idx m = a + (b - a) / 2;
    idx f0, l0;
    read_bounds(g, mode, d, m, &f0, &l0);
    if (f0 > i) b = m;
    else a = m + 1;
  }
  *hi = a;
}

/// Cubic weight of block-relative input i for output o in dim d (taps clamped onto i summed).
__device__ inline double cweight(const Geom& g, int d, idx o, idx i) {
  const CTap c = ctap(g, d, o);
  double w = 0;
  for (int k = 0; k < 4; ++k)
    if (c.i[k] == i) w += c.w[k];
  return w;
}

template <class T>
__global__ void forward_kernel(Geom g, int mode, const T* __restrict__ x, T* __restrict__ y) {
  const int linear = mode == 1;
  const idx pin = g.in_len[0] * g.in_len[1] * g.in_len[2], pout = g.out_len[0] * g.out_len[1] * g.out_len[2];
  const idx n1 = g.in_len[1], n2 = g.in_len[2];
  SHARD_GRID_STRIDE(t, g.planes * pout) {
    const idx pl = t / pout, r = t % pout, o0 = r / (g.out_len[1] * g.out_len[2]),
              o1 = (r / g.out_len[2]) % g.out_len[1], o2 = r % g.out_len[2];
    const T* xp = x + pl * pin;
    if (mode == 2) {  // cubic: 4 x 4 x 4 taps, zero weights skipped, as the CPU table
      const CTap a = ctap(g, 0, o0), b = ctap(g, 1, o1), c = ctap(g, 2, o2);
      double s = 0;
      for (int ka = 0; ka < 4; ++ka) {
        if (a.w[ka] == 0.0) continue;
        for (int kb = 0; kb < 4; ++kb) {
          if (b.w[kb] == 0.0) continue;
          const T* xr = xp + (a.i[ka] * n1 + b.i[kb]) * n2;
          double row = 0;
          for (int kc = 0; kc < 4; ++kc) row += c.w[kc] * wide(xr[c.i[kc]]);
          s += a.w[ka] * b.w[kb] * row;
        }
      }
      y[t] = narrow<T>(s);
      continue;
    }
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
__global__ void backward_kernel(Geom g, int mode, const T* __restrict__ gy, T* __restrict__ gx) {
  const int linear = mode == 1;
  const idx pin = g.in_len[0] * g.in_len[1] * g.in_len[2], pout = g.out_len[0] * g.out_len[1] * g.out_len[2];
  SHARD_GRID_STRIDE(t, g.planes * pin) {
    const idx pl = t / pin, r = t % pin, i0 = r / (g.in_len[1] * g.in_len[2]), i1 = (r / g.in_len[2]) % g.in_len[1],
              i2 = r % g.in_len[2];
    const T* gp = gy + pl * pout;
    idx lo0, hi0, lo1, hi1, lo2, hi2;
    reader_range(g, mode, 0, i0, &lo0, &hi0);
    reader_range(g, mode, 1, i1, &lo1, &hi1);
    reader_range(g, mode, 2, i2, &lo2, &hi2);
    double acc = 0;
    if (mode == 2) {
      for (idx o0 = lo0; o0 < hi0; ++o0) {
        const double wa = cweight(g, 0, o0, i0);
        if (wa == 0.0) continue;
        for (idx o1 = lo1; o1 < hi1; ++o1) {
          const double wb = cweight(g, 1, o1, i1);
          if (wb == 0.0) continue;
          const T* gr = gp + (o0 * g.out_len[1] + o1) * g.out_len[2];
          for (idx o2 = lo2; o2 < hi2; ++o2) {
            const double wc = cweight(g, 2, o2, i2);
            if (wc != 0.0) acc += wc * (wa * wb * wide(gr[o2]));
          }
        }
      }
      gx[t] = narrow<T>(acc);
      continue;
    }
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

int forward(int code, int mode, const Geom& g, const void* x, void* y, void* stream) {
  const idx n = g.planes * g.out_len[0] * g.out_len[1] * g.out_len[2];
  if (n == 0) return 0;
  return by_storage(code, [&](auto t) {
    using T = decltype(t);
    forward_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(g, mode, static_cast<const T*>(x),
                                                                      static_cast<T*>(y));
    return last_error();
  });
}

int backward(int code, int mode, const Geom& g, const void* gy, void* gx, void* stream) {
  const idx n = g.planes * g.in_len[0] * g.in_len[1] * g.in_len[2];
  if (n == 0) return 0;
  return by_storage(code, [&](auto t) {
    using T = decltype(t);
    backward_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(g, mode, static_cast<const T*>(gy),
                                                                       static_cast<T*>(gx));
    return last_error();
  });
}

}  // namespace shard::kernels::resize
