// Pool kernel family on CUDA (f32, f64 and the bf16 / f16 storage types): average / max pooling
// forward and backward over `planes` planes of 3 spatial dims (see src/kernels_api/pool.hpp). One
// thread per output (forward) or per input cell (backward, gather form): each thread sums in the
// same order as the CPU kernels (src/exec/pool_cpu.cpp), no atomics, deterministic. The kernels
// are templated on the storage type S (common.cuh's Storage<S>): values widen exactly, sums run in
// double (average) or in S's compute type (max gradient: the f32 route's float), each result
// rounds once more to S, so bf16 / f16 give bit for bit the f32 working-copy route.
#include <cuda_runtime.h>

#include "common.cuh"
#include "kernels_api/pool.hpp"

namespace shard::kernels::pool {
namespace {

using namespace cu;
constexpr int kBlock = kThreads;

struct Win {
  idx lo, hi;
};
/// Window of output o in dim d, clipped to the input.
__device__ inline Win window(const Geom& g, int d, idx o) {
  const idx a = o * g.stride[d] - g.pad_lo[d];
  const idx b = a + g.kernel[d];
  return {a > 0 ? a : 0, b < g.in[d] ? b : g.in[d]};
}
/// Outputs whose window covers input i in dim d: [lo, hi) clipped to [0, out).
__device__ inline Win covering(const Geom& g, int d, idx i) {
  const idx s = g.stride[d], t = i + g.pad_lo[d];
  const idx a = t - g.kernel[d] + 1;
  const idx first = a <= 0 ? 0 : (a + s - 1) / s;
  const idx last = t / s + 1;
  return {first, last < g.out[d] ? last : g.out[d]};
}

/// count_include_pad's divisor of output (o0, o1, o2): the kernel volume, or with clip_divisor
/// the window clipped to the padded domain's end (ceil mode; as the CPU table).
__device__ inline double padded_count(const Geom& g, double full, idx o0, idx o1, idx o2) {
  if (!g.clip_divisor) return full;
  const idx o[3] = {o0, o1, o2};
  double c = 1;
  for (int d = 0; d < 3; ++d) {
    const idx a = o[d] * g.stride[d] - g.pad_lo[d];
    const idx b = a + g.kernel[d] < g.pad_end[d] ? a + g.kernel[d] : g.pad_end[d];
    c *= static_cast<double>(b - a);
  }
  return c;
}

template <class T>
__global__ void avg_forward_kernel(Geom g, const T* __restrict__ x, T* __restrict__ y) {  // T: storage type
  const idx pin = g.in[0] * g.in[1] * g.in[2], pout = g.out[0] * g.out[1] * g.out[2];
  const double full = static_cast<double>(g.kernel[0] * g.kernel[1] * g.kernel[2]);
  SHARD_GRID_STRIDE(t, g.planes * pout) {
    const idx pl = t / pout, r = t % pout, o0 = r / (g.out[1] * g.out[2]), o1 = (r / g.out[2]) % g.out[1],
              o2 = r % g.out[2];
    const T* xp = x + pl * pin;
    const Win w0 = window(g, 0, o0), w1 = window(g, 1, o1), w2 = window(g, 2, o2);
    double s = 0;
    for (idx i0 = w0.lo; i0 < w0.hi; ++i0)
      for (idx i1 = w1.lo; i1 < w1.hi; ++i1) {
        const T* xr = xp + (i0 * g.in[1] + i1) * g.in[2];
        for (idx i2 = w2.lo; i2 < w2.hi; ++i2) s += wide(xr[i2]);
      }
    const double div = g.count_include_pad
                           ? padded_count(g, full, o0, o1, o2)
                           : static_cast<double>((w0.hi - w0.lo) * (w1.hi - w1.lo) * (w2.hi - w2.lo));
    y[t] = narrow<T>(s / div);
  }
}

template <class T>
__global__ void avg_backward_kernel(Geom g, const T* __restrict__ gy, T* __restrict__ gx) {
  const idx pin = g.in[0] * g.in[1] * g.in[2], pout = g.out[0] * g.out[1] * g.out[2];
  const double full = static_cast<double>(g.kernel[0] * g.kernel[1] * g.kernel[2]);
  SHARD_GRID_STRIDE(t, g.planes * pin) {
    const idx pl = t / pin, r = t % pin, i0 = r / (g.in[1] * g.in[2]), i1 = (r / g.in[2]) % g.in[1], i2 = r % g.in[2];
    const T* gp = gy + pl * pout;
    const Win c0 = covering(g, 0, i0), c1 = covering(g, 1, i1), c2 = covering(g, 2, i2);
    double s = 0;
    for (idx o0 = c0.lo; o0 < c0.hi; ++o0)
      for (idx o1 = c1.lo; o1 < c1.hi; ++o1) {
        const T* gr = gp + (o0 * g.out[1] + o1) * g.out[2];
        for (idx o2 = c2.lo; o2 < c2.hi; ++o2) {
          double div = padded_count(g, full, o0, o1, o2);
          if (!g.count_include_pad) {
            const Win w0 = window(g, 0, o0), w1 = window(g, 1, o1), w2 = window(g, 2, o2);
            div = static_cast<double>(w0.hi - w0.lo) * static_cast<double>(w1.hi - w1.lo) *
                  static_cast<double>(w2.hi - w2.lo);
          }
          s += wide(gr[o2]) / div;
        }
      }
    gx[t] = narrow<T>(s);
  }
}

template <class T>
__device__ inline bool is_nan(T v) {
  return v != v;
}

template <class T>
__global__ void max_forward_kernel(Geom g, const T* __restrict__ x, T* __restrict__ y, std::int64_t* __restrict__ ix) {
  const idx pin = g.in[0] * g.in[1] * g.in[2], pout = g.out[0] * g.out[1] * g.out[2];
  SHARD_GRID_STRIDE(t, g.planes * pout) {
    const idx pl = t / pout, r = t % pout, o0 = r / (g.out[1] * g.out[2]), o1 = (r / g.out[2]) % g.out[1],
              o2 = r % g.out[2];
    const T* xp = x + pl * pin;
    const Win w0 = window(g, 0, o0), w1 = window(g, 1, o1), w2 = window(g, 2, o2);
    using C = typename Storage<T>::C;
    idx best = (w0.lo * g.in[1] + w1.lo) * g.in[2] + w2.lo;
    C bv = Storage<T>::load(xp[best]);  // compared widened; the stored element itself is the result
    for (idx i0 = w0.lo; i0 < w0.hi; ++i0)
      for (idx i1 = w1.lo; i1 < w1.hi; ++i1) {
        const idx rowi = (i0 * g.in[1] + i1) * g.in[2];
        for (idx i2 = w2.lo; i2 < w2.hi; ++i2) {
          const C v = Storage<T>::load(xp[rowi + i2]);
          if (v > bv || (is_nan(v) && !is_nan(bv))) {
            bv = v;
            best = rowi + i2;
          }
        }
      }
    y[t] = xp[best];
    ix[t] = best;
  }
}

template <class T>
__global__ void max_backward_kernel(Geom g, const T* __restrict__ gy, const std::int64_t* __restrict__ ix,
                                    T* __restrict__ gx) {
  const idx pin = g.in[0] * g.in[1] * g.in[2], pout = g.out[0] * g.out[1] * g.out[2];
  SHARD_GRID_STRIDE(t, g.planes * pin) {
    const idx pl = t / pin, r = t % pin, i0 = r / (g.in[1] * g.in[2]), i1 = (r / g.in[2]) % g.in[1], i2 = r % g.in[2];
    const idx base = pl * pout;
    const Win c0 = covering(g, 0, i0), c1 = covering(g, 1, i1), c2 = covering(g, 2, i2);
    using C = typename Storage<T>::C;
    C s = C(0);  // added in increasing output order, in C: the CPU scatter's order and precision
    for (idx o0 = c0.lo; o0 < c0.hi; ++o0)
      for (idx o1 = c1.lo; o1 < c1.hi; ++o1)
        for (idx o2 = c2.lo; o2 < c2.hi; ++o2) {
          const idx o = base + (o0 * g.out[1] + o1) * g.out[2] + o2;
          if (ix[o] == r) s += Storage<T>::load(gy[o]);
        }
    gx[t] = Storage<T>::store(s);
  }
}

unsigned blocks_for(idx n) { return grid_for(n, kBlock); }
idx vol(const idx* e) { return e[0] * e[1] * e[2]; }

}  // namespace

int avg_forward(int code, const Geom& g, const void* x, void* y, void* stream) {
  const idx n = g.planes * vol(g.out);
  if (n == 0) return 0;
  return by_storage(code, [&](auto t) {
    using T = decltype(t);
    avg_forward_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(g, static_cast<const T*>(x),
                                                                          static_cast<T*>(y));
    return last_error();
  });
}

int avg_backward(int code, const Geom& g, const void* gy, void* gx, void* stream) {
  const idx n = g.planes * vol(g.in);
  if (n == 0) return 0;
  return by_storage(code, [&](auto t) {
    using T = decltype(t);
    avg_backward_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(g, static_cast<const T*>(gy),
                                                                           static_cast<T*>(gx));
    return last_error();
  });
}

int max_forward(int code, const Geom& g, const void* x, void* y, std::int64_t* idx_out, void* stream) {
  const idx n = g.planes * vol(g.out);
  if (n == 0) return 0;
  return by_storage(code, [&](auto t) {
    using T = decltype(t);
    max_forward_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(g, static_cast<const T*>(x),
                                                                          static_cast<T*>(y), idx_out);
    return last_error();
  });
}

int max_backward(int code, const Geom& g, const void* gy, const std::int64_t* idx_in, void* gx, void* stream) {
  const idx n = g.planes * vol(g.in);
  if (n == 0) return 0;
  return by_storage(code, [&](auto t) {
    using T = decltype(t);
    max_backward_kernel<T><<<blocks_for(n), kBlock, 0, as_stream(stream)>>>(g, static_cast<const T*>(gy), idx_in,
                                                                           static_cast<T*>(gx));
    return last_error();
  });
}

}  // namespace shard::kernels::pool
