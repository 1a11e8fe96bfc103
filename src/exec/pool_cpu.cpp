// CPU implementation of the pool kernel family (exec/pool.hpp): avg / max, forward / backward on
// 3-D-viewed planes, for f32, f64 and the bf16 / f16 storage dtypes read and written in place
// (native_storage: values widen exactly, sums run in double or in the f32 route's float, each
// result rounds once more to the storage type: bit for bit the f32 working-copy route).
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "exec/pool_kernels.hpp"
#include "exec/storage_cpu.hpp"
#include "shardtensor/core/error.hpp"

namespace shard::exec {
namespace {

using storage::from_double;
using storage::to_double;
using storage::to_work;

index_t pool_vol(const std::array<index_t, 3>& e) { return e[0] * e[1] * e[2]; }

/// Window [lo, hi) of output o in one dim, clipped to the input, and its unclipped extent.
struct Window {
  index_t lo, hi;
};
inline Window window(const PoolGeometry& g, int d, index_t o) {
  const index_t a = o * g.stride[d] - g.pad_lo[d];
  return {std::max<index_t>(a, 0), std::min<index_t>(a + g.kernel[d], g.in[d])};
}
bool clips_divisor(const PoolGeometry& g) {
  return g.pad_end[0] < kPoolNoClip || g.pad_end[1] < kPoolNoClip || g.pad_end[2] < kPoolNoClip;
}
/// count_include_pad's divisor of output (o0, o1, o2): the window clipped to the padded domain.
inline double padded_count(const PoolGeometry& g, index_t o0, index_t o1, index_t o2) {
  double c = 1;
  const index_t o[3] = {o0, o1, o2};
  for (int d = 0; d < 3; ++d) {
    const index_t a = o[d] * g.stride[d] - g.pad_lo[d];
    c *= static_cast<double>(std::min<index_t>(a + g.kernel[d], g.pad_end[d]) - a);
  }
  return c;
}

template <class T>
void avg_forward(const PoolGeometry& g, const T* x, T* y) {
  const index_t pin = pool_vol(g.in), pout = pool_vol(g.out), rows = g.planes * g.out[0] * g.out[1];
  const double full = static_cast<double>(pool_vol(g.kernel));
  const bool clip = clips_divisor(g);
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
          for (index_t i2 = w2.lo; i2 < w2.hi; ++i2) s += to_double(xr[i2]);
        }
      const double div =
          g.count_include_pad ? (clip ? padded_count(g, o0, o1, o2) : full)
                              : static_cast<double>((w0.hi - w0.lo) * (w1.hi - w1.lo) * (w2.hi - w2.lo));
      yr[o2] = from_double<T>(s / div);
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

/// The avg-pool divisor of every output as a product of per-dim factors, div = f[0][o0] * f[1][o1]
/// * f[2][o2] (in that order, exact: small integers): the full kernel volume, the window clipped to
/// the padded domain (count_include_pad) or to the input. Equal to the forward's divisor bit for bit.
struct DivisorFactors {
  std::array<std::vector<double>, 3> f;
  explicit DivisorFactors(const PoolGeometry& g) {
    const bool clip = clips_divisor(g);
    for (int d = 0; d < 3; ++d) {
      auto& v = f[static_cast<std::size_t>(d)];
      v.resize(static_cast<std::size_t>(g.out[d]));
      for (index_t o = 0; o < g.out[d]; ++o) {
        double c;
        if (g.count_include_pad) {
          const index_t a = o * g.stride[d] - g.pad_lo[d];
          c = static_cast<double>(clip ? std::min<index_t>(a + g.kernel[d], g.pad_end[d]) - a : g.kernel[d]);
        } else {
          const Window w = window(g, d, o);
          c = static_cast<double>(w.hi - w.lo);
        }
        v[static_cast<std::size_t>(o)] = c;
      }
    }
  }
};

template <class T>
void avg_backward(const PoolGeometry& g, const T* gy, T* gx) {
  // Gather form: every input cell sums gy / divisor over the windows covering it (race-free). The
  // covering windows of the innermost dim and the divisors' per-dim factors are tabulated once per
  // call (they cost integer divisions per element before).
  const index_t pin = pool_vol(g.in), pout = pool_vol(g.out), rows = g.planes * g.in[0] * g.in[1];
  const DivisorFactors div(g);
  std::vector<Window> cov2(static_cast<std::size_t>(g.in[2]));
  for (index_t i2 = 0; i2 < g.in[2]; ++i2) cov2[static_cast<std::size_t>(i2)] = covering(g, 2, i2);
  const double* f0 = div.f[0].data();
  const double* f1 = div.f[1].data();
  const double* f2 = div.f[2].data();
#pragma omp parallel for schedule(static) if (g.planes * pin > (1 << 14))
  for (index_t r = 0; r < rows; ++r) {
    const index_t pl = r / (g.in[0] * g.in[1]), i0 = (r / g.in[1]) % g.in[0], i1 = r % g.in[1];
    const T* gp = gy + pl * pout;
    T* xr = gx + pl * pin + (i0 * g.in[1] + i1) * g.in[2];
    const Window c0 = covering(g, 0, i0), c1 = covering(g, 1, i1);
    for (index_t i2 = 0; i2 < g.in[2]; ++i2) {
      const Window c2 = cov2[static_cast<std::size_t>(i2)];
      double s = 0;
      for (index_t o0 = c0.lo; o0 < c0.hi; ++o0)
        for (index_t o1 = c1.lo; o1 < c1.hi; ++o1) {
          const T* gr = gp + (o0 * g.out[1] + o1) * g.out[2];
          const double f01 = f0[o0] * f1[o1];
          for (index_t o2 = c2.lo; o2 < c2.hi; ++o2) s += to_double(gr[o2]) / (f01 * f2[o2]);
        }
      xr[i2] = from_double<T>(s);
    }
  }
}

template <class T>
void max_forward(const PoolGeometry& g, const T* x, T* y, std::int64_t* idx) {
  const index_t pin = pool_vol(g.in), pout = pool_vol(g.out), rows = g.planes * g.out[0] * g.out[1];
#pragma omp parallel for schedule(static) if (g.planes * pout > (1 << 14))
  for (index_t r = 0; r < rows; ++r) {
    const index_t pl = r / (g.out[0] * g.out[1]), o0 = (r / g.out[1]) % g.out[0], o1 = r % g.out[1];
    const T* xp = x + pl * pin;
    const index_t off = pl * pout + (o0 * g.out[1] + o1) * g.out[2];
    const Window w0 = window(g, 0, o0), w1 = window(g, 1, o1);
    for (index_t o2 = 0; o2 < g.out[2]; ++o2) {
      const Window w2 = window(g, 2, o2);
      index_t best = (w0.lo * g.in[1] + w1.lo) * g.in[2] + w2.lo;
      auto bv = to_work(xp[best]);  // compared widened; the stored element itself is the result
      for (index_t i0 = w0.lo; i0 < w0.hi; ++i0)
        for (index_t i1 = w1.lo; i1 < w1.hi; ++i1) {
          const index_t rowi = (i0 * g.in[1] + i1) * g.in[2];
          for (index_t i2 = w2.lo; i2 < w2.hi; ++i2) {
            const auto v = to_work(xp[rowi + i2]);
            if (v > bv || (std::isnan(v) && !std::isnan(bv))) {
              bv = v;
              best = rowi + i2;
            }
          }
        }
      y[off + o2] = xp[best];
      idx[off + o2] = best;
    }
  }
}

/// Scatter of each plane's gy to its argmax cells, in increasing output order, accumulated in T
/// (f32 / f64) or, for bf16 / f16, in a float plane rounded once at the end (the f32 route).
template <class T>
void max_backward(const PoolGeometry& g, const T* gy, const std::int64_t* idx, T* gx) {
  using W = storage::work_t<T>;
  const index_t pin = pool_vol(g.in), pout = pool_vol(g.out);
  bool bad = false;
#pragma omp parallel reduction(|| : bad) if (g.planes > 1 && g.planes * pout > (1 << 14))
  {
    std::vector<W> acc(storage::is_narrow_v<T> ? static_cast<std::size_t>(pin) : 0);
#pragma omp for schedule(static)
    for (index_t pl = 0; pl < g.planes; ++pl) {
      W* xp;
      if constexpr (storage::is_narrow_v<T>) xp = acc.data();
      else xp = gx + pl * pin;
      std::fill_n(xp, pin, W(0));
      for (index_t o = 0; o < pout; ++o) {
        const std::int64_t i = idx[pl * pout + o];
        if (i < 0 || i >= pin) {
          bad = true;
          continue;
        }
        xp[i] += to_work(gy[pl * pout + o]);
      }
      if constexpr (storage::is_narrow_v<T>)
        for (index_t i = 0; i < pin; ++i) gx[pl * pin + i] = storage::from_float<T>(xp[i]);
    }
  }
  SHARD_CHECK(!bad, "max_pool_backward", "argmax index outside the input plane of {} cells", pin);
}

struct CpuPool final : PoolKernels {
  bool native_storage(const StorageQuery& q) const override { return q.dtype == DType::bf16 || q.dtype == DType::f16; }
  void avg_forward(DType dt, const PoolGeometry& g, const void* x, void* y, ExecContext&) const override {
    SHARD_STORAGE_DISPATCH("avg_pool", dt, shard::exec::avg_forward<T>(g, static_cast<const T*>(x), static_cast<T*>(y)));
  }
  void avg_backward(DType dt, const PoolGeometry& g, const void* gy, void* gx, ExecContext&) const override {
    SHARD_STORAGE_DISPATCH("avg_pool", dt, shard::exec::avg_backward<T>(g, static_cast<const T*>(gy), static_cast<T*>(gx)));
  }
  void max_forward(DType dt, const PoolGeometry& g, const void* x, void* y, std::int64_t* idx,
                   ExecContext&) const override {
    SHARD_STORAGE_DISPATCH("max_pool", dt, shard::exec::max_forward<T>(g, static_cast<const T*>(x), static_cast<T*>(y), idx));
  }
  void max_backward(DType dt, const PoolGeometry& g, const void* gy, const std::int64_t* idx, void* gx,
                    ExecContext&) const override {
    SHARD_STORAGE_DISPATCH("max_pool", dt, shard::exec::max_backward<T>(g, static_cast<const T*>(gy), idx, static_cast<T*>(gx)));
  }
};

const CpuPool g_cpu_pool;

}  // namespace

SHARD_CPU_TABLE(pool, g_cpu_pool);

}  // namespace shard::exec
