// CPU implementation of the pool kernel family (exec/pool.hpp): avg / max, forward / backward on
// 3-D-viewed planes; moved unchanged from src/tensor/pool.cpp.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "exec/pool_kernels.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {
namespace {

index_t vol(const std::array<index_t, 3>& e) { return e[0] * e[1] * e[2]; }

/// Window [lo, hi) of output o in one dim, clipped to the input, and its unclipped extent.
struct Window {
  index_t lo, hi;
};
inline Window window(const PoolGeometry& g, int d, index_t o) {
  const index_t a = o * g.stride[d] - g.pad_lo[d];
  return {std::max<index_t>(a, 0), std::min<index_t>(a + g.kernel[d], g.in[d])};
}

template <class T>
void avg_forward(const PoolGeometry& g, const T* x, T* y) {
  const index_t pin = vol(g.in), pout = vol(g.out), rows = g.planes * g.out[0] * g.out[1];
  const double full = static_cast<double>(vol(g.kernel));
#pragma omp parallel for schedule(static) if (g.planes * pout > (1 << 14))
  for (index_t r = 0; r < rows; ++r) {
    const index_t pl = r / (g.out[0] * g.out[1]), o0 = (r / g.out[1]) % g.out[0], o1 = r % g.out[1];
    const T* xp = x + pl * pin;
    T* yr = y + pl * pout + (o0 * g.out[1] + o1) * g.out[2];
    const Window w0 = window(g, 0, o0), w1 = window(g, 1, o1);
    for (index_t o2 = 0; o2 < g.out[2]; ++o2) {
      const Window w2 = window(g, 2, o2);
      double s = 0;
      for (index_t i0 = w0.lo; i0 < w0.hi; ++i0)
        for (index_t i1 = w1.lo; i1 < w1.hi; ++i1) {
          const T* xr = xp + (i0 * g.in[1] + i1) * g.in[2];
          for (index_t i2 = w2.lo; i2 < w2.hi; ++i2) s += static_cast<double>(xr[i2]);
        }
      const double div =
          g.count_include_pad ? full : static_cast<double>((w0.hi - w0.lo) * (w1.hi - w1.lo) * (w2.hi - w2.lo));
      yr[o2] = static_cast<T>(s / div);
    }
  }
}

/// Outputs whose window covers input i in one dim: [first, last] clipped to [0, out).
inline Window covering(const PoolGeometry& g, int d, index_t i) {
  const index_t s = g.stride[d], t = i + g.pad_lo[d];
  const index_t a = t - g.kernel[d] + 1;
  const index_t first = a <= 0 ? 0 : (a + s - 1) / s;
  return {first, std::min<index_t>(t / s + 1, g.out[d])};
}

template <class T>
void avg_backward(const PoolGeometry& g, const T* gy, T* gx) {
  // Gather form: every input cell sums gy / divisor over the windows covering it (race-free).
  const index_t pin = vol(g.in), pout = vol(g.out), rows = g.planes * g.in[0] * g.in[1];
  const double full = static_cast<double>(vol(g.kernel));
  auto count = [&](int d, index_t o) {
    const Window w = window(g, d, o);
    return static_cast<double>(w.hi - w.lo);
  };
#pragma omp parallel for schedule(static) if (g.planes * pin > (1 << 14))
  for (index_t r = 0; r < rows; ++r) {
    const index_t pl = r / (g.in[0] * g.in[1]), i0 = (r / g.in[1]) % g.in[0], i1 = r % g.in[1];
    const T* gp = gy + pl * pout;
    T* xr = gx + pl * pin + (i0 * g.in[1] + i1) * g.in[2];
    const Window c0 = covering(g, 0, i0), c1 = covering(g, 1, i1);
    for (index_t i2 = 0; i2 < g.in[2]; ++i2) {
      const Window c2 = covering(g, 2, i2);
      double s = 0;
      for (index_t o0 = c0.lo; o0 < c0.hi; ++o0)
        for (index_t o1 = c1.lo; o1 < c1.hi; ++o1) {
          const T* gr = gp + (o0 * g.out[1] + o1) * g.out[2];
          for (index_t o2 = c2.lo; o2 < c2.hi; ++o2) {
            const double div = g.count_include_pad ? full : count(0, o0) * count(1, o1) * count(2, o2);
            s += static_cast<double>(gr[o2]) / div;
          }
        }
      xr[i2] = static_cast<T>(s);
    }
  }
}

template <class T>
void max_forward(const PoolGeometry& g, const T* x, T* y, std::int64_t* idx) {
  const index_t pin = vol(g.in), pout = vol(g.out), rows = g.planes * g.out[0] * g.out[1];
#pragma omp parallel for schedule(static) if (g.planes * pout > (1 << 14))
  for (index_t r = 0; r < rows; ++r) {
    const index_t pl = r / (g.out[0] * g.out[1]), o0 = (r / g.out[1]) % g.out[0], o1 = r % g.out[1];
    const T* xp = x + pl * pin;
    const index_t off = pl * pout + (o0 * g.out[1] + o1) * g.out[2];
    const Window w0 = window(g, 0, o0), w1 = window(g, 1, o1);
    for (index_t o2 = 0; o2 < g.out[2]; ++o2) {
      const Window w2 = window(g, 2, o2);
      index_t best = (w0.lo * g.in[1] + w1.lo) * g.in[2] + w2.lo;
      T bv = xp[best];
      for (index_t i0 = w0.lo; i0 < w0.hi; ++i0)
        for (index_t i1 = w1.lo; i1 < w1.hi; ++i1) {
          const index_t rowi = (i0 * g.in[1] + i1) * g.in[2];
          for (index_t i2 = w2.lo; i2 < w2.hi; ++i2) {
            const T v = xp[rowi + i2];
            if (v > bv || (std::isnan(v) && !std::isnan(bv))) {
              bv = v;
              best = rowi + i2;
            }
          }
        }
      y[off + o2] = bv;
      idx[off + o2] = best;
    }
  }
}

template <class T>
void max_backward(const PoolGeometry& g, const T* gy, const std::int64_t* idx, T* gx) {
  const index_t pin = vol(g.in), pout = vol(g.out);
  std::fill_n(gx, g.planes * pin, T(0));
  bool bad = false;
#pragma omp parallel for schedule(static) reduction(|| : bad) if (g.planes * pout > (1 << 14))
  for (index_t pl = 0; pl < g.planes; ++pl) {
    T* xp = gx + pl * pin;
    for (index_t o = 0; o < pout; ++o) {
      const std::int64_t i = idx[pl * pout + o];
      if (i < 0 || i >= pin) {
        bad = true;
        continue;
      }
      xp[i] += gy[pl * pout + o];
    }
  }
  SHARD_CHECK(!bad, "max_pool_backward", "argmax index outside the input plane of {} cells", pin);
}

template <class Fn>
void dispatch(DType dt, Fn f) {
  if (dt == DType::f32)
    f(float{});
  else
    f(double{});
}

struct CpuPool final : PoolKernels {
  void avg_forward(DType dt, const PoolGeometry& g, const void* x, void* y, ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      shard::exec::avg_forward<T>(g, static_cast<const T*>(x), static_cast<T*>(y));
    });
  }
  void avg_backward(DType dt, const PoolGeometry& g, const void* gy, void* gx, ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      shard::exec::avg_backward<T>(g, static_cast<const T*>(gy), static_cast<T*>(gx));
    });
  }
  void max_forward(DType dt, const PoolGeometry& g, const void* x, void* y, std::int64_t* idx,
                   ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      shard::exec::max_forward<T>(g, static_cast<const T*>(x), static_cast<T*>(y), idx);
    });
  }
  void max_backward(DType dt, const PoolGeometry& g, const void* gy, const std::int64_t* idx, void* gx,
                    ExecContext&) const override {
    dispatch(dt, [&](auto t) {
      using T = decltype(t);
      shard::exec::max_backward<T>(g, static_cast<const T*>(gy), idx, static_cast<T*>(gx));
    });
  }
};

const CpuPool g_cpu_pool;

}  // namespace

SHARD_CPU_TABLE(pool, g_cpu_pool);

}  // namespace shard::exec
